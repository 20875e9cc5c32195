"""A home for IBM ``ddlrun`` command lines: ``-H host1,host2`` plus GPUs per host.

``ddlrun -H host1,host2 python train.py`` ran one rank per GPU on each host through mpirun and
gave the program DDL's topology. :func:`ddlrun_request` maps the same host list onto the
mpirun (or horovodrun) generator with ``--strategy ddl``, tfscale's DDL-style strategy
(hierarchical all-reduce on Horovod process sets).
"""

from __future__ import annotations

from typing import Any

from launch.jobs.registry import request
from launch.jobs.spec import JobRequest, parse_hosts
from tfscale.cli.flags import config_from_args
from tfscale.strategies import DDL_STRATEGY, STRATEGIES, Rendezvous, strategies_that

BACKENDS = ("mpirun", "horovodrun")
FRONT_END = "ddlrun"


def ddlrun_request(hosts: str, accelerators: int, backend: str = "mpirun",
                   train_args: tuple[str, ...] = (), **fields: Any) -> JobRequest:
    """The request a ``ddlrun -H hosts`` command line stands for.

    Args:
        hosts: ``host1,host2`` (or ``host:slots``), as ddlrun's ``-H``.
        accelerators: GPUs per host (one rank each); 0 for CPU ranks (then slots count).
        backend: the launcher that runs the ranks: mpirun (as ddlrun did) or horovodrun.
        train_args: tfscale.train flags; ``--strategy=ddl`` is added unless one is given.
        **fields: further JobRequest fields (time, knobs, log_dir, ...).

    Raises:
        ValueError: for an unknown backend, a strategy whose ranks do not meet as Horovod's
            (ddlrun starts Horovod ranks), or an impossible request.
    """
    if backend not in BACKENDS:
        raise ValueError(f"ddlrun backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if not any(a.startswith("--strategy") for a in train_args):
        train_args = (*train_args, f"--strategy={DDL_STRATEGY}")
    strategy = config_from_args(train_args).strategy
    if STRATEGIES.get(strategy).rendezvous != Rendezvous.HOROVOD:
        able = strategies_that(lambda cls: cls.rendezvous == Rendezvous.HOROVOD)
        raise ValueError(f"ddlrun runs DDL-style jobs; --strategy={strategy} is not one of "
                         f"{', '.join(able)}")
    return request(backend, hosts=parse_hosts(hosts), gpus_per_node=accelerators,
                   train_args=train_args, **fields)
