"""Where this process sits in a job started by a cluster launcher.

:func:`detect` reads the variables that ``srun``, ``mpirun`` (Open MPI), ``jsrun`` (LSF/CSM),
``horovodrun`` and PMI launchers (MPICH/Hydra, Intel MPI) give each rank, and returns one
:class:`ClusterEnv`: rank, world size, local rank and size, and where the launcher says it, the
expanded host list. :func:`tf_config_from_slurm` builds the ``TF_CONFIG`` that
``MultiWorkerMirroredStrategy`` needs under ``srun``, without ``scontrol``.

:func:`this_process` is the one answer to "which rank am I, and who shares my node" in tfscale:
the launcher's variables, else a ``TF_CONFIG``, else the variables of tfscale's own local
launcher (``--num_processes``), else a process on its own.

Run as a script it prints what it detected (``python -m tfscale.cluster_env``), or with
``--tf_config --port P`` the TF_CONFIG JSON for this rank (the Slurm job scripts of
``launch.jobscript`` export it that way).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import socket
from collections.abc import Mapping
from typing import Any

LAUNCHERS = ("horovodrun", "jsrun", "openmpi", "slurm", "pmi", "tf_config", "tfscale", "none")
DEFAULT_PORT = 12345
#: Set by ``tfscale-run`` on every rank: the strategy the launcher chose (``--strategy``).
STRATEGY_VAR = "TFSCALE_STRATEGY"
#: Set by tfscale's launchers on every rank: which attempt of the job this is (0 = the first;
#: ``--max_restarts`` counts the restarts after a failure).
RESTART_VAR = "TFSCALE_RESTART"
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


@dataclasses.dataclass(frozen=True)
class ClusterEnv:
    """One rank's view of its job.

    Attributes:
        launcher: which launcher's variables were read (one of :data:`LAUNCHERS`; ``"none"``
            for a process started on its own).
        rank: global index of this process.
        size: number of processes in the job.
        local_rank: index of this process on its node.
        local_size: number of processes on this node.
        hosts: the job's nodes in the launcher's order, when the launcher says (else empty).
        tasks_per_node: processes on each of ``hosts`` (same order; empty when unknown).
        node_index: position of this node in ``hosts`` (-1 when unknown).
        distribution: how ranks are laid out over ``hosts``: ``"block"`` (fill a node, then
            the next) or ``"cyclic"`` (round robin over the nodes).
        node: this node's name as the launcher gives it (else the machine's host name).
    """

    launcher: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    hosts: tuple[str, ...] = ()
    tasks_per_node: tuple[int, ...] = ()
    node_index: int = -1
    distribution: str = "block"
    node: str = ""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher {self.launcher!r}; expected one of {LAUNCHERS}")
        where = f"{self.launcher} variables"
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"{where}: rank {self.rank} is not within a job of {self.size}")
        if self.local_size < 1 or not 0 <= self.local_rank < self.local_size:
            raise ValueError(f"{where}: local rank {self.local_rank} is not within "
                             f"{self.local_size} process(es) on this node")
        if self.local_size > self.size:
            raise ValueError(f"{where}: {self.local_size} processes on this node but "
                             f"{self.size} in the whole job")
        if self.tasks_per_node:
            if len(self.tasks_per_node) != len(self.hosts):
                raise ValueError(f"{where}: {len(self.hosts)} hosts {list(self.hosts)} but "
                                 f"task counts for {len(self.tasks_per_node)} nodes "
                                 f"{list(self.tasks_per_node)}")
            if sum(self.tasks_per_node) != self.size:
                raise ValueError(f"{where}: tasks per node {list(self.tasks_per_node)} add "
                                 f"up to {sum(self.tasks_per_node)}, not the job size "
                                 f"{self.size}")
        if self.distribution not in ("block", "cyclic"):
            raise ValueError(f"{where}: task distribution {self.distribution!r} is not "
                             "supported; use block or cyclic")

    def task_slots(self) -> list[tuple[str, int]]:
        """(host, index on that host) of every rank, in rank order.

        Raises:
            ValueError: if the launcher did not give the hosts and tasks per node.
        """
        if not self.tasks_per_node:
            raise ValueError(f"the {self.launcher} variables do not list the job's hosts and "
                             "tasks per node, so the rank layout is unknown")
        if self.distribution == "block":
            layout = zip(self.hosts, self.tasks_per_node, strict=True)
            return [(host, i) for host, n in layout for i in range(n)]
        slots: list[tuple[str, int]] = []
        placed = [0] * len(self.hosts)
        while len(slots) < self.size:
            for node, host in enumerate(self.hosts):
                if placed[node] < self.tasks_per_node[node]:
                    slots.append((host, placed[node]))
                    placed[node] += 1
        return slots


def expand_hostlist(hostlist: str) -> list[str]:
    """Expands a Slurm host list: ``"node[01-03,07],gpu5"`` -> node01 node02 node03 node07 gpu5.

    Several bracket groups in one name multiply (``"r[1-2]n[1-2]"`` -> r1n1 r1n2 r2n1 r2n2);
    zero padding follows the range's first number.

    Raises:
        ValueError: for an empty list, unbalanced brackets or a bad range.
    """
    names: list[str] = []
    for item in _split_top_level(hostlist.strip(), hostlist):
        names.extend(_expand_item(item, hostlist))
    return names


def _split_top_level(text: str, whole: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise ValueError(f"host list {whole!r}: unbalanced or nested brackets")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list {whole!r}: unbalanced brackets")
    items.append(text[start:])
    if any(not item.strip() for item in items):
        raise ValueError(f"host list {whole!r} has an empty entry")
    return [item.strip() for item in items]


def _expand_item(item: str, whole: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        if "]" in item:
            raise ValueError(f"host list {whole!r}: unbalanced brackets in {item!r}")
        return [item]
    close_at = item.index("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    tails = _expand_item(rest, whole) if rest else [""]
    return [f"{prefix}{value}{tail}" for value in _expand_ranges(body, whole) for tail in tails]


def _expand_ranges(body: str, whole: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise ValueError(f"host list {whole!r}: {part!r} is not a number or a range "
                             "like 01-03")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise ValueError(f"host list {whole!r}: range {part!r} runs backwards")
        values.extend(str(n).zfill(len(first)) for n in range(int(first), int(last) + 1))
    return values


def expand_tasks_per_node(text: str) -> list[int]:
    """Expands Slurm's tasks-per-node form: ``"2(x3),1"`` -> [2, 2, 2, 1].

    Raises:
        ValueError: for anything else.
    """
    counts: list[int] = []
    for part in text.split(","):
        match = _TASKS.match(part.strip())
        if not match:
            raise ValueError(f"tasks per node {text!r}: {part!r} is not N or N(xM)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int:
    for name in names:
        if environ.get(name, "").strip():
            try:
                return int(environ[name])
            except ValueError:
                raise ValueError(f"{name}={environ[name]!r} is not an integer") from None
    if default is None:
        raise ValueError(f"{' or '.join(names)} is not set")
    return default


def _first(environ: Mapping[str, str], *names: str) -> str:
    return next((environ[n] for n in names if environ.get(n, "").strip()), "")


def _node(environ: Mapping[str, str], *names: str) -> str:
    return _first(environ, *names) or platform.node()


def _slurm(environ: Mapping[str, str]) -> ClusterEnv:
    # Inside an srun step the STEP_ variables describe the step, which may use only part of
    # the job's allocation; the job-level ones are the fallback (e.g. in the batch script).
    size = _int(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", default=1)
    rank = _int(environ, "SLURM_PROCID", default=0)
    nodelist = _first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    hosts = tuple(expand_hostlist(nodelist)) if nodelist else ()
    per_node_text = _first(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if per_node_text:
        per_node = tuple(expand_tasks_per_node(per_node_text))
    elif environ.get("SLURM_NTASKS_PER_NODE") and hosts:
        per_node = (_int(environ, "SLURM_NTASKS_PER_NODE"),) * len(hosts)
    else:
        per_node = ()
    if per_node and not hosts:
        raise ValueError("SLURM_TASKS_PER_NODE is set but no SLURM_*NODELIST names the nodes")
    node_index = _int(environ, "SLURM_NODEID", default=-1)
    if node_index < 0 and hosts and environ.get("SLURMD_NODENAME") in hosts:
        node_index = hosts.index(environ["SLURMD_NODENAME"])
    if per_node and not 0 <= node_index < len(per_node):
        raise ValueError(f"SLURM_NODEID={node_index} is not one of the {len(hosts)} nodes "
                         f"{list(hosts)}")
    if per_node:
        local_size = per_node[node_index]
    else:
        local_size = _int(environ, "SLURM_NTASKS_PER_NODE", default=size)
    # e.g. "cyclic", "block:cyclic" (nodes:sockets) or "block,Pack": the node level comes first.
    distribution = re.split("[:,]", environ.get("SLURM_DISTRIBUTION", ""))[0] or "block"
    return ClusterEnv("slurm", rank, size, _int(environ, "SLURM_LOCALID", default=0),
                      local_size, hosts, per_node, node_index, distribution,
                      _node(environ, "SLURMD_NODENAME"))


def _lsf_hosts(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The compute hosts of an LSF job, from LSB_MCPU_HOSTS ("host slots host slots ...") or
    LSB_HOSTS (a host once per slot). On CSM machines (Summit) the first host is the launch
    node with a single slot, which runs no ranks; it is left out."""
    pairs = environ.get("LSB_MCPU_HOSTS", "").split()
    if pairs:
        try:
            slots = {h: int(n) for h, n in zip(pairs[0::2], pairs[1::2], strict=True)}
        except ValueError:
            raise ValueError(f"LSB_MCPU_HOSTS={environ['LSB_MCPU_HOSTS']!r} is not "
                             "'host slots host slots ...'") from None
    else:
        slots = {}
        for host in environ.get("LSB_HOSTS", "").split():
            slots[host] = slots.get(host, 0) + 1
    names = list(slots)
    if len(names) > 1 and slots[names[0]] == 1 and all(slots[h] > 1 for h in names[1:]):
        names = names[1:]
    return tuple(names)


