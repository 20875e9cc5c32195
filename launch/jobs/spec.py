"""What a job script is asked for, checked before anything is written.

A :class:`JobRequest` holds the resources (nodes, GPUs and cores per node, ranks per node, host
list), the scheduler fields (time, account, queue), the communication knobs and the
``tfscale.train`` flags. Building one validates it: an impossible request (zero nodes, more
GPUs per node than a node has, a strategy that cannot use several ranks or this launcher, a
bad train flag)
fails here with a ``ValueError`` that names the value, not on the cluster an hour later.
"""

from __future__ import annotations

import dataclasses
import os
import re

from tfscale.cli.flags import config_from_args
from tfscale.config.train_config import TrainConfig
from tfscale.strategies import STRATEGIES, Strategy, strategies_that

NCCL_DEBUG_LEVELS = ("", "VERSION", "WARN", "INFO", "TRACE")
_NAME = re.compile(r"^[A-Za-z0-9_.@%+-]+$")
_HOST = re.compile(r"^[A-Za-z0-9_.-]+$")
# Paths that the job expands at run time ($USER, $SCRATCH): anything but what breaks "...".
_RUNTIME_PATH = re.compile(r'^[^"`\\\n]+$')


@dataclasses.dataclass(frozen=True)
class Knobs:
    """Communication settings exported to every rank.

    Attributes:
        fusion_threshold_mb: Horovod tensor-fusion buffer in MiB (negative: the train flags'
            ``--fusion_threshold_mb``, else Horovod's default).
        cycle_time_ms: Horovod cycle time in ms (negative: as the train flags say).
        hierarchical_allreduce: Horovod's hierarchical all-reduce (within, then across nodes).
        nccl_debug: NCCL_DEBUG level ("" leaves it unset).
        tf_log_level: TF_CPP_MIN_LOG_LEVEL (0 = all C++ logs ... 3 = errors only).
    """

    fusion_threshold_mb: float = -1.0
    cycle_time_ms: float = -1.0
    hierarchical_allreduce: bool = False
    nccl_debug: str = ""
    tf_log_level: int = 2

    def __post_init__(self) -> None:
        if self.nccl_debug not in NCCL_DEBUG_LEVELS:
            raise ValueError(f"--nccl_debug={self.nccl_debug!r}; choose one of "
                             f"{', '.join(n for n in NCCL_DEBUG_LEVELS if n)}")
        if self.tf_log_level not in (0, 1, 2, 3):
            raise ValueError(f"--tf_log_level={self.tf_log_level}; expected 0, 1, 2 or 3")

    def environment(self, strategy: type[Strategy], config: TrainConfig) -> dict[str, str]:
        """The variables to export, by name: the strategy's own for the train flags (with
        these knobs' values where given), then the launcher-level ones."""
        given = {name: getattr(self, name) for name in ("fusion_threshold_mb", "cycle_time_ms")
                 if getattr(self, name) >= 0}
        env = {"TF_CPP_MIN_LOG_LEVEL": str(self.tf_log_level),
               **strategy.environment(strategy.settings(config.replace(**given)))}
        if self.hierarchical_allreduce:
            env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
        if self.nccl_debug:
            env["NCCL_DEBUG"] = self.nccl_debug
        return env


def parse_time(text: str) -> int:
    """Seconds in a wall-time limit: ``HH:MM:SS``, ``D-HH:MM:SS`` or whole minutes.

    Raises:
        ValueError: for any other form (``MM:SS`` vs ``HH:MM`` differ between Slurm and LSF,
            so two-part times are refused), or a zero limit.
    """
    match = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})", text.strip())
    if match:
        days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    elif text.strip().isdigit():
        total = int(text) * 60
    else:
        raise ValueError(f"--time={text!r}; use HH:MM:SS, D-HH:MM:SS or whole minutes")
    if total <= 0:
        raise ValueError(f"--time={text!r}: the job needs a positive time limit")
    return total


def parse_hosts(text: str) -> tuple[tuple[str, int], ...]:
    """``"h1:6,h2:6"`` or ``"h1,h2"`` -> ((host, slots), ...); slots 0 when not given.

    Slurm's compressed form works for plain names: ``"node[01-04]"``.

    Raises:
        ValueError: for an empty list, a bad name or slot count, or a repeated host.
    """
    from tfscale.cluster.environment import expand_hostlist

    if ":" in text:
        items = [item.strip().partition(":") for item in text.split(",")]
        hosts = []
        for name, _, slots in items:
            if not slots.isdigit() or int(slots) < 1:
                raise ValueError(f"-H {text!r}: {name}:{slots} needs a slot count >= 1")
            hosts.append((name, int(slots)))
    else:
        hosts = [(name, 0) for name in expand_hostlist(text)]
    names = [name for name, _ in hosts]
    for name in names:
        if not _HOST.match(name):
            raise ValueError(f"-H {text!r}: {name!r} is not a host name")
    if len(set(names)) != len(names):
        raise ValueError(f"-H {text!r} names a host twice; give each host once with its "
                         "slot count (host:slots)")
    return tuple(hosts)


