"""Where the time goes in I/O: does storage, the input pipeline or the model limit training?

    python -m input_pipelines.tools.io_check --dataset=lmdb --data_dir=/data/pets-lmdb \\
        --image_size=224 --batch_size=32 [--workers=2] [--seconds=5] \\
        [--model=resnet50 | --model_images_per_sec=2.3] [--json=out.json] [any train flag]

Measures the training split, in images/s (and MB/s for storage):

1. storage: plain 1 MiB reads of the files the dataset reads (its registry entry's ``files=``
   rule, :func:`input_pipelines.registry.dataset_files`), by ``--workers`` readers at
   once, cold (each file's page cache dropped first with ``posix_fadvise(DONTNEED)``, which
   needs no root; the share of bytes still cached after the drop is measured with ``mincore``
   and reported, so a drop that did not happen shows), again cold by 4x as many readers, and
   warm. Bytes per image = the split's bytes / its images.
2. pipeline: the training pipeline as ``python -m tfscale.train`` builds it with the same flags
   (``input_pipelines.PIPELINES``), at three depths: ``records`` (read and parsed, not
   decoded; one cold pass over the worker's data, then warm), ``decoded`` (``--augment=none``:
   decoded, resized, normalized) and ``augmented`` (the run's ``--augment``). With
   ``--workers=N``, N processes each build their shard (``Shard(i, N)``) and run each stage at
   the same time; their rates are summed.
3. model: what a short ``--dataset=synthetic`` run of ``--model`` consumes at this image size
   and batch (``python -m tfscale.train``), or ``--model_images_per_sec``; N workers consume N
   times that (one device each).

Prints the figures, which of the three limits training and what to try, each suggestion with
the measured figures behind it. Bad input exits 2 with one ``error:`` line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from input_pipelines.core.page_cache import MB, drop_cache, read_bandwidth  # noqa: E402
from input_pipelines.registry import (  # noqa: E402
    PIPELINES,
    Batches,
    Shard,
    dataset_files,
    reads_data_dir,
)
from input_pipelines.tools import parse_tool_flags  # noqa: E402
from tfscale.cli.flags import config_from_flags, define_flags  # noqa: E402
from tfscale.config.settings import DataSettings  # noqa: E402
from tfscale.config.train_config import TrainConfig  # noqa: E402

STAGES = ("records", "decoded", "augmented")
MORE_READERS = 4  # the second cold read uses this many times --workers readers
DROPPED = 0.1  # a drop worked when at most this share of the bytes stayed cached


# ---- storage ---------------------------------------------------------------------------------

def storage(paths: Sequence[str], workers: int) -> dict[str, Any]:
    """Cold (at ``workers`` and 4x as many readers) and warm read bandwidth of ``paths``."""
    out: dict[str, Any] = {"files": len(paths),
                           "bytes": sum(os.path.getsize(p) for p in paths)}
    for name, readers in (("cold", workers), ("cold_more_readers", MORE_READERS * workers)):
        out[f"{name}_still_cached"] = drop_cache(paths)
        out[f"{name}_mb_s"] = read_bandwidth(paths, readers)
    out["warm_mb_s"] = max(read_bandwidth(paths, workers) for _ in range(2))
    return out


# ---- pipeline --------------------------------------------------------------------------------

@contextmanager
def undecoded() -> Iterator[None]:
    """While open, pipelines built through the shared mechanics hand out their parsed records
    (encoded images and labels) instead of decoding and augmenting them."""
    from input_pipelines.core import mechanics

    batches = mechanics.batches

    def records_only(files: Sequence[str], counts: Sequence[int], read: mechanics.Reader,
                     parse: mechanics.Parse, transform: mechanics.Transform,
                     config: DataSettings, shard: Shard, split: str, batch_size: int) -> Batches:
        del transform
        return batches(files, counts, read, parse, lambda element, seed: element, config,
                       shard, split, batch_size)

    mechanics.batches = records_only
    try:
        yield
    finally:
        mechanics.batches = batches


class StageRunner:
    """Builds one worker's pipeline at a given depth and times it."""

    def __init__(self, config: TrainConfig, shard: Shard) -> None:
        self.config, self.shard = config, shard
        self.dataset: Any = None
        self.examples = 0

    def build(self, stage: str) -> int:
        """Builds the ``stage`` pipeline (one of :data:`STAGES`); returns its examples."""
        config = self.config.replace(augment="none") if stage == "decoded" else self.config
        build = PIPELINES.get(config.dataset)
        if stage == "records":
            with undecoded():
                batches = build(config, self.shard, "train", config.batch_size)
        else:
            batches = build(config, self.shard, "train", config.batch_size)
        self.dataset, self.examples = batches.dataset, batches.examples or 0
        return self.examples

    def time(self, seconds: float, warmup: int = 2, batches: int = 0) -> tuple[int, float]:
        """Images and seconds of a fresh iterator: ``warmup`` untimed batches, then
        ``batches`` (when > 0) or as many as ``seconds`` allow (at least two)."""
        iterator = iter(self.dataset)
        for _ in range(warmup):
            next(iterator)
        images, start = 0, time.perf_counter()
        while (images < batches * self.config.batch_size if batches else
               images < 2 * self.config.batch_size or time.perf_counter() - start < seconds):
            images += int(next(iterator)[1].shape[0])
        return images, time.perf_counter() - start