def _jsrun(environ: Mapping[str, str]) -> ClusterEnv:
    size = _int(environ, "JSM_NAMESPACE_SIZE")
    return ClusterEnv("jsrun", _int(environ, "JSM_NAMESPACE_RANK"), size,
                      _int(environ, "JSM_NAMESPACE_LOCAL_RANK", default=0),
                      _int(environ, "JSM_NAMESPACE_LOCAL_SIZE", default=size),
                      hosts=_lsf_hosts(environ), node=_node(environ))


def _simple(environ: Mapping[str, str], launcher: str, prefix: str) -> ClusterEnv:
    size = _int(environ, f"{prefix}SIZE")
    return ClusterEnv(launcher, _int(environ, f"{prefix}RANK"), size,
                      _int(environ, f"{prefix}LOCAL_RANK", default=0),
                      _int(environ, f"{prefix}LOCAL_SIZE", default=size),
                      node=_node(environ, f"{prefix}HOSTNAME"))


def _pmi(environ: Mapping[str, str]) -> ClusterEnv:
    size = _int(environ, "PMI_SIZE")
    return ClusterEnv("pmi", _int(environ, "PMI_RANK"), size,
                      _int(environ, "MPI_LOCALRANKID", "PMI_LOCAL_RANK", default=0),
                      _int(environ, "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", default=size),
                      node=_node(environ))


