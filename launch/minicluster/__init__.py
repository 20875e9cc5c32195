"""A real two-node (or N-node) cluster on this one machine, for running tfscale's job scripts
as a scheduler would.

Each node is a set of Linux namespaces (run as root): its own network namespace with one
address on a bridge that exists only inside the head's namespace, its own host name, and its
own /dev/shm. The head runs slurmctld and munge; every node runs slurmd and a key-based sshd,
so ``sbatch``, ``srun --mpi=pmix``, ``mpirun`` over ssh and ``horovodrun -H`` all work. The
filesystem stays shared between nodes, as a cluster's parallel filesystem is.

Usage::

    python -m launch.minicluster up --nodes=2
    python -m launch.minicluster exec sbatch --wait job.sh
    python -m launch.minicluster status
    python -m launch.minicluster down
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence

from launch.minicluster import _daemons, _namespaces, _packages
from launch.minicluster._layout import (
    CLUSTER_FILE,
    HEAD,
    STATE_DIR,
    Host,
    head,
    nodes,
    share_cores,
)

__all__ = ["Host", "down", "exec_command", "leftovers", "status", "up", "why_not_possible"]

why_not_possible = _namespaces.why_not_possible
Say = Callable[[str], None]


def _print(text: str) -> None:
    print(f"[minicluster] {text}", flush=True)


def up(count: int = 2, say: Say = _print) -> list[Host]:
    """Starts a cluster of ``count`` nodes, or keeps the running one when it has that many
    nodes and all its daemons answer. Installs the Debian packages it needs the first time.

    Returns:
        The compute nodes.

    Raises:
        RuntimeError: when namespaces cannot be made here, a package cannot be installed, or a
            daemon does not start (what was started is stopped again first).
    """
    if count < 1:
        raise ValueError(f"--nodes={count}; a cluster needs at least 1 node")
    why = why_not_possible()
    if why:
        raise RuntimeError(why)
    running = _running()
    if running and len(running[1]) == count and _healthy(*running):
        say(f"already up: {', '.join(n.name for n in running[1])}")
        _how_to_submit(say)
        return running[1]
    if running or _namespaces.existing_netns():
        say("a different or unhealthy cluster is there: taking it down first")
        down(say)
    _packages.ensure(say)
    available = sorted(os.sched_getaffinity(0))
    shares, cores_note = share_cores(available, count)
    the_head, the_nodes = head(tuple(available)), nodes(count, shares)
    say(cores_note)
    try:
        _daemons.write_configuration(the_head, the_nodes, cpus_per_node=len(available))
        _namespaces.create_network(the_head, the_nodes)
        for host in (the_head, *the_nodes):
            _namespaces.start_holder(host, _daemons.binds(host, host.name == HEAD))
        say(f"namespaces: {the_head.name} {the_head.address} (bridge), " + ", ".join(
            f"{n.name} {n.address}" for n in the_nodes) + "; each with its own /dev/shm")
        _daemons.start(the_head, the_nodes)
    except BaseException:
        say("start-up failed: taking down what was started")
        down(lambda _: None)
        raise
    CLUSTER_FILE.write_text(json.dumps({
        "head": _host_json(the_head), "nodes": [_host_json(n) for n in the_nodes],
        "cores": cores_note}, indent=1))
    say(f"up: slurmctld and munge on {HEAD}; slurmd and sshd on "
        f"{', '.join(n.name for n in the_nodes)}")
    _how_to_submit(say)
    return the_nodes


def _how_to_submit(say: Say) -> None:
    say("submit with:  python -m launch.minicluster exec sbatch --wait JOB.sh")
    say("or run:       python -m launch.minicluster exec srun -N2 hostname")


def _host_json(host: Host) -> dict[str, object]:
    return {"name": host.name, "address": host.address, "cores": list(host.cores)}


def _running() -> tuple[Host, list[Host]] | None:
    try:
        spec = json.loads(CLUSTER_FILE.read_text())
    except (OSError, ValueError):
        return None

    def host(entry: dict[str, object]) -> Host:
        cores = entry["cores"]
        assert isinstance(cores, list)
        return Host(str(entry["name"]), str(entry["address"]), tuple(int(c) for c in cores))

    return host(spec["head"]), [host(n) for n in spec["nodes"]]


def _healthy(the_head: Host, the_nodes: Sequence[Host]) -> bool:
    if not all(_namespaces.holder_pid(h) for h in (the_head, *the_nodes)):
        return False
    states = _daemons.node_states(the_head, [n.name for n in the_nodes])
    return all(not s.endswith("*") and s not in ("unknown", "down", "drained")
               for s in states.values())


def status(say: Say = print) -> int:
    """Prints each host with its address, cores and Slurm state; 0 when the cluster is up and
    every node answers, 1 otherwise."""
    running = _running()
    if running is None:
        left = _namespaces.existing_netns()
        say("the mini-cluster is down" + (f" (but namespaces remain: {', '.join(left)}; run "
                                          "down)" if left else ""))
        return 1
    the_head, the_nodes = running
    states = (_daemons.node_states(the_head, [n.name for n in the_nodes])
              if _namespaces.holder_pid(the_head) else {})
    say(f"{'host':<8} {'address':<14} {'cores':<8} state")
    say(f"{the_head.name:<8} {the_head.address:<14} {'':<8} "
        + ("slurmctld, munge" if _namespaces.holder_pid(the_head) else "not running"))
    healthy = bool(states)
    for node in the_nodes:
        state = states.get(node.name, "unknown") if _namespaces.holder_pid(node) else "no ns"
        healthy &= not state.endswith("*") and state not in ("unknown", "no ns", "down")
        say(f"{node.name:<8} {node.address:<14} {','.join(map(str, node.cores)):<8} {state}")
    return 0 if healthy else 1


def exec_command(command: Sequence[str], on: str = HEAD) -> int:
    """Runs ``command`` on host ``on`` (the head by default) in the cluster's namespaces, in
    the current directory, with this process's environment, and on a node on that node's
    cores, as its daemons run; returns its exit code."""
    running = _running()
    if running is None:
        raise RuntimeError("the mini-cluster is down; start it with "
                           "`python -m launch.minicluster up --nodes=2`")
    hosts = {h.name: h for h in (running[0], *running[1])}
    if on not in hosts:
        raise ValueError(f"--on={on!r}; the cluster's hosts are {', '.join(hosts)}")
    host = hosts[on]
    cores = [] if on == HEAD else ["taskset", "-c", ",".join(map(str, host.cores))]
    return subprocess.call([*_namespaces.enter(host), *cores, *command])


def down(say: Say = _print) -> list[str]:
    """Stops every process in the cluster's namespaces (daemons, jobs), deletes the
    namespaces (and with them their links and mounts) and the state directory. Works from
    names alone, so also after an ``up`` that stopped halfway.

    Returns:
        What is still there afterwards (:func:`leftovers`): normally nothing.
    """
    names = _namespaces.existing_netns()
    stuck = _namespaces.stop_processes(names)
    if stuck:
        say(f"processes that would not die: {stuck}")
    _namespaces.delete_netns(names)
    _daemons.forget()
    left = leftovers()
    say("down: " + (f"left behind: {'; '.join(left)}" if left
                    else f"removed {len(names)} namespace(s); nothing left behind"))
    return left


def leftovers() -> list[str]:
    """What of the cluster remains: namespaces, processes in them, mounts, the state
    directory, /run/sshd made by ``up``."""
    left = [f"namespace {n}" for n in _namespaces.existing_netns()]
    left += [f"process {p}" for p in _namespaces.processes_in(_namespaces.existing_netns())]
    mounts = open("/proc/self/mounts").read()
    left += [f"mount {line.split()[1]}" for line in mounts.splitlines()
             if str(STATE_DIR) in line or "/run/netns/tfsc-" in line]
    if STATE_DIR.exists():
        left.append(f"directory {STATE_DIR}")
    return left
