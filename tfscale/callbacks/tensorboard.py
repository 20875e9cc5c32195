"""Keras' TensorBoard callback without its per-batch work when it writes per epoch.

At ``update_freq="epoch"`` (what ``tfscale.train`` uses) Keras 3's callback still calls
``tf.summary.scalar`` for every entry of the logs at the end of every batch, each a tensor made
and dropped because no writer records it: 0.3 ms a step on the chief of a 2-worker ``mlp`` run
on this project's Xeon, which the other workers then wait for at the next exchange (profiled
with py-spy). :class:`EpochTensorBoard` skips that hook unless something needs it (per-batch
summaries, or Keras' own profiling of a batch range); what it writes is unchanged.
"""

from __future__ import annotations

from typing import Any

import keras


class EpochTensorBoard(keras.callbacks.TensorBoard):  # type: ignore[misc]
    """``keras.callbacks.TensorBoard``, with the end-of-batch hook run only where it writes or
    profiles."""

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.update_freq != "epoch" or self.write_steps_per_second or self._should_trace:
            super().on_train_batch_end(batch, logs)