def _serve(config: TrainConfig, shard: Shard, conn: Any) -> None:
    """A worker process: runs the :class:`StageRunner` calls the parent sends."""
    runner = StageRunner(config, shard)
    while True:
        request = conn.recv()
        if request is None:
            return
        method, args = request
        try:
            conn.send(("ok", getattr(runner, method)(*args)))
        except Exception as err:  # sent to the parent, which reports it
            # ValueError (DataError included) is bad input, as in the parent process.
            kind = "bad input" if isinstance(err, ValueError) else type(err).__name__
            conn.send((kind, f"worker {shard.index}: {err}"))


class Workers:
    """``count`` StageRunners: this process's own for one, else one per spawned process;
    each call runs on all of them at once and returns their results in shard order."""

    def __init__(self, config: TrainConfig, count: int) -> None:
        self.local = StageRunner(config, Shard()) if count == 1 else None
        self.processes: list[Any] = []
        self.conns: list[Any] = []
        if count > 1:
            import multiprocessing

            context = multiprocessing.get_context("spawn")  # no fork of a TensorFlow process
            for index in range(count):
                parent, child = context.Pipe()
                process = context.Process(target=_serve, args=(config, Shard(index, count),
                                                               child), daemon=True)
                process.start()
                self.processes.append(process)
                self.conns.append(parent)

    def call(self, method: str, *args: Any) -> list[Any]:
        if self.local is not None:
            return [getattr(self.local, method)(*args)]
        for conn in self.conns:
            conn.send((method, args))
        replies = [self._reply(i) for i in range(len(self.conns))]
        for status, message in replies:
            if status == "bad input":
                raise ValueError(message)
            if status != "ok":
                raise RuntimeError(f"{status}: {message}")
        return [value for _, value in replies]

    def _reply(self, index: int) -> Any:
        """Worker ``index``'s answer; an error when it died instead of answering."""
        conn, process = self.conns[index], self.processes[index]
        while not conn.poll(1.0):
            if not process.is_alive():
                raise RuntimeError(f"worker {index} died (exit code {process.exitcode})")
        return conn.recv()

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()


def _rate(results: Sequence[tuple[int, float]]) -> float:
    """Images/s of workers timed at once: the sum of their own rates."""
    return sum(images / seconds for images, seconds in results)