def read_hostfile(path: str) -> str:
    """An MPI host file (``host``, ``host slots=N`` or ``host:N`` per line) as ``-H`` text."""
    entries = []
    with open(path) as f:
        for line in f:
            words = line.split("#")[0].split()
            if not words:
                continue
            slots = next((w.split("=")[1] for w in words[1:] if w.startswith("slots=")), "")
            entries.append(f"{words[0]}:{slots}" if slots else words[0])
    if not entries:
        raise ValueError(f"host file {path} lists no hosts")
    return ",".join(entries)


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """A job script to write. Fields set to 0 or "" are derived or left out.

    Attributes:
        launcher: the generator's name (slurm, lsf, mpirun, horovodrun).
        train_args: the ``tfscale.train`` flags.
        nodes: nodes in the job (the host count when ``hosts`` is given).
        gpus_per_node: GPUs used on each node (0 = a CPU-only job).
        gpus_per_rank: GPUs of each rank (1 for Horovod/DDL).
        ranks_per_node: ranks on each node (derived from the GPUs when there are GPUs).
        node_gpus: GPUs a node has (0 = as many as asked for).
        cores_per_node: CPU cores a node has (0 = unknown: found on the node at run time).
        cores_per_rank: cores bound to each rank (0 = cores_per_node / ranks_per_node).
        hosts: (host, slots) for mpirun/horovodrun; slots 0 = ranks_per_node.
        time: wall-time limit (HH:MM:SS, D-HH:MM:SS or minutes).
        account: account/project charged.
        queue: Slurm partition or LSF queue.
        job_name: the scheduler's job name, also the log directory's prefix.
        workdir: directory the ranks run in (the tfscale checkout).
        python: interpreter on the nodes.
        setup: shell lines run first (``module load ...``, ``source venv/bin/activate``).
        log_dir: where each job's log directory goes (expanded on the cluster).
        stage_dir: node-local directory for ``tfscale.train --stage_dir`` (expanded per rank).
        port: first TF_CONFIG port on each node (multiworker).
        iface: network interface for MPI/Gloo traffic (e.g. ib0).
        mpi: horovodrun: use MPI instead of Gloo.
        srun_mpi: Slurm: ``srun --mpi`` plugin for MPI-built Horovod (pmix, pmi2).
        knobs: the communication knobs.
        comment: a line for the script's header comment (e.g. the command that wrote it).
        strategy: the train flags' ``--strategy`` (set from ``train_args``).
        config: the train flags as a validated config (set from ``train_args``).
    """

    launcher: str
    train_args: tuple[str, ...] = ()
    nodes: int = 1
    gpus_per_node: int = 0
    gpus_per_rank: int = 1
    ranks_per_node: int = 0
    node_gpus: int = 0
    cores_per_node: int = 0
    cores_per_rank: int = 0
    hosts: tuple[tuple[str, int], ...] = ()
    time: str = "01:00:00"
    account: str = ""
    queue: str = ""
    job_name: str = "tfscale"
    workdir: str = dataclasses.field(default_factory=os.getcwd)
    python: str = "python3"
    setup: tuple[str, ...] = ()
    log_dir: str = "logs"
    stage_dir: str = ""
    port: int = 12345
    iface: str = ""
    mpi: bool = False
    srun_mpi: str = "pmix"
    knobs: Knobs = dataclasses.field(default_factory=Knobs)
    comment: str = ""
    strategy: str = dataclasses.field(init=False, default="")
    config: TrainConfig = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_numbers()
        self._check_names()
        per_node = self.gpus_per_node // self.gpus_per_rank
        if self.gpus_per_node:
            if self.ranks_per_node and self.ranks_per_node != per_node:
                raise ValueError(f"--ranks_per_node={self.ranks_per_node} but "
                                 f"--gpus_per_node={self.gpus_per_node} with "
                                 f"--gpus_per_rank={self.gpus_per_rank} makes {per_node}")
            object.__setattr__(self, "ranks_per_node", per_node)
        elif not self.ranks_per_node:
            slots = {s for _, s in self.hosts} - {0}
            object.__setattr__(self, "ranks_per_node", min(slots) if slots else 1)
        if self.hosts:
            self._check_hosts()
        if self.cores_per_node and not self.cores_per_rank:
            object.__setattr__(self, "cores_per_rank", self.cores_per_node // self.ranks_per_node)
        if self.cores_per_node and self.cores_per_rank * self.ranks_per_node > self.cores_per_node:
            raise ValueError(f"{self.ranks_per_node} ranks per node x {self.cores_per_rank} "
                             f"cores each needs more than the {self.cores_per_node} cores a "
                             "node has (--cores_per_node)")
        if self.cores_per_node and not self.cores_per_rank:
            raise ValueError(f"{self.ranks_per_node} ranks per node cannot share "
                             f"{self.cores_per_node} cores; give each rank at least one")
        config = config_from_args(self.train_args)
        object.__setattr__(self, "config", config)
        object.__setattr__(self, "strategy", config.strategy)
        self._check_strategy()

    def _check_numbers(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"--nodes={self.nodes}: a job needs at least one node")
        for name in ("gpus_per_node", "ranks_per_node", "node_gpus", "cores_per_node",
                     "cores_per_rank"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name}={getattr(self, name)} cannot be negative")
        if self.gpus_per_rank < 1:
            raise ValueError(f"--gpus_per_rank={self.gpus_per_rank}: a rank needs >= 1 GPU")
        if self.node_gpus and self.gpus_per_node > self.node_gpus:
            raise ValueError(f"--gpus_per_node={self.gpus_per_node} asks for more GPUs than "
                             f"the {self.node_gpus} a node has (--node_gpus)")
        if self.gpus_per_node % self.gpus_per_rank:
            raise ValueError(f"--gpus_per_node={self.gpus_per_node} is not a multiple of "
                             f"--gpus_per_rank={self.gpus_per_rank}")
        if not 1024 <= self.port <= 65000:
            raise ValueError(f"--port={self.port}; choose a port in 1024..65000")
        parse_time(self.time)

    def _check_names(self) -> None:
        for name in ("job_name", "account", "queue", "iface", "srun_mpi"):
            value = getattr(self, name)
            if value and not _NAME.match(value):
                raise ValueError(f"--{name}={value!r} has characters a job script cannot "
                                 "carry safely")
        for name in ("log_dir", "stage_dir"):
            value = getattr(self, name)
            if value and not _RUNTIME_PATH.match(value):
                raise ValueError(f"--{name}={value!r}: quotes, backquotes and backslashes "
                                 "are not allowed")
        if "\n" in self.comment:
            raise ValueError("the script's comment must be one line")
        if not self.log_dir:
            raise ValueError("--log_dir cannot be empty")

    def _check_hosts(self) -> None:
        if self.nodes not in (1, len(self.hosts)):
            raise ValueError(f"--nodes={self.nodes} but -H lists {len(self.hosts)} host(s)")
        object.__setattr__(self, "nodes", len(self.hosts))
        for host, slots in self.hosts:
            if slots and slots != self.ranks_per_node:
                raise ValueError(
                    f"host {host} has {slots} slot(s) but the job runs {self.ranks_per_node} "
                    "rank(s) per node (one per GPU: --gpus_per_node / --gpus_per_rank); every "
                    "host needs the same number")

    def _check_strategy(self) -> None:
        config, strategy, ranks = self.config, self.strategy, self.total_ranks
        cls = self.strategy_class
        if ranks > 1 and not cls.multi_process():
            several = strategies_that(lambda c: c.multi_process())
            raise ValueError(f"--strategy={strategy} runs in one process; a job of {ranks} "
                             f"ranks needs one of {', '.join(several)}")
        if cls.one_rank_per_gpu and self.gpus_per_rank != 1:
            raise ValueError(f"--strategy={strategy} runs one rank per GPU; drop "
                             f"--gpus_per_rank={self.gpus_per_rank}")
        if config.num_processes not in (1, ranks):
            raise ValueError(f"--num_processes={config.num_processes} in the train flags but "
                             f"the job starts {ranks} ranks; drop --num_processes")
        if self.stage_dir and config.stage_dir:
            raise ValueError("give --stage_dir once: to the job script, not to tfscale.train")

    @property
    def strategy_class(self) -> type[Strategy]:
        """The class of the train flags' strategy, which says how its ranks are started."""
        return STRATEGIES.get(self.strategy)

    @property
    def environment(self) -> dict[str, str]:
        """The variables every rank exports (see :meth:`Knobs.environment`)."""
        return self.knobs.environment(self.strategy_class, self.config)

    @property
    def total_ranks(self) -> int:
        """Ranks in the whole job."""
        return self.nodes * self.ranks_per_node

    @property
    def time_seconds(self) -> int:
        """The wall-time limit in seconds."""
        return parse_time(self.time)
