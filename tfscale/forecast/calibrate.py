"""``--calibrate``: measure this node with a few steps of ``tfscale.train`` and write the figures
into a machine file.

Child processes (TensorFlow loads only in them):

1. ``python -m tfscale.train ... --dataset=synthetic`` for a few steps: compute time per step
   (data generated on the device costs nothing, as in the Summit practice of tuning compute
   with synthetic data first);
2. a short Python child that loads the model that run saved and counts its trainable weights'
   bytes: the gradient bytes one step exchanges;
3. only when the train flags name another ``--dataset``: the same run on that data; its
   images/s is a lower bound of the input pipeline's rate (the run also computes);
4. a NumPy child (no TensorFlow) that times an all-reduce between two processes on one core
   over loopback TCP while a third keeps that core computing: the host time per byte of an
   exchange on a busy core (``exchange.host_ns_per_byte``), and the same with the core
   otherwise idle (``exchange.idle_ns_per_byte``, what the forecast charges where the exchange
   runs after the backward pass);
5. TensorFlow workers (:mod:`tfscale.cli.host_time`) that time an all-reduce on idle cores
   through multiworker's own transports (``exchange.idle_ns_per_byte_by_transport``):
   tfscale's ring, two workers on one core, as raw TCP's figure is taken; TensorFlow's gRPC
   collective in the topology of the flat ring it carries, two nodes of two ranks sharing a
   core (``--flat_ring``: four workers on two cores, at the model's gradient size; two
   workers on one core overstate it by about 1.5x), or on a one-core node as the ring;
6. a TensorFlow child that casts the model's gradient bytes from float32 to float16 and back,
   as ``--fp16_allreduce`` does around its all-reduce: that work's time per float32 byte
   (``exchange.cast_ns_per_byte``) on this node's cores.

The compute run logs every step; the spread of its step times (sd / mean, the first steps left
out) is the machine's ``stragglers.step_cv``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tfscale.forecast import machines
from tfscale.forecast.model import FLAT_RING_LOCAL, FLAT_RING_NODES
from tfscale.training.files import write_json_atomic

SYNTHETIC = "synthetic"
# Prints the saved model's trainable weights' element counts (a JSON list, in the order Keras
# hands their gradients to the strategy), then their bytes.
_COUNT_GRADIENT_BYTES = """
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras, numpy
model = keras.saving.load_model(sys.argv[1], compile=False)
print(json.dumps([int(numpy.prod(w.shape)) for w in model.trainable_weights]))
print(sum(int(numpy.prod(w.shape)) * numpy.dtype(w.dtype).itemsize
          for w in model.trainable_weights))
"""


_HOST_TIME = """
import os, socket, sys, time
import numpy as np

NBYTES, SECONDS = int(sys.argv[1]), float(sys.argv[2])
core = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {core})


def burn():  # another rank's compute on the same core
    a = np.random.rand(256, 256)
    while True:
        a = np.tanh(a @ a)


def allreduce(sock, mine, theirs, first):
    view = memoryview(theirs).cast("B")
    if first:
        sock.sendall(mine)
    got = 0
    while got < len(view):
        chunk = sock.recv_into(view[got:])
        if not chunk:
            os._exit(0)
        got += chunk
    if not first:
        sock.sendall(mine)
    np.add(mine, theirs, out=mine)