def _slurm_is_the_launcher(environ: Mapping[str, str]) -> bool:
    if "SLURM_PROCID" not in environ:
        return False
    if "PMI_RANK" not in environ:
        return True
    # srun's own PMI agrees with Slurm's variables; a different PMI launcher (mpiexec.hydra
    # inside a batch job) leaves the batch step's stale SLURM_PROCID behind.
    return (environ.get("PMI_RANK") == environ.get("SLURM_PROCID")
            and environ.get("PMI_SIZE") in (environ.get("SLURM_STEP_NUM_TASKS"),
                                            environ.get("SLURM_NTASKS")))


def detect(environ: Mapping[str, str] = os.environ) -> ClusterEnv:
    """Reads this rank's place in the job from the launcher's variables.

    Launchers are tried from the most specific to the least, because the inner one's
    variables are the truth when launchers nest (Slurm's batch variables are still set under
    an ``mpirun`` inside ``sbatch``; Spectrum MPI under ``jsrun`` also sets Open MPI's).

    Args:
        environ: the variables to read (default: this process's environment).

    Returns:
        The detected :class:`ClusterEnv`; ``launcher="none"``, rank 0 of 1 when no launcher's
        variables are set.

    Raises:
        ValueError: when a launcher's variables are malformed or contradict each other.
    """
    if "HOROVOD_RANK" in environ:
        return _simple(environ, "horovodrun", "HOROVOD_")
    if "JSM_NAMESPACE_RANK" in environ:
        return _jsrun(environ)
    if "OMPI_COMM_WORLD_RANK" in environ:
        return _simple(environ, "openmpi", "OMPI_COMM_WORLD_")
    if _slurm_is_the_launcher(environ):
        return _slurm(environ)
    if "PMI_RANK" in environ:
        return _pmi(environ)
    return ClusterEnv("none", 0, 1, 0, 1, node=_node(environ))