def pipeline(config: TrainConfig, workers: int, seconds: float,
             files: Sequence[str]) -> dict[str, Any]:
    """The pipeline's images/s per stage, summed over ``workers`` (see the module docstring)."""
    runners = Workers(config, workers)
    out: dict[str, Any] = {}
    try:
        for stage in STAGES:
            examples = runners.call("build", stage)
            if stage == "records":
                out["images"] = sum(examples)
                out["records_cold_still_cached"] = drop_cache(files)
                # One pass over the smallest shard's data, no warm-up: the reads are cold.
                epoch = min(max(1, e // config.batch_size) for e in examples)
                out["records_cold"] = _rate(runners.call("time", seconds, 0, epoch))
            out[stage] = _rate(runners.call("time", seconds))
    finally:
        runners.close()
    return out


# ---- model -----------------------------------------------------------------------------------

def model_rate(config: TrainConfig, steps: int) -> float:
    """Images/s of a short ``--dataset=synthetic`` training run of ``config.model``."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = config.to_argv(dataset="synthetic", data_dir="", steps=steps,
                                epochs=1, num_processes=1, model_dir=os.path.join(tmp, "run"),
                                tensorboard=False, eval_every=0, validation_steps=0,
                                stage_dir="", profile_steps="")
        proc = subprocess.run([sys.executable, "-m", "tfscale.train", *argv],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ValueError(f"the synthetic run of --model={config.model} failed: {tail}")
        with open(os.path.join(tmp, "run", "results.json")) as f:
            return float(json.load(f)["images_per_sec"])


# ---- verdict ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Verdict:
    limit: str  # "storage", "pipeline" or "model"
    rates: dict[str, float]  # images/s each of the three sustains (all workers)
    advice: list[str]


def verdict(store: dict[str, Any], pipe: dict[str, Any], model: float,
            workers: int, image_size: int) -> Verdict:
    """Which of storage (cold), pipeline (augmented) and model is slowest, and what to try."""
    per_image = store["bytes"] / max(1, pipe["images"])  # bytes
    to_images = 1 / (per_image / MB)
    rates = {"storage": store["cold_mb_s"] * to_images, "pipeline": pipe["augmented"],
             "model": model * workers}
    limit = min(rates, key=lambda k: rates[k])
    need = min(v for k, v in rates.items() if k != limit)  # what the next stage could take
    advice: list[str] = []
    if limit == "storage":
        cold, more, warm = store["cold_mb_s"], store["cold_more_readers_mb_s"], store["warm_mb_s"]
        advice.append(f"stage to node-local storage (--stage_dir): {need:.1f} images/s need "
                      f"{need * per_image / MB:.1f} MB/s, these reads give {cold:.1f} MB/s cold")
        if more > 1.2 * cold:
            advice.append(f"more parallel reads: {MORE_READERS * workers} readers gave "
                          f"{more:.1f} MB/s cold against {cold:.1f} with {workers}")
        if warm > 1.2 * cold:
            advice.append(f"a cache: from memory the same files read at {warm:.1f} MB/s "
                          f"({warm * to_images:.0f} images/s); the split is "
                          f"{store['bytes'] / MB:.1f} MB: --cache keeps its records in memory "
                          "after the first epoch")
        raw = image_size * image_size * 3
        if per_image > raw:
            advice.append(f"a lighter format: {per_image / 1e3:.0f} kB per image, while "
                          f"{image_size}x{image_size} RGB pixels are {raw / 1e3:.0f} kB: store "
                          "images resized to about --image_size")
    elif limit == "pipeline":
        read, decoded, full = pipe["records"], pipe["decoded"], pipe["augmented"]
        costs = {"reading and parsing records": 1 / read, "decoding": 1 / decoded - 1 / read,
                 "augmentation": 1 / full - 1 / decoded}
        worst = max(costs, key=lambda k: costs[k])
        advice.append(f"{worst} costs most: {1e3 * costs[worst] * workers:.1f} ms per image and "
                      f"worker (records {read:.0f}, decoded {decoded:.0f}, augmented "
                      f"{full:.0f} images/s)")
        if worst == "reading and parsing records":
            advice.append(f"a lighter format or more parallel reads: the records alone come "
                          f"at {read:.0f} images/s ({pipe['records_cold']:.0f} cold)")
            cached = pipe.get("records_cold_still_cached")
            # A "cold" pass that stayed cached (an LMDB the reader maps) measured start-up only.
            if read > 1.2 * pipe["records_cold"] and (cached is None or cached <= DROPPED):
                advice.append(f"a cache: warm records come {read / pipe['records_cold']:.1f}x "
                              "faster than cold ones (--cache, or stage to node-local storage)")
        elif worst == "decoding":
            advice.append(f"a lighter format: {per_image / 1e3:.0f} kB per image to decode; "
                          f"store images resized to about --image_size={image_size}, or give "
                          "the pipeline more cores (workers)")
        else:
            advice.append(f"lighter augmentation: --augment=none delivers {decoded:.0f} "
                          f"images/s against {full:.0f} with the run's --augment")
    else:
        advice.append(f"input is not the limit: the pipeline delivers {rates['pipeline']:.1f} "
                      f"images/s and cold storage {rates['storage']:.1f}, "
                      f"{min(rates['pipeline'], rates['storage']) / rates['model']:.1f}x what "
                      "the model consumes; I/O tuning will not speed this run up")
    return Verdict(limit, rates, advice)


def check(config: TrainConfig) -> None:
    """Raises ``ValueError`` for a dataset io_check cannot measure."""
    if not reads_data_dir(config.dataset):
        raise ValueError(f"--dataset={config.dataset} generates its data and reads no files; "
                         "io_check measures datasets read from --data_dir")
    if not config.data_dir:
        raise ValueError("--data_dir is required: the folder of the dataset to measure")
    if not os.path.exists(config.data_dir):
        raise ValueError(f"--data_dir={config.data_dir} does not exist")


def io_check(config: TrainConfig, workers: int = 1, seconds: float = 5.0,
             model_images_per_sec: float = 0.0, model_steps: int = 6) -> dict[str, Any]:
    """Measures storage, pipeline and model for ``config`` (see the module docstring).

    Raises:
        ValueError: a dataset that reads no files, a missing ``--data_dir``, or data the
            dataset cannot read (DataError).
    """
    check(config)
    # The dataset's own files= rule, asked before any pipeline maps or reads the files.
    files = dataset_files(config.dataset, config.data_dir, "train")
    store = storage(files, workers)
    pipe = pipeline(config, workers, seconds, files)
    model = model_images_per_sec or model_rate(config, model_steps)
    found = verdict(store, pipe, model, workers, config.image_size)
    return {"dataset": config.dataset, "data_dir": config.data_dir, "workers": workers,
            "image_size": config.image_size, "batch_size": config.batch_size,
            "storage": store, "pipeline": pipe, "model_images_per_sec": model,
            "model_measured": not model_images_per_sec, "limit": found.limit,
            "rates": found.rates, "advice": found.advice,
            "bytes_per_image": store["bytes"] / max(1, pipe["images"])}


def report(result: dict[str, Any]) -> str:
    """The figures, the limit and the advice, as printed."""
    store, pipe, per_image = result["storage"], result["pipeline"], result["bytes_per_image"]

    def cached(share: float | None) -> str:
        if share is None:
            return " (could not tell whether the cache was dropped)"
        return "" if share <= DROPPED else f" (NOT cold: {share:.0%} stayed cached)"

    def images(mb_s: float) -> str:
        return f"{mb_s:8.1f} MB/s = {mb_s * MB / per_image:8.1f} images/s"

    n = result["workers"]
    lines = [
        f"{result['dataset']} at {result['data_dir']}: {pipe['images']} training images in "
        f"{store['files']} file(s), {store['bytes'] / MB:.1f} MB, {per_image / 1e3:.1f} kB per "
        f"image; {n} worker(s), batch {result['batch_size']}, {result['image_size']} px",
        f"storage cold, {n} reader(s):   {images(store['cold_mb_s'])}"
        f"{cached(store['cold_still_cached'])}",
        f"storage cold, {MORE_READERS * n} readers:     {images(store['cold_more_readers_mb_s'])}"
        f"{cached(store['cold_more_readers_still_cached'])}",
        f"storage warm:               {images(store['warm_mb_s'])}",
        f"records, not decoded, cold: {pipe['records_cold']:8.1f} images/s"
        f"{cached(pipe['records_cold_still_cached'])}",
        f"records, not decoded, warm: {pipe['records']:8.1f} images/s",
        f"decoded, --augment=none:    {pipe['decoded']:8.1f} images/s",
        f"decoded and augmented:      {pipe['augmented']:8.1f} images/s",
        f"model consumes:             {result['model_images_per_sec'] * n:8.1f} images/s "
        f"({'measured' if result['model_measured'] else 'given'}, {n} x "
        f"{result['model_images_per_sec']:.1f})",
        f"limit: {result['limit']} ({result['rates'][result['limit']]:.1f} images/s)",
    ]
    return "\n".join(lines + [f"try: {a}" for a in result["advice"]])


def define_io_flags(values: flags.FlagValues) -> None:
    """The training flags plus io_check's own, on ``values``."""
    define_flags(values)
    flags.DEFINE_integer("workers", 1, "Worker processes reading their shards at once.",
                         lower_bound=1, flag_values=values)
    flags.DEFINE_float("seconds", 5.0, "Seconds each warm stage is timed.", lower_bound=0.0,
                       flag_values=values)
    flags.DEFINE_float("model_images_per_sec", 0.0, "The model's images/s per worker; 0 "
                       "measures it with a short synthetic run.", lower_bound=0.0,
                       flag_values=values)
    flags.DEFINE_integer("model_steps", 6, "Steps of that synthetic run.", lower_bound=2,
                         flag_values=values)
    flags.DEFINE_string("json", "", "Also write the figures to this JSON file.",
                        flag_values=values)


def main(argv: Sequence[str]) -> int:
    values = flags.FlagValues()
    define_io_flags(values)
    try:
        if parse_tool_flags(values, argv, __doc__):
            return 0
        from input_pipelines import shapes_from_data
        from tfscale.cli.plugins import choose_dataset

        config = config_from_flags(values, choose_dataset, shapes_from_data)
        result = io_check(config, values.workers, values.seconds, values.model_images_per_sec,
                     values.model_steps)
    except (ValueError, flags.Error) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(report(result))
    if values.json:
        with open(values.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if all(math.isfinite(v) for v in result["rates"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