def per_byte(busy):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    pids = [os.fork()]
    if pids[0] == 0:
        sock = socket.create_connection(("127.0.0.1", port))
        mine, theirs = np.ones(NBYTES // 4, np.float32), np.empty(NBYTES // 4, np.float32)
        while True:
            allreduce(sock, mine, theirs, False)
            if sock.recv(1) != b"1":
                os._exit(0)
    if busy:
        pids.append(os.fork())
        if pids[-1] == 0:
            burn()
    sock, _ = server.accept()
    mine, theirs = np.ones(NBYTES // 4, np.float32), np.empty(NBYTES // 4, np.float32)
    allreduce(sock, mine, theirs, True)
    sock.sendall(b"1")
    count, start, more = 0, time.perf_counter(), True
    while more:
        allreduce(sock, mine, theirs, True)
        count += 1
        more = time.perf_counter() - start < SECONDS
        sock.sendall(b"1" if more else b"0")
    elapsed = time.perf_counter() - start
    sock.close()
    for pid in pids:
        if pid != pids[0]:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    return elapsed / (count * NBYTES)


idle, busy = per_byte(False), per_byte(True)
print(idle * 1e9, busy * 1e9)
"""
_CAST_TIME = """
import os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

values = tf.random.uniform([max(1, int(sys.argv[1]) // 4)])
seconds = float(sys.argv[2])


@tf.function
def both_ways(x):
    return tf.cast(tf.cast(x, tf.float16), tf.float32)


back = both_ways(values).numpy()  # its trace, outside the timing; the casts checked once
if abs(float(back[0]) - float(values[0])) > 1e-3:
    raise SystemExit(f"float32 {float(values[0])} came back from float16 as {float(back[0])}")
times = []
start = time.perf_counter()
while time.perf_counter() - start < seconds or len(times) < 5:
    # The result stays in TensorFlow's memory, as a step's does (an eager call on the CPU
    # returns when its ops are done): reading it all into NumPy added 20% at resnet50's
    # bytes and 45% at mlp's to the casts' time (the Zen 3, 2026-12-06).
    began = time.perf_counter()
    both_ways(values)
    times.append(time.perf_counter() - began)
times.sort()
print(times[len(times) // 2] / (4 * int(values.shape[0])) * 1e9)
"""
_STEP_LINE = re.compile(r"^step (\d+)/\d+ .*?([0-9.]+) images/s(?: \(exchange (\d+)%\))?")


def progress_windows(stdout: str) -> list[tuple[int, float, float | None]]:
    """(step, images/s, the exchange's share of the window's step time) of each of a
    ``tfscale.train`` run's progress lines that has a rate (the compiled first step's line has
    none), in order; the share is None on a line without one (one worker, a step XLA compiles
    whole: :mod:`tfscale.exchange.timing`)."""
    return [(int(m.group(1)), float(m.group(2)),
             None if m.group(3) is None else int(m.group(3)) / 100)
            for line in stdout.splitlines()
            if (m := _STEP_LINE.match(line.strip())) and float(m.group(2)) > 0]


def progress_rates(stdout: str) -> list[tuple[int, float]]:
    """(step, images/s) of each of a run's progress lines that has a rate
    (:func:`progress_windows`)."""
    return [(step, rate) for step, rate, _ in progress_windows(stdout)]


def step_cv(stdout: str, batch_size: int, skip: int = 2) -> float | None:
    """Spread of the step times (sd / mean) in a run's ``--log_every=1`` progress lines, the
    first ``skip`` timed steps left out (warm-up); None with fewer than 3 steps left."""
    times = [batch_size / rate for _, rate in progress_rates(stdout)]
    times = times[skip:]
    if len(times) < 3:
        return None
    return statistics.stdev(times) / statistics.mean(times)


def host_time(nbytes: int = 16 * 2**20, seconds: float = 3.0,
              timeout_s: int = 120) -> tuple[float, float]:
    """(idle, busy) host nanoseconds per byte of a two-process all-reduce on one core over
    loopback TCP; busy: with a third process computing on that core."""
    out = _run([sys.executable, "-c", _HOST_TIME, str(nbytes), str(seconds)], timeout_s)
    idle, busy = (float(v) for v in out.split()[-2:])
    return idle, busy


def transport_time(transport: str, nbytes: int = 16 * 2**20, seconds: float = 3.0,
                   timeout_s: int = 300, flat_ring: bool = False,
                   tensors: Sequence[int] = ()) -> float:
    """Idle host nanoseconds per byte of a two-worker all-reduce on one core through
    multiworker's ``transport`` ("ring" or "grpc"): :mod:`tfscale.cli.host_time`, in a
    child process, as :func:`host_time` times raw TCP; with ``flat_ring`` (gRPC), per stack
    byte of the flat ring in its own topology; gRPC's bytes in ``tensors`` where given."""
    out = _run([sys.executable, "-m", "tfscale.cli.host_time", transport, str(nbytes),
                "--seconds", str(seconds), *(["--flat_ring"] if flat_ring else []),
                *(["--tensors", ",".join(map(str, tensors))] if tensors else [])], timeout_s)
    figure = "ns_per_stack_byte" if flat_ring else "ns_per_byte"
    return float(json.loads(out.strip().splitlines()[-1])[figure])


def grpc_time(nbytes: int, seconds: float = 3.0, timeout_s: int = 600,
              tensors: Sequence[int] = ()) -> tuple[float, str]:
    """Idle host nanoseconds per stack byte of gRPC's flat ring, timed in its own topology
    (``python -m tfscale.cli.host_time grpc NBYTES --flat_ring``) where this process may use
    two cores, else per byte between two workers on one core (:func:`transport_time`); with
    the words that say which, for the file's source. ``tensors``, the model's gradients'
    element counts: the ring's call sums them as a step does, packed into one and split after
    (only where they hold all of ``nbytes`` as float32)."""
    nbytes = max(4, nbytes // 4 * 4)
    if len(os.sched_getaffinity(0)) < FLAT_RING_NODES:
        return transport_time("grpc", seconds=seconds), (
            "TensorFlow's gRPC collective between two workers on the idle core (16 MiB; one "
            "core here: not in the flat ring's topology, about 1.5x too high for it)")
    packed = list(tensors) if 4 * sum(tensors) == nbytes else []
    return transport_time("grpc", nbytes, seconds, timeout_s, flat_ring=True,
                          tensors=packed), (
        f"TensorFlow's gRPC collective in its flat ring's topology ({FLAT_RING_NODES} nodes of "
        f"{FLAT_RING_LOCAL} ranks, each node's on one idle core, at the model's {nbytes} "
        + (f"gradient bytes in its {len(packed)} tensors, packed and split as a step's"
           if packed else "gradient bytes as one tensor")
        + "; per byte through the network stack)")


def cast_time(nbytes: int, seconds: float = 2.0, timeout_s: int = 120) -> float:
    """Nanoseconds per float32 byte of casting ``nbytes`` of float32 to float16 and back in a
    ``tf.function`` (the median call; the result left in TensorFlow's memory, as a training
    step leaves its gradients)."""
    out = _run([sys.executable, "-c", _CAST_TIME, str(nbytes), str(seconds)], timeout_s)
    return float(out.split()[-1])


def _run(command: Sequence[str], timeout_s: int) -> str:
    proc = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"calibration step failed (exit {proc.returncode}): "
                           f"{' '.join(command)}\n{tail}")
    return proc.stdout


def _train(flags: Sequence[str], model_dir: Path, timeout_s: int) -> tuple[dict[str, Any], str]:
    out = _run([sys.executable, "-m", "tfscale.train", *flags, f"--model_dir={model_dir}"],
               timeout_s)
    return json.loads((model_dir / "results.json").read_text()), out


def _dataset(flags: Sequence[str]) -> str | None:
    """The last ``--dataset`` among ``flags`` (absl lets the last one win)."""
    found = None
    for i, flag in enumerate(flags):
        if flag.startswith("--dataset="):
            found = flag.split("=", 1)[1]
        elif flag == "--dataset" and i + 1 < len(flags):
            found = flags[i + 1]
    return found


def cpu_name() -> str:
    """The CPU's model name (figures differ between machines of the same kind)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(model: str, batch_size: int, precision: str, steps: int,
            train_flags: Sequence[str] = (), timeout_s: int = 900,
            seconds: float = 3.0) -> dict[str, Any]:
    """Runs the calibration children, each exchange timing for ``seconds`` (the cast for at
    most 2); returns the model's machine-file entry.

    Raises:
        ValueError: for ``--precision=auto`` (the file must say which precision it measured).
        RuntimeError: when a child fails, with its last lines.
    """
    if precision == "auto":
        raise ValueError("--calibrate needs an explicit --precision (fp32, mixed_float16, "
                         "mixed_bfloat16): the machine file records the rate per precision")
    common = [f"--model={model}", f"--batch_size={batch_size}", f"--precision={precision}",
              f"--steps={steps}", "--epochs=1", "--num_processes=1", *train_flags]
    with tempfile.TemporaryDirectory(prefix="tfscale-calibrate-") as tmp:
        compute, log = _train([*common, f"--dataset={SYNTHETIC}", "--log_every=1"],
                              Path(tmp) / "compute", timeout_s)
        saved = Path(tmp) / "compute" / "model.keras"
        counted = _run([sys.executable, "-c", _COUNT_GRADIENT_BYTES, str(saved)],
                       timeout_s).strip().splitlines()
        tensors, gradient_bytes = json.loads(counted[-2]), int(counted[-1])
        dataset = _dataset(train_flags)
        pipeline = None
        if dataset not in (None, SYNTHETIC):
            pipeline = _train(common, Path(tmp) / "pipeline", timeout_s)[0]["images_per_sec"]
    idle_ns, busy_ns = host_time(seconds=seconds)
    grpc_ns, grpc_how = grpc_time(gradient_bytes, seconds, tensors=tensors)
    by_transport = {"ring": transport_time("ring", seconds=seconds), "grpc": grpc_ns}
    cast_ns = cast_time(gradient_bytes, min(seconds, 2.0))
    spread = step_cv(log, batch_size)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "gradient_bytes": gradient_bytes, "batch_size": batch_size, "measured_ranks": 1,
        "images_per_sec": {precision: compute["images_per_sec"]},
        "step_ms": {precision: compute["step_time_ms"]},
        "backward_fraction": 2 / 3, "pipeline_images_per_sec": pipeline,
        "source": (f"tfscale.forecast --calibrate, {when}, on {platform.node()} ({cpu_name()}): "
                   f"{steps} steps of python -m tfscale.train {' '.join(common)} "
                   f"--dataset={SYNTHETIC} (one process; the first step is not timed); "
                   "gradient_bytes counted from the saved model's trainable weights; "
                   + ("pipeline_images_per_sec: the same run on --dataset="
                      f"{dataset}, a lower bound of the pipeline's rate; " if pipeline else "")
                   + "backward_fraction assumed 2/3 (backward ~ twice the forward)"),
        "host": {"host_ns_per_byte": busy_ns, "idle_ns_per_byte": idle_ns,
                 "idle_ns_per_byte_by_transport": by_transport, "cast_ns_per_byte": cast_ns,
                 "source": (f"tfscale.forecast --calibrate, {when}, on {platform.node()} "
                            f"({cpu_name()}), each exchange timed for {seconds:g} "
                            "s: an all-reduce of 16 MiB between two processes on one core "
                            "over loopback TCP with a third computing on that core "
                            f"(busy): {busy_ns:.2f} ns per byte; the core otherwise idle: "
                            f"{idle_ns:.2f} ns per byte; (python -m tfscale.cli.host_time) "
                            "the same all-reduce on the idle core through tfscale's ring: "
                            f"{by_transport['ring']:.2f} ns per byte; {grpc_how}: "
                            f"{by_transport['grpc']:.2f} ns; casting {model}'s "
                            f"{gradient_bytes} gradient bytes to float16 and back in a "
                            f"tf.function: {cast_ns:.3f} ns per float32 byte")},
        "stragglers": None if spread is None else {
            "step_cv": spread,
            "source": (f"tfscale.forecast --calibrate, {when}, on {platform.node()}: sd / mean "
                       f"of the step times of the {steps}-step compute run (first 2 timed "
                       "steps left out)")},
    }


def write(base: str, out: Path, model: str, entry: dict[str, Any]) -> machines.Machine:
    """Adds (or replaces) ``model``'s entry in a copy of machine ``base`` written to ``out``,
    keeping the rates measured before at other precisions; the node's host time and step
    spread (``entry``'s ``host`` and ``stragglers``) go into the file's ``exchange`` and
    ``stragglers`` sections. Validates the result."""
    def change(doc: dict[str, Any]) -> None:
        model_entry = dict(entry)
        host, stragglers = model_entry.pop("host", None), model_entry.pop("stragglers", None)
        old = doc.setdefault("models", {}).get(model, {})
        if old.get("batch_size") == model_entry["batch_size"]:
            model_entry["images_per_sec"] = {**old.get("images_per_sec", {}),
                                             **model_entry["images_per_sec"]}
            model_entry["step_ms"] = {**old.get("step_ms", {}), **model_entry["step_ms"]}
        doc["models"][model] = model_entry
        if host:
            exchange = doc.setdefault("exchange", {"overlap": False})
            exchange.update(host_ns_per_byte=host["host_ns_per_byte"],
                            idle_ns_per_byte=host["idle_ns_per_byte"],
                            idle_ns_per_byte_by_transport=host["idle_ns_per_byte_by_transport"],
                            cast_ns_per_byte=host["cast_ns_per_byte"],
                            host_source=host["source"])
            exchange.setdefault("source", host["source"])
        if stragglers:
            doc["stragglers"] = stragglers

    return _edit(base, out, change)


def write_calls(base: str, out: Path, calls: dict[str, dict[str, Any]]) -> machines.Machine:
    """Adds each of ``calls`` (``{"flat_calls": entry, "hierarchical_calls": entry}``, each
    entry one shape's: nodes, ranks_per_node, busbw_GBps, source) to the file's
    ``inter_node`` list of that name, in a copy of machine ``base`` written to ``out``; an
    entry of the same shape is replaced, the others kept. Validates the result."""
    def change(doc: dict[str, Any]) -> None:
        inter = doc.setdefault("inter_node", {})
        for key, entry in calls.items():
            shape = (entry["nodes"], entry["ranks_per_node"])
            kept = [e for e in inter.get(key, [])
                    if not isinstance(e, dict) or (e.get("nodes"), e.get("ranks_per_node"))
                    != shape]
            inter[key] = [*kept, entry]

    return _edit(base, out, change)


def _edit(base: str, out: Path, change: Callable[[dict[str, Any]], None]) -> machines.Machine:
    """``change`` applied to ``out``'s machine where it exists, else to ``base``'s, validated,
    then written to ``out`` whole (never half a file)."""
    source = machines.resolve(str(out)) if out.exists() else machines.resolve(base)
    doc = json.loads(source.read_text())
    change(doc)
    machines.parse(doc, out)
    write_json_atomic(out, doc)
    return machines.load(str(out))
