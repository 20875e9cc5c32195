"""The training driver: config + strategy -> data, model, ``model.fit`` -> results.

Steps are counted by the optimizer's ``iterations``, which is checkpointed, so a run restarted
with the same ``model_dir`` continues at the step it reached. Keras counts in epochs, so the
remaining steps are split into ``fit`` calls (:func:`plan_segments`): a partial epoch first
when resuming mid-epoch, then whole epochs.

Evaluation is not Keras' ``validation_data``: the :class:`~tfscale.callbacks.Evaluation`
callback runs :class:`~tfscale.training.evaluation.Evaluator` (exact, over the whole validation
split of
all workers) every ``--eval_every`` steps and at each epoch end, before the callbacks that read
the epoch logs. The chief appends the run's milestones to ``model_dir/events.jsonl``
(:mod:`tfscale.training.events`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras

from tfscale import callbacks as cbs
from tfscale.cluster import environment as cluster_env
from tfscale.cluster import rank_zero
from tfscale.config import targets
from tfscale.config.errors import EXIT_NON_FINITE, EXIT_PREEMPTED, TrainingStopped
from tfscale.config.train_config import TrainConfig
from tfscale.exchange import timing
from tfscale.exchange.optimizer import lag_slots
from tfscale.strategies import Strategy, create, running
from tfscale.training import bn_statistics, features, model_dir_lock, results
from tfscale.training import resume as config_change
from tfscale.training.checkpointing import CheckpointManager
from tfscale.training.evaluation import EvaluationSummaries, Evaluator
from tfscale.training.events import EventLog
from tfscale.training.export import EXPORT, export_inference, plain_copy
from tfscale.training.files import write_json_atomic
from tfscale.training.losses import build_loss
from tfscale.training.metrics import build_metrics
from tfscale.training.optimizers import build_optimizer, exclude_bias_bn_from_decay
from tfscale.training.parts import Batches, Parts
from tfscale.training.runtime import configure_runtime, resolve_precision


@dataclasses.dataclass(frozen=True)
class Segment:
    """One ``model.fit`` call: epochs ``[initial_epoch, epochs)`` of ``steps_per_epoch`` steps,
    starting at global step ``first_step``."""

    initial_epoch: int
    epochs: int
    steps_per_epoch: int
    first_step: int


def plan_segments(start: int, total: int, steps_per_epoch: int) -> list[Segment]:
    """Splits steps ``[start, total)`` into fit calls of uniform epoch length.

    Epoch ``e`` covers steps ``[e*spe, min((e+1)*spe, total))``; consecutive epochs of equal
    length share one call.
    """
    segments: list[Segment] = []
    step = start
    while step < total:
        epoch = step // steps_per_epoch
        length = min((epoch + 1) * steps_per_epoch, total) - step
        last = segments[-1] if segments else None
        if (last and last.steps_per_epoch == length and step % steps_per_epoch == 0
                and last.first_step % steps_per_epoch == 0):
            segments[-1] = dataclasses.replace(last, epochs=epoch + 1)
        else:
            segments.append(Segment(epoch, epoch + 1, length, step))
        step += length
    return segments


def run(config: TrainConfig, parts: Parts) -> dict[str, Any]:
    """Trains ``parts`` (the model and data the command chose, :mod:`tfscale.training.parts`)
    as ``config`` says under its strategy and returns the results dict.

    Raises:
        TrainingStopped: on a non-finite loss or preemption (with the exit code to use).
        ValueError: for bad data or checkpoints found while setting up.
    """
    given, config = config, resolve_precision(config)
    configure_runtime(config)
    with running(create(config)) as strategy:
        rank_zero.set_rank(strategy.rank)
        trainer = Trainer(config, strategy, parts)
        if config.eval_only:
            return trainer.evaluate_only()
        with claim_model_dir(given, strategy):
            return trainer.train()


@contextlib.contextmanager
def claim_model_dir(config: TrainConfig, strategy: Strategy) -> Iterator[None]:
    """Holds ``config.model_dir``'s lock (:mod:`tfscale.training.model_dir_lock`) while the run
    writes
    there, and saves the configuration it trains with (:mod:`tfscale.training.resume`). The chief
    does both; every worker learns whether it could, so that all stop together if not.

    Raises:
        ValueError: another run holds the model_dir (on the chief, naming it).
    """
    lock, error = None, ""
    if strategy.is_chief:
        try:
            lock = model_dir_lock.acquire(config.model_dir)
            config_change.save(config)
        except ValueError as err:
            error = str(err)
    if strategy.size > 1 and not strategy.broadcast([0.0 if error else 1.0])[0]:
        error = error or "the chief could not take --model_dir (see its error)"
    if error:
        raise ValueError(error)
    try:
        yield
    finally:
        if lock is not None:
            model_dir_lock.release(lock)


class Trainer:
    """One training run of ``config`` under an already set-up ``strategy``."""

    def __init__(self, config: TrainConfig, strategy: Strategy, parts: Parts) -> None:
        self.config = config
        self.strategy = strategy
        self.parts = parts
        self.model_dir = Path(config.model_dir)
        # Examples per optimizer step: with --grad_accum_steps K, each step is K micro-batches.
        self.global_batch = config.batch_size * strategy.num_replicas * config.grad_accum_steps
        self.task = parts.task
        self.has_validation = parts.has_validation
        self.target = targets.check_evaluation(config, self.task, self.has_validation)
        self.events = EventLog(self.model_dir / "events.jsonl")

    def _process_batch(self, split: str) -> int:
        """Examples this process reads per step: a training step takes all its micro-batches
        at once (:func:`~tfscale.training.optimizers.accumulate_gradients` splits them)."""
        micro_batches = self.config.grad_accum_steps if split == "train" else 1
        return self.config.batch_size * self.strategy.replicas_in_process * micro_batches

    def _data(self, split: str) -> Batches:
        return self.parts.data(self.config, self.strategy.shard(), split,
                               self._process_batch(split))

    def _evaluator(self) -> Evaluator | None:
        """The evaluation of this run, or None when it has no validation data."""
        cfg = self.config
        if not targets.evaluation_enabled(cfg, self.has_validation):
            return None
        validation = self._data("validation")
        if validation.examples is None and not cfg.validation_steps:
            raise ValueError(f"--dataset={cfg.dataset} has unbounded validation data; give "
                             "--validation_steps > 0 to evaluate on that many batches")
        return Evaluator(validation.dataset, cfg.validation_steps, build_loss(cfg, self.task),
                         self.task, cfg.num_classes, self.strategy)

    def _total_steps(self, train: Batches) -> tuple[int, int]:
        """The run's last step and its steps per epoch.

        An epoch is as many steps as the worker with the fewest examples has whole batches
        (shards of files or records may be uneven): every worker takes the same number of
        steps, or the collectives of the longer ones would wait forever.
        """
        cfg = self.config
        if cfg.steps:
            total = cfg.steps
        else:
            per_process = self._process_batch("train")
            own = train.examples // per_process if train.examples else 0
            fewest, most = self.strategy.all_reduce([float(own), -float(own)], "min")
            batches = int(fewest)
            if batches < 1:
                raise ValueError(f"--steps=0 (one pass over the data per epoch) needs at least "
                                 f"one batch of {per_process} examples on every worker; "
                                 f"--dataset={cfg.dataset} gives {train.examples} examples "
                                 f"to this worker{'' if own < 1 else ' and fewer to another'}"
                                 "; give --steps, a smaller --batch_size, or more data")
            if batches != -int(most):
                rank_zero.log(f"workers hold uneven shares of --dataset={cfg.dataset} "
                              f"({batches} to {-int(most)} batches): an epoch is {batches} "
                              "steps, as many as every worker has")
            total = cfg.epochs * batches
        return total, math.ceil(total / cfg.epochs)

    def _build(self, total_steps: int) -> keras.Model:
        """The compiled model of the run, its features applied by
        :func:`tfscale.training.features.apply` (the one path for the CLI and users'
        ``tfscale.prepare``, which owns their order)."""
        cfg = self.config
        keras.utils.set_random_seed(cfg.seed)
        # The exchange's share of each step, for the progress lines and TensorBoard: with
        # several workers, where the step's graph can hold the timestamps (not one that XLA
        # compiles whole, nor a deterministic one: TensorFlow refuses timestamps there).
        timing.enable(self.strategy.size > 1 and self.strategy.jit_compiles != "step"
                      and not cfg.deterministic)
        with self.strategy.scope():
            model = self.parts.model(cfg)
            optimizer = build_optimizer(cfg, self.strategy.num_replicas, total_steps)
            if cfg.exclude_bias_bn_decay and cfg.weight_decay:
                count = exclude_bias_bn_from_decay(optimizer, model.trainable_variables)
                rank_zero.log(f"--exclude_bias_bn_decay: no weight decay on {count} bias and "
                              "batch-norm variables")
        prepared = features.apply(model, optimizer, cfg, self.strategy,
                                  self.parts.block_rule() if cfg.recompute else None)
        with self.strategy.scope():
            model.compile(optimizer=prepared, loss=build_loss(cfg, self.task),
                          metrics=build_metrics(cfg, self.task),
                          jit_compile=self.strategy.jit_compiles == "step")
        return model

    def _callbacks(self, manager: CheckpointManager, total: int, steps_per_epoch: int,
                   evaluator: Evaluator | None, start_time: float) -> dict[str, Any]:
        cfg = self.config
        meter = cbs.ThroughputMeter(self.global_batch)
        chief_tensorboard = cfg.tensorboard and self.strategy.is_chief
        # Every worker averages its window's loss with the others' at each progress line, so
        # that the lines and the summary's final loss are the mean over the workers.
        progress = cbs.ProgressLogger(
            total, cfg.log_every, self.global_batch, steps_per_epoch,
            average=self.strategy.all_reduce if self.strategy.size > 1 else None,
            listeners=[cbs.StepSummaries(self.model_dir / "tensorboard" / "steps")]
            if chief_tensorboard else [])
        # The workers agree to stop (or not) at least at every checkpoint and evaluation step.
        named: dict[str, Any] = {"guard": cbs.TrainingGuard(
            self.strategy, periods=(cfg.checkpoint_every, cfg.eval_every))}
        # Evaluation and the target check come after the guard (no evaluation of a stopped
        # step) and before the callbacks that read the epoch logs.
        if evaluator is not None:
            evaluation = cbs.Evaluation(self._evaluate(evaluator), cfg.eval_every,
                                        steps_per_epoch,
                                        start_time, [self._log_evaluation])
            # Throughput is of training: evaluations between steps are not counted.
            evaluation.listeners.append(lambda _: meter.exclude(evaluation.last_duration))
            evaluation.listeners.append(lambda _: progress.exclude(evaluation.last_duration))
            if chief_tensorboard:
                evaluation.listeners.append(
                    EvaluationSummaries(self.model_dir / "tensorboard" / "evaluation"))
            named["evaluation"] = evaluation
        if self.target is not None:
            named["target"] = cbs.TargetStop(
                self.target, self.strategy, start_time,
                [lambda result: self.events.emit("target_reached", **result)])
            if evaluator is not None:
                named["evaluation"].listeners.append(named["target"].check_record)
        named["events"] = cbs.EpochEvents(self.events)
        named["checkpoint"] = cbs.Checkpoint(manager, cfg.checkpoint_every,
                                             {"global_batch_size": self.global_batch})
        named["progress"] = progress
        profile = cfg.profile_range
        if profile and self.strategy.is_chief:
            named["profile"] = cbs.ProfileSteps(*profile, str(self.model_dir / "tensorboard"))
        if chief_tensorboard:
            named["tensorboard"] = cbs.EpochTensorBoard(str(self.model_dir / "tensorboard"),
                                                        write_graph=False)
        if cfg.collective_timeout_s:
            named["watchdog"] = cbs.StepWatchdog(cfg.collective_timeout_s)
        # Last, so that each measured step includes the other callbacks' work.
        named["meter"] = meter
        return named

    def _statistics(self, model: keras.Model, train: Batches
                    ) -> bn_statistics.Statistics:
        """The run's batch-norm statistics (``--bn_statistics``), from the training batches."""
        cfg, strategy = self.config, self.strategy
        mode = bn_statistics.resolve_mode(cfg.bn_statistics,
                                          self.parts.reads_data)
        recomputer = bn_statistics.Recomputer(
            model, lambda values: strategy.all_reduce(values, "sum"), cfg.batch_size,
            strategy.replicas_in_process, strategy.num_replicas,
            getattr(strategy, "tf_strategy", None))
        if recomputer.layers:
            how = (f"recomputed over {cfg.bn_statistics_images} training images before each "
                   "evaluation and at the end" if mode == "precise" else
                   "Keras' moving averages" + (", pooled over the workers before each "
                                               "evaluation and at the end"
                                               if strategy.size > 1 else ""))
            rank_zero.log(f"--bn_statistics={cfg.bn_statistics}: {len(recomputer.layers)} "
                          f"batch-norm layers; their statistics are {how}")
        return bn_statistics.Statistics(
            mode, recomputer, lambda: iter(train.dataset), cfg.bn_statistics_images,
            strategy.size, lambda: cbs.optimizer_step(model), rank_zero.log)

    def _evaluate(self, evaluator: Evaluator) -> Any:
        """The evaluation, on statistics brought up to date for the step first."""

        def evaluate(model: keras.Model) -> tuple[dict[str, float], int]:
            self.statistics.refresh()
            return evaluator.evaluate(model)

        return evaluate

    def _log_evaluation(self, record: dict[str, Any]) -> None:
        self.events.emit("eval", **record)
        shown = "  ".join(f"{k} {v:.4g}" for k, v in sorted(record["metrics"].items()))
        rank_zero.log(f"evaluation at step {record['step']} ({record['examples']} examples): "
                      f"{shown}")

    def train(self) -> dict[str, Any]:
        """Runs the remaining steps and returns (and, on the chief, writes) the results."""
        cfg, strategy = self.config, self.strategy
        train = self._data("train")
        evaluator = self._evaluator()
        total, steps_per_epoch = self._total_steps(train)
        model = self._build(total)
        self.statistics = self._statistics(model, train)
        variables = list(model.weights) + list(model.optimizer.variables)
        manager = CheckpointManager(self.model_dir / "checkpoints", cfg.keep_checkpoints)
        pending = lag_slots(model.optimizer)
        restored = manager.restore(variables, optional=pending)
        if restored and pending and not restored["restored_optional"]:
            rank_zero.log(f"warning: checkpoint of step {restored['step']} holds no pending "
                          "gradients of --gradient_lag (written without the lag): the first "
                          "step after resuming applies none")
        if restored:
            self._resume_global_batch(model, manager, restored, pending)
        start = int(strategy.broadcast([float(cbs.optimizer_step(model))])[0])
        if start >= total:
            rank_zero.log(f"{self.model_dir} is already trained to step {start} of {total}; "
                          "nothing to do (raise --steps to train further)")
            return results.read_results(self.model_dir) or {}
        micro = (f" x {cfg.grad_accum_steps} micro-batches per step"
                 if cfg.grad_accum_steps > 1 else "")
        rank_zero.log(f"--model={cfg.model} on --dataset={cfg.dataset}; "
                      f"{strategy.describe()}; global batch {self.global_batch} "
                      f"({cfg.batch_size} per replica{micro}); steps {start}->{total}; "
                      f"model_dir {self.model_dir}")
        start_time = time.time()
        self.events.emit("run_start", model=cfg.model, dataset=cfg.dataset,
                         strategy=cfg.strategy, num_workers=strategy.size,
                         global_batch_size=self.global_batch, first_step=start,
                         total_steps=total, evaluation=evaluator is not None,
                         target_metric=cfg.target_metric, restart=cluster_env.restart_count())
        named = self._callbacks(manager, total, steps_per_epoch, evaluator, start_time)
        status = "failed"
        try:
            logs = self._fit(model, named, train, start, total, steps_per_epoch)
            train_seconds = time.time() - start_time
            # The checkpoint, results and saved model hold the statistics of the last weights.
            self.statistics.refresh()
            named["checkpoint"].save(logs)
            out = self._finish(model, named, start, logs, train_seconds)
            status = "target_reached" if out.get("target", {}).get("reached") else "success"
            return out
        except TrainingStopped as err:
            status = {EXIT_NON_FINITE: "non_finite", EXIT_PREEMPTED: "preempted"}.get(
                err.exit_code, "failed")
            raise
        finally:
            self.events.emit("run_stop", status=status,
                             step=cbs.optimizer_step(model))

    def _resume_global_batch(self, model: keras.Model, manager: CheckpointManager,
                             restored: dict[str, Any], pending: list[Any]) -> None:
        """Resumes a checkpoint whose steps were of another global batch (another worker
        count, batch per replica or number of micro-batches) counting images, not steps.

        Without ``--allow_config_change`` that stops the run: the global batch is what is
        trained. With it, the step counter becomes the step of this run's global batch at
        which as many images were trained (so epochs, the learning-rate schedule and the
        step budget go on from the same share of the run), the chief moves the checkpoints
        counted in the old steps into ``checkpoints/global-batch-<old>/`` (nothing is
        deleted) and saves the resumed state as the checkpoint of the new step.

        Raises:
            ValueError: on every worker (each read the same checkpoint), naming the global
                batches and a ``--batch_size`` that keeps the checkpoint's.
        """
        cfg, step = self.config, int(restored["step"])
        old = int(restored.get("global_batch_size") or self.global_batch)
        if old == self.global_batch:
            return
        per_replica = self.global_batch // cfg.batch_size
        same = old // per_replica if old % per_replica == 0 else 0
        if not cfg.allow_config_change:
            keep = (f"give --batch_size={same} to keep it with these workers, " if same else "")
            raise ValueError(
                f"{self.model_dir}'s checkpoint of step {step} was trained at a global batch "
                f"of {old}; this run's would be {self.global_batch} ({cfg.batch_size} per "
                f"replica x {self.strategy.num_replicas} replicas x {cfg.grad_accum_steps} "
                f"micro-batches): {keep}or add --allow_config_change to go on at "
                f"{self.global_batch}, counting epochs in images")
        images = step * old
        new_step = round(images / self.global_batch)
        model.optimizer.iterations.assign(new_step)
        rank_zero.log(f"--allow_config_change: the global batch changes from {old} to "
                      f"{self.global_batch}: step {step} ({images} images) goes on as step "
                      f"{new_step} of {self.global_batch}")
        if self.strategy.is_chief:
            moved = manager.directory / f"global-batch-{old}"
            moved.mkdir(exist_ok=True)
            for kept in manager.steps():
                os.replace(manager.path(kept), moved / manager.path(kept).name)
            manager.save(new_step, list(model.weights) + list(model.optimizer.variables),
                         {"global_batch_size": self.global_batch}, optional=pending)

    def _fit(self, model: keras.Model, named: dict[str, Any], train: Batches,
             start: int, total: int, steps_per_epoch: int) -> dict[str, Any]:
        """The ``fit`` calls of steps ``[start, total)``; returns the last epoch's logs.

        Raises:
            TrainingStopped: when the guard stopped training.
        """
        cfg, strategy = self.config, self.strategy
        callback_list = strategy.callbacks() + list(named.values())
        logs: dict[str, Any] = {}
        for segment in plan_segments(start, total, steps_per_epoch):
            dataset = train.dataset
            if cfg.deterministic and segment.first_step:
                dataset = dataset.skip(segment.first_step)
            history = model.fit(
                strategy.distribute_dataset(dataset), initial_epoch=segment.initial_epoch,
                epochs=segment.epochs, steps_per_epoch=segment.steps_per_epoch,
                callbacks=callback_list, verbose=0, shuffle=False)
            logs = {k: v[-1] for k, v in history.history.items() if v}
            if named["guard"].reason or ("target" in named and named["target"].result):
                break
        self._stop_if_guarded(named, logs)
        return logs

    def _stop_if_guarded(self, named: dict[str, Any], logs: dict[str, Any]) -> None:
        guard = named["guard"]
        if guard.reason == "non-finite":
            kept = named["checkpoint"].manager.steps()
            raise TrainingStopped(
                f"loss became NaN/Inf at step {guard.step}; stopped without saving it. "
                f"Last good checkpoint: step {kept[0] if kept else 'none'} in "
                f"{named['checkpoint'].manager.directory}", EXIT_NON_FINITE)
        if guard.reason == "preempted":
            named["checkpoint"].save(logs)
            raise TrainingStopped(
                f"preempted by a signal at step {guard.step}; checkpoint written, run the same "
                "command to resume", EXIT_PREEMPTED)

    def _finish(self, model: keras.Model, named: dict[str, Any], start: int,
                logs: dict[str, Any], train_seconds: float) -> dict[str, Any]:
        cfg, strategy, meter = self.config, self.strategy, named["meter"]
        # The loss of the last logged window, or of the epoch when training stopped before
        # the first log line (a target reached early).
        window = named["progress"].window_loss
        last = window if math.isfinite(window) else float(logs.get("loss", math.nan))
        final_loss = float(strategy.all_reduce([last])[0])
        step = cbs.optimizer_step(model)
        out = {
            "model": cfg.model, "dataset": cfg.dataset, "strategy": cfg.strategy,
            "num_workers": strategy.size, "replicas_per_worker": strategy.replicas_in_process,
            # Where each worker ran, and what carried its gradients inside and across nodes.
            "hosts": strategy.hosts(), "exchange": strategy.exchange(),
            "global_batch_size": self.global_batch, "grad_accum_steps": cfg.grad_accum_steps,
            "steps": step,
            "steps_this_run": step - start, "images_per_sec": meter.images_per_sec,
            "images_per_sec_per_worker": meter.images_per_sec / strategy.size,
            "step_time_ms": meter.step_time_ms, "final_loss": final_loss,
            "metrics": {k: float(v) for k, v in logs.items()}, "config": cfg.to_dict(),
            "train_seconds": train_seconds,
            # Times the job was started again (--max_restarts, a Slurm requeue) before
            # this attempt finished it.
            "restarts": cluster_env.restart_count(),
            "evaluations": named["evaluation"].records if "evaluation" in named else [],
        }
        if self.target is not None:
            not_reached = {"metric": self.target.metric, "value": self.target.value,
                           "direction": self.target.direction, "achieved": None, "step": None,
                           "epoch": None, "seconds": None}
            reached = named["target"].result
            out["target"] = {**(reached or not_reached), "reached": reached is not None}
        if strategy.is_chief:
            save_model(model, self.model_dir, cfg, self.parts)
        results.publish(out, str(self.model_dir))
        return out


    def evaluate_only(self) -> dict[str, Any]:
        """Evaluates the newest checkpoint in ``model_dir``; the chief writes eval.json.

        Raises:
            ValueError: when ``model_dir`` holds no checkpoint.
        """
        cfg = self.config
        manager = CheckpointManager(self.model_dir / "checkpoints", cfg.keep_checkpoints)
        if not manager.steps():
            raise ValueError(f"--eval_only: no checkpoint in --model_dir={self.model_dir} "
                             f"(looked in {manager.directory}); train into it first")
        evaluator = self._evaluator()
        if evaluator is None:  # excluded by check_evaluation; kept for direct callers
            raise ValueError("--eval_only needs validation data")
        # Nothing is trained; the schedule needs a length past its warmup to be built.
        model = self._build(max(cfg.steps, cfg.warmup_steps + 1))
        meta = manager.restore(list(model.weights) + list(model.optimizer.variables)) or {}
        metrics, examples = evaluator.evaluate(model)
        out = {"model": cfg.model, "dataset": cfg.dataset, "strategy": cfg.strategy,
               "num_workers": self.strategy.size, "step": int(meta.get("step", 0)),
               "examples": examples, "metrics": metrics, "config": cfg.to_dict()}
        shown = "  ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()))
        rank_zero.log(f"evaluation of step {out['step']} ({examples} examples): {shown}")
        if self.strategy.is_chief:
            write_json_atomic(self.model_dir / "eval.json", out)
            # The evaluated model, as a training run ends: model.keras and, on real data,
            # the model for inference.
            save_model(model, self.model_dir, cfg, self.parts)
        return out


