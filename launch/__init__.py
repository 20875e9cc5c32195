"""Job scripts for cluster launchers (Slurm, LSF/jsrun, mpirun, horovodrun, ddlrun), the
two-node mini-cluster, and the Horovod build. tfscale's own launcher of local workers is
:mod:`tfscale.scripts.launcher`."""

# ``launch.local`` moved there: importing tfscale keeps the old name importable for a release.
import tfscale  # noqa: F401
