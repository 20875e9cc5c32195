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
(``PR_SET_PDEATHSIG``), so no process is left behind. It reads the workers' output to the end
whatever becomes of its own: a worker whose pipe nobody read would block on its next line and
stall the group (``tfscale.train | head`` did). TensorFlow's start-up notices that
``TF_CPP_MIN_LOG_LEVEL`` does not silence (absl's "All log messages before
absl::InitializeLog()", oneDNN's and the CPU-feature lines: two or three a worker, before its
first own line) are left out unless ``TF_CPP_MIN_LOG_LEVEL=0`` asks for TensorFlow's INFO.

With ``--max_restarts N`` (:func:`supervise_restarts`, as torchrun's) a failed group is stopped
and started again, whole, up to N times, each attempt with a fresh rendezvous (new ports) and
``TFSCALE_RESTART`` set to the attempt's number (0 first). A worker that exits 0 (done), 2 (bad
usage: it would fail the same way again) or 75 (preempted: it checkpointed because it was
asked to stop), and a launcher that was itself signalled, end the job instead.
``tfscale-run`` (:mod:`tfscale.run`) starts users' scripts through the same functions.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from tfscale.cluster.environment import RESTART_VAR, STRATEGY_VAR, tf_config_envs
from tfscale.config.errors import EXIT_PREEMPTED, EXIT_USAGE
from tfscale.config.train_config import TrainConfig
from tfscale.strategies import STRATEGIES, Rendezvous

GRACE_SECONDS = 20.0
_PR_SET_PDEATHSIG = 1
# TensorFlow's start-up lines that TF_CPP_MIN_LOG_LEVEL does not silence (its absl logs before
# absl's own initialization): the absl notice, oneDNN's, and the CPU features it was built for.
_TF_STARTUP = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|I\d{4} [\d:.]+ +\d+ (port\.cc:\d+\] oneDNN custom operations are on\."
    r"|cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized)"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate "
    r"compiler flags\.$")


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


