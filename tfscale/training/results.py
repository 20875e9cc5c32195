"""The run summary: results.json (written atomically by the chief) and the printed table."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tfscale.cluster import rank_zero
from tfscale.training.files import write_json_atomic


def read_results(model_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The results.json of ``model_dir``, or None when there is none."""
    path = Path(model_dir) / "results.json"
    return json.loads(path.read_text()) if path.exists() else None


def summary(results: dict[str, Any]) -> str:
    """A short human-readable table of a results dict."""
    rows = [
        ("model / strategy", f"{results['model']} / {results['strategy']}"),
        ("workers x replicas", f"{results['num_workers']} x {results['replicas_per_worker']}"),
        *([("hosts", describe_hosts(results["hosts"]))] if results.get("hosts") else []),
        *([("exchange", results["exchange"])] if results.get("exchange") else []),
        ("global batch", describe_batch(results)),
        ("steps", f"{results['steps']} (this run: {results['steps_this_run']})"),
        # The progress lines' steps together: after compilation, without evaluations and
        # the work between epochs (what each line's images/s covers).
        ("images/sec (training steps)", f"{results['images_per_sec']:.2f}"),
        ("images/sec per worker", f"{results['images_per_sec_per_worker']:.2f}"),
        ("step time", f"{results['step_time_ms']:.1f} ms"),
        (describe_final_loss(results), f"{results['final_loss']:.4f}"),
    ]
    if "train_seconds" in results:
        rows.append(("training time", f"{results['train_seconds']:.1f} s"))
        if results.get("train_seconds") and results.get("steps_this_run"):
            # Everything this run did: compilation, evaluations, checkpoints, epoch ends.
            overall = (results["global_batch_size"] * results["steps_this_run"]
                       / results["train_seconds"])
            rows.append(("images/sec (over the training time)", f"{overall:.2f}"))
    if results.get("evaluations"):
        last = results["evaluations"][-1]
        rows.append(("evaluations", f"{len(results['evaluations'])} (last: step {last['step']}, "
                                    f"{last['examples']} examples)"))
    if results.get("target"):
        rows.append(("target", describe_target(results["target"])))
    rows += [(k, f"{v:.4f}") for k, v in sorted(results.get("metrics", {}).items())
             if k not in ("loss", "images_per_sec", "step_time_ms")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(["== tfscale summary =="] + [f"{k:<{width}}  {v}" for k, v in rows])


def describe_final_loss(results: dict[str, Any]) -> str:
    """What the final loss is: the last progress line's, the mean of the last ``--log_every``
    steps (of every worker's, averaged, under several workers)."""
    every = results.get("config", {}).get("log_every")
    steps = f"up to {every} steps" if every else "its steps"
    workers = results.get("num_workers", 1)
    over = f", mean of {workers} workers" if workers > 1 else ""
    return f"final loss (last progress line: {steps}{over})"


def describe_hosts(hosts: list[str]) -> str:
    """The workers' hosts with their counts in order of appearance: ``node1 x2, node2 x2``."""
    counts = {host: hosts.count(host) for host in dict.fromkeys(hosts)}
    return ", ".join(f"{host} x{n}" for host, n in counts.items())


def describe_batch(results: dict[str, Any]) -> str:
    """The global batch, with the micro-batches of a step when gradients were accumulated."""
    micro = results.get("grad_accum_steps", 1)
    extra = f" ({micro} micro-batches per optimizer step)" if micro > 1 else ""
    return f"{results['global_batch_size']}{extra}"


def describe_target(target: dict[str, Any]) -> str:
    """One line: the target and when it was reached (time to accuracy), or that it was not."""
    sign = "<=" if target["direction"] == "min" else ">="
    goal = f"{target['metric']} {sign} {target['value']:g}"
    if not target["reached"]:
        return f"{goal}: not reached"
    return (f"{goal}: reached ({target['achieved']:.4g}) at step {target['step']}, "
            f"epoch {target['epoch']:g}, after {target['seconds']:.1f} s")


@rank_zero.rank_zero_only
def publish(results: dict[str, Any], model_dir: str) -> None:
    """Chief only: writes results.json and prints the summary."""
    write_json_atomic(Path(model_dir) / "results.json", results)
    rank_zero.log(summary(results))
