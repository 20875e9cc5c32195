"""``tfscale.train`` that also writes when each step's windows begin, for bench.step_windows.

    python -m bench.step_windows_train --stamps_dir=DIR [tfscale.train's flags]

Each rank appends one line per training step to ``DIR/HOST_PID.txt``: four times in
microseconds since the epoch, taken in the step's graph by ``tf.timestamp``: the step's start
(before its forward pass reads the batch), the moment its last gradient exists and the moment
its last reduced gradient exists (the two stamps of :mod:`tfscale.exchange.timing`'s clock, so
only where that clock runs: with several workers), and the end of its update (after every
trainable variable is written). A step without the exchange clock writes its start and end
only. The stamps cost the step one small print to a file; the windows between them are what
bench.step_windows sets the scheduler's trace against.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

FLAG = "--stamps_dir="


def install(directory: Path) -> None:
    """Makes every Keras training step traced from now on write its stamps under
    ``directory``, and the exchange clock keep its two stamps for it."""
    import tensorflow as tf
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    from tfscale.exchange import timing

    traced: list[tuple[str, Any]] = []  # the stamps of the step being traced
    clock_start, clock_stop, clock_add = timing.start, timing.stop, timing.CLOCK.add

    def start(tensors: list[Any]) -> Any:
        started = clock_start(tensors)
        if started is not None:
            traced.append(("start", started))
        return started

    def stop(started: Any, tensors: list[Any]) -> None:
        def add(seconds: Any) -> Any:  # the clock's own stop takes the stamp: keep it too
            traced.append(("stop", started + seconds))
            return clock_add(seconds)

        timing.CLOCK.add = add  # type: ignore[method-assign]
        try:
            clock_stop(started, tensors)
        finally:
            del timing.CLOCK.add  # the class's method again

    timing.start, timing.stop = start, stop
    keras_step = TensorFlowTrainer.train_step
    path = directory / f"{socket.gethostname()}_{os.getpid()}.txt"

    def micros(stamp: Any) -> Any:
        return tf.cast(stamp * 1e6, tf.int64)  # float64 seconds print with too few digits

    def train_step(self: Any, data: Any) -> Any:
        traced.clear()
        began = tf.timestamp()
        with tf.control_dependencies([began]):
            data = tf.nest.map_structure(tf.identity, data)
        logs = keras_step(self, data)
        # A read of a variable follows its update in the graph (same resource), so the end
        # stamp waits for every update.
        with tf.control_dependencies([tf.identity(v.value) for v in self.trainable_variables]):
            ended = tf.timestamp()
        exchange = ([micros(t) for kind, t in traced if kind == "start"][:1]
                    + [micros(t) for kind, t in traced if kind == "stop"][-1:])
        printed = tf.print(micros(began), *exchange, micros(ended),
                           output_stream=f"file://{path}")
        with tf.control_dependencies([printed]):
            return tf.nest.map_structure(tf.identity, logs)

    TensorFlowTrainer.train_step = train_step


def main() -> None:
    """Takes ``--stamps_dir`` off the command line and runs ``tfscale.train`` with the rest."""
    given = [arg for arg in sys.argv[1:] if arg.startswith(FLAG)]
    if not given:
        sys.exit(f"usage: python -m bench.step_windows_train {FLAG}DIR [tfscale.train flags]")
    directory = Path(given[-1][len(FLAG):])
    directory.mkdir(parents=True, exist_ok=True)
    sys.argv = [sys.argv[0], *(arg for arg in sys.argv[1:] if not arg.startswith(FLAG))]
    from tfscale.cli import train

    tfscale_main = train.main

    def main_with_stamps(argv: list[str]) -> int:
        install(directory)  # after tfscale.train's flags, before its first step is traced
        return tfscale_main(argv)

    train.main = main_with_stamps  # entry() hands app.run the module's main
    train.entry()


if __name__ == "__main__":
    main()