def save_model(model: keras.Model, model_dir: Path, config: TrainConfig, parts: Parts) -> None:
    """Saves ``model_dir/model.keras`` (the model's architecture and weights, uncompiled, see
    :func:`~tfscale.training.export.plain_copy`) and, when the dataset declares how evaluation
    preprocesses a raw input (``parts.inference``), ``model_dir/export/``, the model for
    inference that takes raw images (:mod:`tfscale.training.export`); each atomically
    (temporary name, then rename).
    """
    plain = plain_copy(model)
    path = model_dir / "model.keras"
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        plain.save(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    inference = parts.inference(config)
    if inference is None:
        if parts.reads_data:
            rank_zero.log(f"no model exported for inference: --dataset={config.dataset} "
                          "declares no preprocessing of raw inputs")
        return
    info = {"model": config.model, "dataset": config.dataset, "data_dir": config.data_dir,
            "task": inference.task, "step": cbs.optimizer_step(model),
            "image_size": inference.image_size, "classes": inference.classes,
            "classes_from": inference.classes_from, "num_classes": config.num_classes,
            "preprocessing": inference.description}
    seconds = export_inference(plain, model_dir / EXPORT, inference.preprocess, inference.dtype,
                               inference.channels, info)
    rank_zero.log(f"exported for inference in {seconds:.1f} s: {model_dir / EXPORT} (predict "
                  f"with: python -m tfscale.predict --model_dir={model_dir} IMAGE...)")
