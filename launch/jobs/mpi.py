"""``mpirun`` (Open MPI) and ``horovodrun`` on a list of hosts (``-H host:slots,...``).

mpirun maps ``ranks_per_node`` ranks to each host, each bound to its own cores
(``--map-by ppr:N:node:PE=C --bind-to core``), and forwards the environment the ranks need with
``-x``. horovodrun starts the same ranks through Gloo (default) or MPI; under Gloo it cannot
bind, so each rank binds itself with ``taskset``. As root (containers), Open MPI needs its
allow-run-as-root variables, which the script sets when it runs as root.
"""

from __future__ import annotations

from launch.jobs import script
from launch.jobs.registry import register
from launch.jobs.spec import JobRequest
from tfscale.strategies import Rendezvous

FORWARDED = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV")
ROOT_LINES = [
    'if [ "$(id -u)" -eq 0 ]; then  # Open MPI refuses to run as root without these',
    "  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
    "  export PRTE_ALLOW_RUN_AS_ROOT=1 PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=1",
    "fi",
]


def _hosts(req: JobRequest) -> str:
    hosts = req.hosts or (("localhost", 0),)
    return ",".join(f"{h}:{req.ranks_per_node}" for h, _ in hosts)


def _check(req: JobRequest) -> None:
    if not req.hosts and req.nodes > 1:
        raise ValueError(f"{req.launcher} with --nodes={req.nodes} needs the hosts: "
                         "-H host1:slots,host2:slots (or --hostfile)")


def _cores(req: JobRequest) -> list[str]:
    return [*script.cores_per_rank(req, "$(nproc)", share=True), *script.mpi_binding(req)]


@register("mpirun", "Open MPI mpirun on -H hosts: -np, --map-by/--bind-to, -x environment")
def render_mpirun(req: JobRequest) -> str:
    """The mpirun script for ``req``."""
    _check(req)
    names = ",".join(h for h, _ in req.hosts) or "localhost"
    rank = script.rank_script(req, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                              "mpirun", tf_config_args=["--hosts", names, "--ranks_per_node",
                                                        str(req.ranks_per_node)])
    launch = ["mpirun", f"-np {req.total_ranks}", f"-H {_hosts(req)}", '"${binding[@]}"',
              "--report-bindings", '"${forward[@]}"']
    if req.iface:
        launch.append(f"--mca btl_tcp_if_include {req.iface} "
                      f"--mca oob_tcp_if_include {req.iface}")
    launch.append('"$LOG_DIR/rank.sh"')
    extra = [*ROOT_LINES, *_cores(req),
             "# The environment every rank needs, forwarded by name (-x) when set here.",
             f"forward=(); for v in {' '.join(FORWARDED)}; do "
             '[ -n "${!v:-}" ] && forward+=(-x "$v"); done',
             *script.preflight(req, "mpi")]
    return script.job_script(req, [], rank, launch, extra)


@register("horovodrun", "horovodrun on -H hosts, over Gloo (default) or MPI (--mpi)",
          rendezvous=frozenset({Rendezvous.HOROVOD}))
def render_horovodrun(req: JobRequest) -> str:
    """The horovodrun script for ``req`` (the request has already refused a strategy whose
    ranks do not meet as Horovod's)."""
    _check(req)
    if req.mpi:
        rank = script.rank_script(req, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "horovodrun --mpi")
        launch = ["horovodrun", f"-np {req.total_ranks}", f"-H {_hosts(req)}", "--mpi",
                  '--binding-args="${binding[*]}"']
        extra = [*ROOT_LINES, *_cores(req)]
    else:
        rank = script.rank_script(req, "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "horovodrun",
                                  taskset=True)
        launch = ["horovodrun", f"-np {req.total_ranks}", f"-H {_hosts(req)}", "--gloo"]
        extra = []
    if req.iface:
        launch.append(f"--network-interface {req.iface}")
    launch.append('"$LOG_DIR/rank.sh"')
    extra += script.preflight(req, "mpi" if req.mpi else "gloo")
    return script.job_script(req, [], rank, launch, extra)