def parse_tf_config(text: str) -> tuple[int, list[str]]:
    """(task index, worker addresses) of a TF_CONFIG.

    Raises:
        ValueError: saying what is wrong with it.
    """
    try:
        spec = json.loads(text)
        workers = [str(worker) for worker in spec["cluster"]["worker"]]
        task = spec["task"]
        index = int(task["index"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"TF_CONFIG is malformed ({err!r}); expected JSON like "
            '{"cluster": {"worker": ["host1:port", "host2:port"]}, '
            '"task": {"type": "worker", "index": 0}}') from None
    if task.get("type") not in ("worker", "chief"):
        raise ValueError(f"TF_CONFIG task type {task.get('type')!r}; expected 'worker'")
    if not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG task index {index} is outside the {len(workers)} workers")
    return index, workers


def _from_tf_config(text: str, environ: Mapping[str, str]) -> ClusterEnv:
    """The TF_CONFIG's view: its task index is the rank; workers on the same host (the part of
    the address before the port) share a node."""
    index, workers = parse_tf_config(text)
    hosts = [worker.rsplit(":", 1)[0] for worker in workers]
    mine = [i for i, host in enumerate(hosts) if host == hosts[index]]
    return ClusterEnv("tf_config", index, len(workers), mine.index(index), len(mine),
                      node=_node(environ))


def this_process(environ: Mapping[str, str] = os.environ) -> ClusterEnv:
    """This process's place in its job, from the innermost source that has one (the launcher
    that started this process, not one whose variables it inherited):

    1. tfscale's local launcher (``--num_processes``): ``TFSCALE_LOCAL_RANK`` and
       ``TFSCALE_LOCAL_SIZE``; all of its workers are on this node, and its Horovod workers'
       global rank comes from horovodrun's variables;
    2. ``TF_CONFIG`` (written by a job script or the user);
    3. a cluster or MPI launcher's variables (:func:`detect`);
    4. none: rank 0 of 1.

    Raises:
        ValueError: when the variables of the source used are malformed.
    """
    if "TFSCALE_LOCAL_RANK" in environ:
        local_size = _int(environ, "TFSCALE_LOCAL_SIZE")
        local = _int(environ, "TFSCALE_LOCAL_RANK")
        # Horovod workers (also of simulated multi-node runs) get their global place from the
        # Gloo variables the launcher sets beside these.
        rank = _int(environ, "HOROVOD_RANK", default=local)
        size = _int(environ, "HOROVOD_SIZE", default=local_size)
        return ClusterEnv("tfscale", rank, size, local, local_size, node=_node(environ))
    if "TF_CONFIG" in environ:
        return _from_tf_config(environ["TF_CONFIG"], environ)
    return detect(environ)


def restart_count(environ: Mapping[str, str] = os.environ) -> int:
    """How many times this job was started again: by tfscale's launcher after a failure
    (``TFSCALE_RESTART``), else by Slurm after a requeue (``SLURM_RESTART_COUNT``); else 0.

    Raises:
        ValueError: when the variable is not a count.
    """
    return _int(environ, RESTART_VAR, "SLURM_RESTART_COUNT", default=0)


def launched(environ: Mapping[str, str] = os.environ) -> bool:
    """True when this process is one rank of a job that something else started (tfscale's
    local launcher, a TF_CONFIG cluster, or a cluster launcher with more than one rank)."""
    env = this_process(environ)
    return "TFSCALE_LAUNCHED" in environ or env.launcher in ("tf_config", "tfscale") \
        or env.size > 1


def tf_config(env: ClusterEnv, port: int = DEFAULT_PORT) -> dict[str, Any]:
    """The TF_CONFIG of ``env``'s rank: one worker per rank, ``host:port+index on host``.

    Ranks sharing a node get consecutive ports from ``port``.

    Raises:
        ValueError: when the layout is unknown, or the port range is invalid.
    """
    if not 0 < port <= 65535 - max(env.tasks_per_node or (0,)):
        raise ValueError(f"port {port}: the workers' ports must fit in 1..65535")
    slots = env.task_slots()
    if env.node_index >= 0:
        own = (env.hosts[env.node_index], env.local_rank)
        if slots[env.rank] != own:
            raise ValueError(f"the {env.launcher} variables contradict each other: rank "
                             f"{env.rank} is {slots[env.rank]} (host, index) in the "
                             f"{env.distribution} layout of {list(env.hosts)} but runs as {own}")
    workers = [f"{host}:{port + index}" for host, index in slots]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": env.rank}}


def tf_config_from_slurm(environ: Mapping[str, str] = os.environ,
                         port: int = DEFAULT_PORT) -> dict[str, Any]:
    """TF_CONFIG for MultiWorkerMirroredStrategy from an ``srun`` task's variables.

    Unlike ``tf.distribute.cluster_resolver.SlurmClusterResolver`` (which sorts the host names),
    the workers follow Slurm's own rank order, so rank r is worker r also for node lists like
    ``node[9-10]`` or ``--distribution=cyclic``.

    Raises:
        ValueError: when this is not a Slurm task, or its variables are inconsistent.
    """
    env = detect(environ)
    if env.launcher != "slurm":
        raise ValueError(f"not a Slurm task (detected launcher: {env.launcher}); "
                         "run under srun, or set TF_CONFIG yourself")
    return tf_config(env, port)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config_envs(n: int) -> list[dict[str, str]]:
    """One TF_CONFIG per worker of an ``n``-worker loopback cluster."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(n)]
    return [{"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                      "task": {"type": "worker", "index": i}})}
            for i in range(n)]
