"""``tfscale-run``: your own training script on N local workers under a strategy (torchrun's
role for tfscale)::

    tfscale-run --nproc=2 --strategy=horovod train.py --epochs=3
    python -m tfscale.run --nproc=2 --strategy=multiworker --max_restarts=1 train.py
    tfscale-run --nproc=2 -m mypackage.train          # a module, as python -m runs it
    srun -n 4 tfscale-run --strategy=multiworker train.py   # starts nothing (see below)

The script path is taken relative to the caller's working directory, in which the workers run.
Options come before the script; everything after it is the script's own arguments.

**What each worker gets** (its environment; a script reads it or lets tfscale read it):

- ``TFSCALE_STRATEGY=<--strategy>`` and ``TFSCALE_RESTART=<attempt>`` (0, then 1 .. N after
  ``--max_restarts`` restarts);
- ``TFSCALE_LAUNCHED=1``, ``TFSCALE_LOCAL_RANK``, ``TFSCALE_LOCAL_SIZE``: its place on this
  node, which the shared-memory node exchange and the CPU binding read;
- Horovod-style strategies (horovod, ddl): the Gloo rendezvous variables that ``horovodrun``
  would set (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` ...), served
  by this process; TF_CONFIG strategies (multiworker): a ``TF_CONFIG`` on free loopback ports;
- the CPU defaults of ``tfscale.train --num_processes``: with several workers and a core for
  each (or ``--cpu_binding``), worker r is bound to its own block of cores and
  ``TF_NUM_INTRAOP_THREADS`` is that block's size, which TensorFlow reads when it starts (a
  value already in the caller's environment wins; ``--nocpu_binding`` leaves them unbound).

The launcher prefixes each worker's lines with ``[rank]``, forwards SIGTERM, SIGINT and
SIGUSR1 to all workers, and when one fails, stops the others; with ``--max_restarts=N`` it then
starts the whole group again, fresh rendezvous included, up to N times (not after exit 2 or
75, or when the launcher itself was signalled). Supervision is :mod:`tfscale.scripts.launcher`'s,
which
also leaves out TensorFlow's start-up notices. When the reader of the launcher's output goes
away (``| head``), the workers go on and their further output is discarded
(:mod:`tfscale.cli.output`).

**Under a cluster launcher** (``srun``, ``mpirun``, ``jsrun``, ``horovodrun``: this process is
one rank of a job, :func:`tfscale.cluster_env.launched`) it starts nothing: it sets
``TFSCALE_STRATEGY``, ``TFSCALE_RESTART`` (Slurm's ``SLURM_RESTART_COUNT`` after a requeue,
else 0) and, for a TF_CONFIG strategy without a ``TF_CONFIG``, the one built from the
launcher's variables (``--port``), then replaces itself with the script (``exec``). Restarts
there are the cluster's business (e.g. Slurm's ``--requeue``).

**Exit codes**

- 0: every worker finished with 0;
- 2: bad usage, in one line (no script, ``--nproc`` < 1, an unknown strategy, the script not
  found, a one-process strategy with ``--nproc`` > 1, Horovod not installed);
- N: the first worker that failed (in the last attempt) exited with N; 128+S: it was killed by
  signal S. A script that leaves a usage error of tfscale's API uncaught once
  ``tfscale.setup()`` has started (the runtime settings install the hook: ``setup()`` called
  too late under ``multiworker``, ``prepare()``'s refusals) exits 2 after one ``error: ...``
  line (:func:`tfscale.config.errors.report_script_usage_errors`), and is not restarted.

Under a cluster launcher the exit code is the script's own.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from tfscale.cli import output
from tfscale.cli.command import own_top_level_packages
from tfscale.cluster import cpu_binding
from tfscale.cluster import environment as cluster_env
from tfscale.cluster.environment import RESTART_VAR, STRATEGY_VAR
from tfscale.config.errors import EXIT_USAGE
from tfscale.strategies import (
    DEFAULT_STRATEGY,
    MULTI_PROCESS_DEFAULT,
    STRATEGIES,
    Rendezvous,
    Strategy,
    strategies_that,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # Bad usage is one line (argparse's own error prints the usage first).
        print(f"tfscale-run: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tfscale-run",
                     description="Run your own training script on N workers under a strategy.",
                     usage="tfscale-run [options] (script.py | -m module) [script args ...]")
    parser.add_argument("--nproc", "--nproc_per_node", type=int, default=1,
                        help="workers to start on this machine (default 1)")
    parser.add_argument("--strategy", default=None,
                        help=f"the strategy the workers use (default: {DEFAULT_STRATEGY} for one "
                        f"worker, {MULTI_PROCESS_DEFAULT} for several): "
                        f"{', '.join(STRATEGIES.names())}")
    parser.add_argument("--max_restarts", type=int, default=0,
                        help="when a worker fails, restart all of them up to N times")
    # Spelt as tfscale.train's absl flags are (--nocpu_binding).
    parser.add_argument("--cpu_binding", action="store_const", const=True, default=None,
                        help="bind each worker to its own cores and size its threads to them "
                        "(default: on when there are several workers and a core for each)")
    parser.add_argument("--nocpu_binding", dest="cpu_binding", action="store_const",
                        const=False, help="leave the workers unbound")
    parser.add_argument("--port", type=int, default=cluster_env.DEFAULT_PORT,
                        help="under a cluster launcher: first port of the TF_CONFIG workers on "
                        "each node")
    parser.add_argument("-m", dest="module", action="store_true",
                        help="the target is a module to run as python -m does")
    parser.add_argument("script", nargs="?", help="the script to run (relative to this "
                        "directory), or with -m a module")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def _strategy(name: str | None, workers: int, which: str) -> tuple[str, type[Strategy]]:
    """The chosen strategy's name and class for a job of ``workers`` processes (``which``
    says whose: ``--nproc`` or the cluster launcher's).

    Raises:
        ValueError: for an unknown name, or a one-process strategy with several workers.
    """
    name = name or (DEFAULT_STRATEGY if workers == 1 else MULTI_PROCESS_DEFAULT)
    try:
        cls = STRATEGIES.get(name)
    except ValueError as err:
        raise ValueError(f"--strategy: {err}") from None
    if workers > 1 and not cls.multi_process():
        raise ValueError(f"--strategy={name} runs in one process; {which} needs one of "
                         f"{', '.join(strategies_that(lambda c: c.multi_process()))}")
    return name, cls


def _target(script: str | None, module: bool) -> list[str]:
    """The worker's command line up to the script's arguments.

    Raises:
        ValueError: when the script or module is not found.
    """
    if not script:
        raise ValueError("no script given: tfscale-run [options] script.py [args]")
    if module:
        try:
            found = importlib.util.find_spec(script) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ValueError(f"-m {script}: no such module (from {os.getcwd()})")
        return [sys.executable, "-m", script]
    path = Path(script)
    if not path.is_file():
        raise ValueError(f"script {script} not found (relative to {os.getcwd()})")
    return [sys.executable, str(path.resolve())]


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """Parses ``argv`` and runs the script (see the module docstring).

    Returns:
        The exit code (see the module docstring); under a cluster launcher it does not return.
    """
    args = _parser().parse_args(argv)
    try:
        if args.nproc < 1:
            raise ValueError(f"--nproc={args.nproc}: expected a number of workers >= 1")
        if args.max_restarts < 0:
            raise ValueError(f"--max_restarts={args.max_restarts}: expected a count >= 0")
        job = cluster_env.this_process(environ) if cluster_env.launched(environ) else None
        name, cls = (_strategy(args.strategy, job.size, f"the {job.launcher} job of {job.size} "
                               "ranks") if job else
                     _strategy(args.strategy, args.nproc, f"--nproc={args.nproc}"))
        command = [*_target(args.script, args.module), *args.args]
        cls.check_environment()
        if job:
            _exec_in_place(name, cls, command, job, args.nproc, args.port, args.max_restarts,
                           environ)
    except ValueError as err:
        print(f"tfscale-run: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return _launch(name, cls, command, args.nproc, args.max_restarts, args.cpu_binding)


def _launch(name: str, cls: type[Strategy], command: list[str], nproc: int,
            max_restarts: int, binding: bool | None) -> int:
    from tfscale.scripts.launcher import group_envs, supervise_restarts

    # The workers go on when this output's reader goes away (| head); there is no run folder
    # to keep their further output in.
    output.divert_when_reader_leaves(None, "tfscale-run")
    bind = cpu_binding.binds_by_default(nproc) if binding is None else binding
    available = sorted(os.sched_getaffinity(0))
    try:
        cores = [cpu_binding.cores_for(r, nproc, available) for r in range(nproc)] if bind else None
    except ValueError as err:
        print(f"tfscale-run: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    intra = cpu_binding.INTRA_VAR
    threads = ({} if cores is None or intra in os.environ
               else {r: {intra: str(len(c))} for r, c in enumerate(cores)})
    for r in range(nproc):
        where = f"cores {','.join(map(str, cores[r]))}" if cores else "not bound"
        given = threads.get(r, {}).get(intra) or os.environ.get(intra, "TF default")
        print(f"[launcher] worker {r} of {nproc} ({name}): {where}; intra-op threads {given}",
              flush=True)

    def start() -> tuple[list[dict[str, str]], Callable[[], None] | None]:
        if cls.rendezvous == Rendezvous.NONE:
            envs: list[dict[str, str]] = [{}]
            on_exit = None
        else:
            envs, on_exit = group_envs(cls.rendezvous, [("localhost", nproc)])
        return [{**env, **threads.get(r, {}), STRATEGY_VAR: name}
                for r, env in enumerate(envs)], on_exit

    return supervise_restarts(command, start, max_restarts, cores=cores)


def _exec_in_place(name: str, cls: type[Strategy], command: list[str],
                   env: cluster_env.ClusterEnv, nproc: int, port: int, max_restarts: int,
                   environ: Mapping[str, str]) -> NoReturn:
    """Becomes the script, as one rank (``env``) of the job that a cluster launcher started.

    Raises:
        ValueError: for a ``--nproc`` the job does not fit, or a TF_CONFIG that cannot be
            built from the launcher's variables.
    """
    if nproc not in (1, env.size):
        raise ValueError(f"--nproc={nproc} but {env.launcher} started {env.size} rank(s) and "
                         "this is one of them; drop --nproc under a cluster launcher")
    if max_restarts:
        print(f"tfscale-run: warning: --max_restarts={max_restarts} is ignored under "
              f"{env.launcher}: restart the job there (e.g. Slurm's --requeue)", file=sys.stderr)
    extra = {STRATEGY_VAR: name, RESTART_VAR: str(cluster_env.restart_count(environ))}
    if cls.rendezvous == Rendezvous.TF_CONFIG and "TF_CONFIG" not in environ:
        try:
            spec = cluster_env.tf_config(cluster_env.detect(environ), port)
        except ValueError as err:
            raise ValueError(f"--strategy={name} needs a TF_CONFIG, which the {env.launcher} "
                             f"variables do not give ({err}); set TF_CONFIG on each rank "
                             "(python -m tfscale.cluster_env --tf_config --hosts ...)") from None
        extra["TF_CONFIG"] = json.dumps(spec)
    sys.stdout.flush()
    os.execve(command[0], command, {**environ, **extra})


def entry() -> None:
    """The ``tfscale-run`` console script (and ``python -m tfscale.run``)."""
    # tfscale.scripts.launcher is tfscale's, also where the user's directory has its own launch
    # package.
    own_top_level_packages()
    # --help | head ends quietly; a run's own output is diverted when its reader leaves.
    sys.exit(output.ends_quietly(main)())


if __name__ == "__main__":
    entry()
