"""``--num_processes N``: start N local workers, stream their output, stop them together.

Like ``torchrun``, so a laptop user never writes a TF_CONFIG or a horovodrun line:

- Horovod-style strategies: the workers rendezvous through Horovod's Gloo HTTP server, which
  this process runs, with the per-rank variables horovodrun would set. Simulated nodes
  (``hosts``) get distinct host names, so Horovod's local/cross communicators see several
  nodes on one machine (used by the ``ddl`` tests).
- TF_CONFIG strategies: a cluster of N workers on free 127.0.0.1 ports.

The supervisor prefixes each worker's lines with its rank, forwards SIGTERM/SIGINT/SIGUSR1 to
all workers (so they checkpoint and exit), and when one worker fails it stops the others and
returns that worker's exit code. Workers die with the launcher even if it is SIGKILLed
(``PR_SET_PDEATHSIG``), so no process is left behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from tfscale.config import TrainConfig
from tfscale.flags import argv_from_config
from tfscale.strategies import STRATEGIES, Launcher

GRACE_SECONDS = 20.0
_PR_SET_PDEATHSIG = 1


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


def node_layout(n: int, per_node: int) -> list[tuple[str, int]]:
    """Host names and slot counts for ``n`` processes, ``per_node`` per simulated node."""
    if per_node < 1 or n % per_node:
        raise ValueError(f"{n} processes cannot be split into nodes of {per_node}")
    if per_node == n:
        return [("localhost", n)]
    return [(f"node{i}", per_node) for i in range(n // per_node)]


def horovod_envs(hosts: Sequence[tuple[str, int]]) -> tuple[list[dict[str, str]], Any]:
    """Per-rank Horovod/Gloo variables for ``hosts`` and the running rendezvous server
    (stop it with ``.stop()`` when the workers are done)."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    size = sum(slots for _, slots in hosts)
    plan = get_host_assignments(parse_hosts(",".join(f"{h}:{s}" for h, s in hosts)), size)
    server = RendezvousServer()
    port = server.start()
    server.init(plan)
    envs = [{
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": "lo", "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    } for slot in plan]
    return envs, server


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGKILL it when the launcher dies, however it dies.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pump(rank: int, stream: IO[str], out: IO[str]) -> None:
    for line in stream:
        out.write(f"[{rank}] {line}")
        out.flush()


def supervise(
    command: Sequence[str], envs: Sequence[dict[str, str]], out: IO[str] | None = None,
    on_exit: Callable[[], None] | None = None,
) -> int:
    """Runs ``command`` once per env (rank = position), supervising the group.

    Returns:
        0 if every worker succeeded, else the exit code of the first worker that failed
        (128 + signal number for a worker killed by a signal).
    """
    out = out or sys.stdout
    procs: list[subprocess.Popen[str]] = []
    pumps: list[threading.Thread] = []

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signum)

    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    previous = {s: signal.signal(s, forward) for s in handled}
    try:
        for rank, extra in enumerate(envs):
            env = {**os.environ, "TFSCALE_LAUNCHED": "1", "PYTHONUNBUFFERED": "1",
                   "TFSCALE_LOCAL_RANK": extra.get("HOROVOD_LOCAL_RANK", str(rank)),
                   "TFSCALE_LOCAL_SIZE": extra.get("HOROVOD_LOCAL_SIZE", str(len(envs))),
                   **extra}
            p = subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                 preexec_fn=_die_with_parent)
            procs.append(p)
            assert p.stdout is not None
            pumps.append(threading.Thread(target=_pump, args=(rank, p.stdout, out), daemon=True))
            pumps[-1].start()
        code = _wait(procs, out)
    finally:
        _stop(procs)
        for t in pumps:
            t.join(timeout=5)
        for s, h in previous.items():
            signal.signal(s, h)
        if on_exit:
            on_exit()
    return code


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _wait(procs: Sequence[subprocess.Popen[str]], out: IO[str]) -> int:
    while True:
        codes = [p.poll() for p in procs]
        failed = [(rank, c) for rank, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            running = [r for r, c in enumerate(codes) if c is None]
            if running:
                how = (f"was killed by {signal.Signals(-code).name}" if code < 0
                       else f"exited with code {code}")
                out.write(f"[launcher] worker {rank} {how}; stopping workers {running}\n")
                out.flush()
            return _exit_code(code)
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def _stop(procs: Sequence[subprocess.Popen[str]]) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    for p in alive:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def launch_workers(config: TrainConfig) -> int:
    """Starts ``config.num_processes`` workers of ``python -m tfscale.train`` for the config's
    strategy and waits for them (see the module docstring)."""
    n = config.num_processes
    strategy = STRATEGIES.get(config.strategy)
    command = [sys.executable, "-m", "tfscale.train", *argv_from_config(config)]
    if strategy.launcher == Launcher.TF_CONFIG:
        return supervise(command, tf_config_envs(n))
    if strategy.launcher == Launcher.HOROVOD:
        envs, server = horovod_envs(node_layout(n, strategy.ranks_per_node(config)))
        return supervise(command, envs, on_exit=server.stop)
    raise ValueError(f"--strategy={config.strategy} cannot be launched with --num_processes")
