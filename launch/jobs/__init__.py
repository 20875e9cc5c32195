"""Job-script generators for cluster launchers (see ``python -m launch.jobscript --help``)."""

from launch.jobs import lsf, mpi, slurm
from launch.jobs.ddl import ddlrun_request
from launch.jobs.registry import GENERATORS, render, request
from launch.jobs.spec import JobRequest, Knobs

__all__ = ["GENERATORS", "JobRequest", "Knobs", "ddlrun_request", "lsf", "mpi", "render",
           "request", "slurm"]