def group_envs(rendezvous: Rendezvous, hosts: Sequence[tuple[str, int]],
               ) -> tuple[list[dict[str, str]], Callable[[], None] | None]:
    """Fresh per-worker variables for a group of ranks that find each other by ``rendezvous``
    on ``hosts`` (new ports, a new rendezvous), and what to call when the group has ended.

    Raises:
        ValueError: for a strategy whose ranks are not started as processes.
    """
    n = sum(slots for _, slots in hosts)
    if rendezvous == Rendezvous.TF_CONFIG:
        return tf_config_envs(n), None
    if rendezvous == Rendezvous.HOROVOD:
        envs, server = horovod_envs(hosts)
        return envs, server.stop
    raise ValueError("a one-process strategy has no workers to start")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a group of workers ended.

    Attributes:
        code: 0 when every worker succeeded, else the first failed worker's exit code (128 + N
            for a worker killed by signal N).
        rank: the first worker that failed (None when none did).
        how: what happened to it, e.g. "was killed by SIGKILL" or "exited with code 4".
        signalled: the launcher itself received SIGTERM, SIGINT or SIGUSR1 (and forwarded it).
    """

    code: int
    rank: int | None = None
    how: str = ""
    signalled: bool = False

    @property
    def restartable(self) -> bool:
        """Whether starting the group again can help (see the module docstring)."""
        return (not self.signalled and self.code != 0
                and self.code not in (EXIT_USAGE, EXIT_PREEMPTED))


def _start_child(cores: Sequence[int] | None) -> Callable[[], None]:
    def prepare() -> None:
        # Runs in the child before exec: SIGKILL it when the launcher dies, however it dies.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if cores is not None:
            os.sched_setaffinity(0, cores)

    return prepare


def _pump(rank: int, stream: IO[str], out: IO[str]) -> None:
    """Copies worker ``rank``'s lines to ``out`` until the worker closes its end. Never stops
    early: when ``out`` fails (a full disk; a broken pipe, which :mod:`tfscale.cli.output` turns
    into a log), the lines are dropped, still read."""
    quiet = os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "0"
    writing = True
    for line in stream:
        if not writing or (quiet and _TF_STARTUP.match(line)):
            continue
        try:
            out.write(f"[{rank}] {line}")
            out.flush()
        except (OSError, ValueError):  # ValueError: out was closed
            writing = False


def supervise(
    command: Sequence[str], envs: Sequence[dict[str, str]], out: IO[str] | None = None,
    on_exit: Callable[[], None] | None = None,
) -> int:
    """Runs ``command`` once per env (rank = position), supervising the group.

    Returns:
        0 if every worker succeeded, else the exit code of the first worker that failed
        (128 + signal number for a worker killed by a signal).
    """
    return run_group(command, envs, out, on_exit).code


def supervise_restarts(
    command: Sequence[str],
    start: Callable[[], tuple[list[dict[str, str]], Callable[[], None] | None]],
    max_restarts: int, out: IO[str] | None = None,
    cores: Sequence[Sequence[int]] | None = None,
) -> int:
    """Runs groups of ``command`` until one ends without a restartable failure, at most
    ``1 + max_restarts`` of them; ``start()`` gives each attempt its fresh per-worker variables
    and cleanup (:func:`group_envs`), and every worker gets ``TFSCALE_RESTART=<attempt>``.

    Returns:
        The exit code of the last attempt (see :func:`supervise`).
    """
    out = out or sys.stdout
    attempt = 0
    while True:
        envs, on_exit = start()
        outcome = run_group(command, [{**env, RESTART_VAR: str(attempt)} for env in envs], out,
                            on_exit, cores)
        if attempt == max_restarts or not outcome.restartable:
            return outcome.code
        attempt += 1
        out.write(f"[launcher] worker {outcome.rank} {outcome.how}; restart {attempt} of "
                  f"{max_restarts}\n")
        out.flush()


def run_group(
    command: Sequence[str], envs: Sequence[dict[str, str]], out: IO[str] | None = None,
    on_exit: Callable[[], None] | None = None, cores: Sequence[Sequence[int]] | None = None,
) -> Outcome:
    """Runs ``command`` once per env (rank = position) until all succeed or one fails, then
    stops the rest. ``cores[rank]``, when given, are the cores worker ``rank`` is bound to."""
    out = out or sys.stdout
    procs: list[subprocess.Popen[str]] = []
    pumps: list[threading.Thread] = []
    signalled = False

    def forward(signum: int, frame: Any) -> None:
        nonlocal signalled
        signalled = True
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
                                 preexec_fn=_start_child(cores[rank] if cores else None))
            procs.append(p)
            assert p.stdout is not None
            pumps.append(threading.Thread(target=_pump, args=(rank, p.stdout, out), daemon=True))
            pumps[-1].start()
        outcome = _wait(procs, out)
    finally:
        _stop(procs)
        for t in pumps:
            t.join(timeout=5)
        for s, h in previous.items():
            signal.signal(s, h)
        if on_exit:
            on_exit()
    return dataclasses.replace(outcome, signalled=signalled)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _wait(procs: Sequence[subprocess.Popen[str]], out: IO[str]) -> Outcome:
    while True:
        codes = [p.poll() for p in procs]
        failed = [(rank, c) for rank, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            running = [r for r, c in enumerate(codes) if c is None]
            how = (f"was killed by {signal.Signals(-code).name}" if code < 0
                   else f"exited with code {code}")
            if running:
                out.write(f"[launcher] worker {rank} {how}; stopping workers {running}\n")
                out.flush()
            return Outcome(_exit_code(code), rank, how)
        if all(c == 0 for c in codes):
            return Outcome(0)
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
    strategy and waits for them, restarting the group up to ``config.max_restarts`` times (see
    the module docstring); a restarted run resumes from its last checkpoint.

    Raises:
        ValueError: for a one-process strategy.
    """
    strategy = STRATEGIES.get(config.strategy)
    if not strategy.multi_process():
        raise ValueError(f"--strategy={config.strategy} cannot be launched with --num_processes")
    command = [sys.executable, "-m", "tfscale.train", *config.to_argv()]
    hosts = node_layout(config.num_processes, strategy.ranks_per_node(strategy.settings(config)))

    def start() -> tuple[list[dict[str, str]], Callable[[], None] | None]:
        envs, on_exit = group_envs(strategy.rendezvous, hosts)
        return [{**env, STRATEGY_VAR: config.strategy} for env in envs], on_exit

    return supervise_restarts(command, start, config.max_restarts)
