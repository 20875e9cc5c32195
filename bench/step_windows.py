"""Where each rank's core goes in each window of a step, on the two-node mini-cluster.

The forecast charges a two-node step its one-node step less that run's exchange (the node's
*rest*), plus the exchange it forecasts. On this cluster mlp's two-node rest ran 8-19% longer
than the one-node run's (docs/FORECAST.md, "The same two runs on their own strategy's
baselines"); this says what the core did in that time. Each run's ranks run
:mod:`bench.step_windows_train` (tfscale.train that stamps each step's windows) while the
kernel's tracer records every context switch and every softirq on both cores
(``sched:sched_switch``, ``irq:softirq_entry``/``exit``, with the thread group of each
task). Per rank and step, four windows:

- ``compute``: the step's start to its last gradient (forward and backward passes);
- ``exchange``: to its last reduced gradient (what tfscale's exchange clock counts);
- ``update``: to the end of the optimizer's update;
- ``between``: to the next step's start (Keras' loop, callbacks, the stamps' print).

For each window, the milliseconds per step that the rank's core spent on: its ranks' TensorFlow
compute threads (``tf_Compute``), their exchange threads (TensorFlow's collective executor and
gRPC's, ``collective_ops``, ``event_engine``, ``grpc*``), their other threads (the Python main
thread and the threads Python starts, tfscale's ring sender among them), softirq by kind (the
network's receive, ``NET_RX``; high-resolution timers, TCP's and the shaped link's,
``HRTIMER``), other processes, and idle; ``self`` is the rank, ``mate`` the other rank on its
core. The report sets each two-node run's rest (compute, update and between) against the
one-node run of its round, group by group. Where two ranks share a core, it also gives the core's
exchange, the time during which either of them is in its exchange window (a rank's clock stops
while its mate's exchange goes on), and the quiet rest of the step, when neither is, against the
one-node run's. Steps before ``--skip`` are left out (the compiled first steps and the first
progress interval, as bench.shaped_links' steady rate does). ``--layouts`` takes
bench.shaped_links' names; by default ``1x2 multiworker``, ``2x2 multiworker flat`` and
``2x2 multiworker hierarchical``.

    python -m bench.step_windows [--model mlp --gbit 25 --rounds 2 --layouts "NAME,NAME"]
    python -m bench.step_windows --report [--result bench/results/step_windows.json]

Needs root (tracefs, the cluster's namespaces). The tracer's settings are put back afterwards,
also when a run fails. About 2 minutes a run for mlp on 2 cores. Run nothing else meanwhile:
another process on the cores shows up as ``other tasks`` and lengthens every window.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import OUT, cpu_description, in_round_order, save

TRACEFS = Path("/sys/kernel/tracing")
EVENTS = ("sched:sched_switch", "irq:softirq_entry", "irq:softirq_exit")
BUFFER_KB = 300_000  # per CPU: an mlp run of 1,000 steps gave about 20 MB of trace text
RESULT = OUT / "step_windows.json"
WINDOWS = ("compute", "exchange", "update", "between")
REST = ("compute", "update", "between")
DEFAULT_LAYOUTS = "1x2 multiworker,2x2 multiworker flat,2x2 multiworker hierarchical"
#: Thread names (the kernel's ``comm``, digits at the end dropped) by group.
THREAD_GROUPS = {"compute threads": ("tf_Compute",),
                 "exchange threads": ("collective_ops", "event_engine", "grpc")}

#: Softirqs reported by name: the network's, and high-resolution timers (TCP's, and the one
#: that releases a shaped link's queue, tc's tbf); the others together.
SOFTIRQS = ("NET_RX", "NET_TX", "HRTIMER")

# One line of the trace: task-pid (tgid) [cpu] flags seconds: event: fields
_LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\(\s*(?P<tgid>[-\d]+)\)\s+\[(?P<cpu>\d+)\]"
                   r"\s+\S+\s+(?P<ts>[\d.]+): (?P<event>\w+): (?P<fields>.*)$")
_NEXT = re.compile(r"next_comm=(?P<comm>.*) next_pid=(?P<pid>\d+)")
_ACTION = re.compile(r"action=(\w+)")


# --- reading the trace ---------------------------------------------------------------------

def parse_trace(text: str) -> tuple[list[tuple[int, float, str, str]], dict[int, int]]:
    """The trace's events as (cpu, seconds, event, fields), and each thread's group (pid to
    tgid) as the trace names it where the thread runs."""
    events, groups = [], {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match:
            continue  # comments, and lines the tracer marks as lost
        if match["tgid"].isdigit():
            groups[int(match["pid"])] = int(match["tgid"])
        events.append((int(match["cpu"]), float(match["ts"]), match["event"], match["fields"]))
    return events, groups


def timelines(events: list[tuple[int, float, str, str]],
              groups: dict[int, int]) -> dict[int, tuple[np.ndarray, list[str]]]:
    """Per CPU, what ran from each event on: (times, labels), a label ``TGID|thread`` for a
    task (its thread name without trailing digits), ``idle``, ``softirq NAME`` while a softirq
    runs (it takes the time of the task it interrupted), ``unknown`` before the first switch."""
    per_cpu: dict[int, list[tuple[float, str, str]]] = defaultdict(list)
    for cpu, ts, event, fields in events:
        per_cpu[cpu].append((ts, event, fields))
    out = {}
    for cpu, cpu_events in per_cpu.items():
        times: list[float] = []
        labels: list[str] = []
        task, softirq = "unknown", ""
        for ts, event, fields in sorted(cpu_events, key=lambda e: e[0]):
            if event == "sched_switch":
                nxt = _NEXT.search(fields)
                if not nxt:
                    continue
                pid = int(nxt["pid"])
                thread = re.sub(r"\d+$", "", nxt["comm"])
                task = "idle" if pid == 0 else f"{groups.get(pid, pid)}|{thread}"
                if softirq:
                    continue  # the switch shows once the softirq is over
                label = task
            elif event == "softirq_entry":
                action = _ACTION.search(fields)
                softirq = f"softirq {action.group(1) if action else '?'}"
                label = softirq
            elif event == "softirq_exit":
                softirq, label = "", task
            else:
                continue
            times.append(ts)
            labels.append(label)
        if times:
            out[cpu] = (np.array(times), labels)
    return out


class CoreTime:
    """How long each label ran on one CPU up to any time: cumulative sums at the events."""

    def __init__(self, times: np.ndarray, labels: list[str]) -> None:
        self.times = times
        self.names = sorted(set(labels))
        index = {name: code for code, name in enumerate(self.names)}
        self.codes = np.array([index[label] for label in labels])
        spans = np.diff(times)
        self.cum = np.zeros((len(times), len(self.names)))
        for code in range(len(self.names)):
            self.cum[1:, code] = np.cumsum(spans * (self.codes[:-1] == code))

    def until(self, at: np.ndarray) -> np.ndarray:
        """Seconds of each label up to each time in ``at`` (rows: times, columns: names)."""
        i = np.clip(np.searchsorted(self.times, at, "right") - 1, 0, len(self.times) - 1)
        out = self.cum[i].copy()
        running = np.clip(at - self.times[i], 0.0, None)
        out[np.arange(len(at)), self.codes[i]] += running
        out[at < self.times[0]] = 0.0
        return out

    def between(self, start: np.ndarray, end: np.ndarray) -> dict[str, float]:
        """Mean seconds of each label in the windows ``start[i]``-``end[i]``."""
        spent = (self.until(end) - self.until(start)).mean(axis=0)
        return {name: float(s) for name, s in zip(self.names, spent, strict=True)}


# --- the windows ---------------------------------------------------------------------------

def load_stamps(directory: Path, offset: float) -> dict[tuple[str, int], np.ndarray]:
    """Each rank's stamps (``HOST_PID.txt`` files of bench.step_windows_train) as seconds on
    the tracer's clock (``offset``: the wall clock less the monotonic clock), by (host, pid)."""
    ranks = {}
    for path in sorted(directory.glob("*_*.txt")):
        host, _, pid = path.stem.rpartition("_")
        rows = [[int(v) for v in line.split()] for line in path.read_text().splitlines()
                if line.strip()]
        if not rows:
            raise ValueError(f"{path}: no steps stamped")
        widths = {len(row) for row in rows}
        if len(widths) != 1:
            raise ValueError(f"{path}: steps with {sorted(widths)} stamps; expected one count")
        ranks[(host, int(pid))] = np.array(rows, dtype=np.float64) / 1e6 - offset
    if not ranks:
        raise ValueError(f"{directory}: no rank wrote its stamps (HOST_PID.txt); the ranks run "
                         "bench.step_windows_train")
    return ranks


def step_windows(stamps: np.ndarray, skip: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The windows (starts, ends) of each step after the first ``skip``: all four where the
    step has its exchange stamps, else ``step`` (start to end of update) and ``between``."""
    rows = stamps[skip:]
    if len(rows) < 2:
        raise ValueError(f"{len(stamps)} steps stamped; more than {skip + 1} are needed")
    began, ended = rows[:-1, 0], rows[:-1, -1]
    following = rows[1:, 0]
    if rows.shape[1] == 4:
        reduce_start, reduce_end = rows[:-1, 1], rows[:-1, 2]
        return {"compute": (began, reduce_start), "exchange": (reduce_start, reduce_end),
                "update": (reduce_end, ended), "between": (ended, following)}
    return {"step": (began, ended), "between": (ended, following)}


def group_of(label: str, rank: int, mates: set[int]) -> str:
    """The report's group of a timeline label, for ``rank`` (``mates``: the other ranks on
    its core)."""
    if label.startswith("softirq"):
        return label if label.endswith(SOFTIRQS) else "softirq other"
    if label in ("idle", "unknown"):
        return label
    tgid_text, _, thread = label.partition("|")
    tgid = int(tgid_text)
    if tgid != rank and tgid not in mates:
        return "other tasks"
    who = "self" if tgid == rank else "mate"
    for group, names in THREAD_GROUPS.items():
        if thread.startswith(names):
            return f"{who} {group}"
    return f"{who} other threads"


def analyse(trace: str, stamps: dict[tuple[str, int], np.ndarray],
            skip: int) -> dict[str, Any]:
    """``ranks``: :func:`account`'s; ``cores``: :func:`shared_core`'s for each core that two
    or more stamped ranks share."""
    events, groups = parse_trace(trace)
    cores = {cpu: CoreTime(*line) for cpu, line in timelines(events, groups).items()}

    def core_of(pid: int) -> int:
        """Where the rank's threads were switched to most often (taskset pins it there)."""
        counts = {cpu: int(np.isin(core.codes, [code for code, name in enumerate(core.names)
                                                if name.startswith(f"{pid}|")]).sum())
                  for cpu, core in cores.items()}
        return max(counts, key=lambda cpu: counts[cpu])

    placed = {pid: core_of(pid) for _, pid in stamps}
    shared = {}
    for cpu in sorted(set(placed.values())):
        here = {key: rows for key, rows in stamps.items() if placed[key[1]] == cpu}
        if len(here) > 1 and all(rows.shape[1] == 4 for rows in here.values()):
            with contextlib.suppress(ValueError):  # too few steps: the ranks' windows stand
                shared[f"cpu{cpu}"] = shared_core(cores[cpu], here, skip)
    return {"ranks": account(cores, placed, stamps, skip), "cores": shared}


def _either(group: str) -> str:
    """A group with its ``self``/``mate`` dropped: any of the core's ranks."""
    return group.split(" ", 1)[1] if group.startswith(("self ", "mate ")) else group


def _groups(core: CoreTime, start: np.ndarray, end: np.ndarray, rank: int,
            mates: set[int]) -> dict[str, float]:
    spent: dict[str, float] = defaultdict(float)
    for label, seconds in core.between(start, end).items():
        spent[group_of(label, rank, mates)] += seconds * 1e3
    return {g: round(v, 4) for g, v in sorted(spent.items()) if v >= 5e-4}


def account(cores: dict[int, CoreTime], placed: dict[int, int],
            stamps: dict[tuple[str, int], np.ndarray], skip: int) -> dict[str, Any]:
    """Per rank (``HOST_PID``): its core, mean step and, per window, its mean milliseconds
    and the milliseconds of each group on its core."""
    out = {}
    for (host, pid), rows in stamps.items():
        core = cores[placed[pid]]
        mates = {other for other, cpu in placed.items() if cpu == placed[pid] and other != pid}
        windows = step_windows(rows, skip)
        rank: dict[str, Any] = {"cpu": placed[pid],
                                "step_ms": float(np.mean(np.diff(rows[skip:, 0])) * 1e3)}
        for window, (start, end) in windows.items():
            rank[window] = {"ms": float(np.mean(end - start) * 1e3),
                            "groups": _groups(core, start, end, pid, mates)}
        out[f"{host}_{pid}"] = rank
    return out


def shared_core(core: CoreTime, stamps: dict[tuple[str, int], np.ndarray],
                skip: int) -> dict[str, Any]:
    """One core's ranks together, per step: ``exchange_ms``, the time some rank on it is in
    its exchange window (their union: a rank's clock stops while its mate's exchange goes on),
    and ``quiet``, the rest of the step, when none is: its milliseconds and each group's
    (``self``/``mate`` dropped: any of the core's ranks)."""
    rows = [r[skip:] for r in stamps.values()]
    spans = sorted((float(a), float(b)) for r in rows for a, b in zip(r[:, 1], r[:, 2],
                                                                       strict=True))
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    begin, finish = max(r[0, 0] for r in rows), min(r[-1, 0] for r in rows)
    merged = [m for m in merged if begin <= m[0] and m[1] <= finish]
    if len(merged) < 2:
        raise ValueError(f"{len(merged)} exchanges between the ranks' first and last stamped "
                         "steps; two or more are needed")
    quiet_start = np.array([m[1] for m in merged[:-1]])
    quiet_end = np.array([m[0] for m in merged[1:]])
    # Per step of the first rank over the same stretch, so that steps whose ranks' windows
    # did not overlap (two exchanges in one step) count once.
    first = rows[0][:, 0]
    steps = int(np.sum((first >= merged[0][1]) & (first < merged[-1][0])))
    steps = max(steps, 1)
    pids = [pid for _, pid in stamps]
    spent: dict[str, float] = defaultdict(float)
    for group, ms in _groups(core, quiet_start, quiet_end, pids[0], set(pids[1:])).items():
        spent[_either(group)] += ms * len(quiet_start) / steps
    return {"ranks": [f"{host}_{pid}" for host, pid in stamps],
            "exchange_ms": sum(b - a for a, b in merged[:-1]) * 1e3 / steps,
            "quiet": {"ms": float(np.sum(quiet_end - quiet_start)) * 1e3 / steps,
                      "groups": dict(spent)}}


def mean_windows(ranks: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per window, its mean over the ranks: ``ms`` and each group (0 where a rank had none)."""
    windows: dict[str, dict[str, float]] = {}
    for window in next(iter(ranks.values())):
        if window in ("cpu", "step_ms"):
            continue
        sums: dict[str, float] = defaultdict(float)
        for rank in ranks.values():
            sums["ms"] += rank[window]["ms"]
            for group, ms in rank[window]["groups"].items():
                sums[group] += ms
        windows[window] = {g: v / len(ranks) for g, v in sums.items()}
    return windows


def mean_core(cores: dict[str, Any]) -> dict[str, Any]:
    """:func:`shared_core`'s figures, their mean over the cores (``quiet`` flattened: ``ms``
    beside the groups)."""
    quiet: dict[str, float] = defaultdict(float)
    for core in cores.values():
        quiet["ms"] += core["quiet"]["ms"] / len(cores)
        for group, ms in core["quiet"]["groups"].items():
            quiet[group] += ms / len(cores)
    return {"exchange_ms": sum(core["exchange_ms"] for core in cores.values()) / len(cores),
            "quiet": dict(quiet)}


def rest_of(windows: dict[str, dict[str, float]]) -> dict[str, float]:
    """The rest (compute, update and between) by group, self and mate together."""
    rest: dict[str, float] = defaultdict(float)
    for window in REST:
        for group, ms in windows.get(window, {}).items():
            rest[_either(group)] += ms
    return dict(rest)


# --- running ---------------------------------------------------------------------------------

def _write(name: str, value: str, append: bool = False) -> None:
    # tracefs refuses seeks (Python's append mode seeks to the end)
    fd = os.open(TRACEFS / name, os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC))
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _set_events(events: list[str] | tuple[str, ...]) -> None:
    """Enables exactly ``events``: set_event takes one event a write."""
    _write("set_event", "")
    for event in events:
        _write("set_event", event + "\n", append=True)


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """The tracer set up for the block (:data:`EVENTS`, monotonic clock, thread groups), off
    between runs; its settings as they were afterwards."""
    if not (TRACEFS / "trace").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=False)
    if not (TRACEFS / "trace").exists():
        sys.exit(f"no tracefs at {TRACEFS} (root and a kernel with ftrace are needed)")
    names = ("tracing_on", "trace_clock", "buffer_size_kb", "options/record-tgid")
    before = {name: (TRACEFS / name).read_text().strip() for name in names}
    clock = re.search(r"\[(\w+)\]", before["trace_clock"])
    events_before = (TRACEFS / "set_event").read_text().split()
    try:
        _write("tracing_on", "0")
        _write("trace_clock", "mono")
        _write("buffer_size_kb", str(BUFFER_KB))
        _write("options/record-tgid", "1")
        _set_events(EVENTS)
        yield
    finally:
        _write("tracing_on", "0")
        _write("trace", "")
        _set_events(events_before)
        _write("trace_clock", clock.group(1) if clock else "local")
        _write("buffer_size_kb", before["buffer_size_kb"].split()[0])
        _write("options/record-tgid", before["options/record-tgid"])
        _write("tracing_on", before["tracing_on"])


def traced_run(model: str, layout: Any, skip: int) -> dict[str, Any]:
    """One run of ``layout`` under the tracer: its rate, exchange share and ranks' windows."""
    from bench import shaped_links as sl

    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        stamps_dir = Path(tmp) / "stamps"
        _write("trace", "")
        offset_before = time.time() - time.monotonic()
        _write("tracing_on", "1")
        try:
            result = sl.train(model, layout, entry=("-m", "bench.step_windows_train",
                                                    f"--stamps_dir={stamps_dir}"))
        finally:
            _write("tracing_on", "0")
        offset = (offset_before + time.time() - time.monotonic()) / 2
        trace = (TRACEFS / "trace").read_text()
        lost = sum(int(m) for m in re.findall(r"overrun: (\d+)", "".join(
            (TRACEFS / f"per_cpu/{cpu}/stats").read_text()
            for cpu in os.listdir(TRACEFS / "per_cpu"))))
        found = analyse(trace, load_stamps(stamps_dir, offset), skip)
    return {"layout": layout.name, "images_per_sec": result["steady_images_per_sec"],
            "exchange_share": result["steady_exchange_share"], "events_lost": lost, **found}


def layouts_named(names: list[str]) -> list[Any]:
    """bench.shaped_links' layouts by name."""
    from bench import shaped_links as sl

    known = {layout.name: layout for layout in (*sl.ONE_NODE, *sl.OWN_ONE_NODE, *sl.ACROSS)}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"--layouts: unknown {unknown}; expected names from: "
                         f"{', '.join(known)}")
    return [known[name] for name in names]


def measure(model: str, gbit: float, rounds: int, names: list[str],
            skip: int) -> dict[str, Any]:
    """``rounds`` rounds of the layouts ``names`` under the tracer, the order reversed in odd
    rounds, two-node runs over links shaped to ``gbit``; saved after every run."""
    from bench import shaped_links as sl

    layouts = layouts_named(names)
    result: dict[str, Any] = {"cpu": cpu_description(), "model": model, "gbit": gbit,
                              "skip": skip, "when": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime()), "runs": []}
    with tracing(), sl.two_nodes():
        for round_ in range(rounds):
            for layout in in_round_order(layouts, round_):
                sl.shape(gbit if layout.nodes > 1 else 0)
                run = {"round": round_, **traced_run(model, layout, skip)}
                result["runs"].append(run)
                print(f"round {round_} {layout.name}: {run['images_per_sec']:.0f} images/s",
                      flush=True)
                save(RESULT.stem, result)
    return result


# --- the report --------------------------------------------------------------------------------

def _excess(figures: dict[str, float], base: dict[str, float]) -> str:
    """``ms +X, GROUP +Y, ...``: each of ``figures`` less ``base`` (0 where one lacks it),
    ``ms`` first, differences under 0.05 ms left out."""
    keys = sorted(set(figures) | set(base), key=lambda k: (k != "ms", k))
    return ", ".join(f"{k} {figures.get(k, 0.0) - base.get(k, 0.0):+.2f}" for k in keys
                     if abs(figures.get(k, 0.0) - base.get(k, 0.0)) >= 0.05)


def report(result: dict[str, Any]) -> str:
    """The windows of every run, each two-node run's rest against its round's one-node run,
    and each shared core's exchange and quiet part (markdown)."""
    lines = [f"# {result['model']} at {result['gbit']:g} Gbit/s, {result['cpu']}, "
             f"{result['when']}; steps after {result['skip']}; ms per step, the rank's core, "
             "mean over the ranks", ""]
    groups = sorted({g for run in result["runs"] for window in mean_windows(run["ranks"])
                     .values() for g in window if g != "ms"})
    lines.append("| round | layout | images/s | window | ms | " + " | ".join(groups) + " |")
    lines.append("|---" * (5 + len(groups)) + "|")
    for run in result["runs"]:
        for window, spent in mean_windows(run["ranks"]).items():
            cells = " | ".join(f"{spent.get(g, 0.0):.2f}" for g in groups)
            lines.append(f"| {run['round']} | {run['layout']} | {run['images_per_sec']:.0f} | "
                         f"{window} | {spent['ms']:.2f} | {cells} |")
    lines += ["", "The rest (compute + update + between) against the one-node run of the round, "
              "ms per step (self and mate together):", ""]
    for round_ in sorted({run["round"] for run in result["runs"]}):
        runs = [run for run in result["runs"] if run["round"] == round_]
        base = next((run for run in runs if run["layout"].startswith("1x")), None)
        if base is None:
            continue
        base_rest = rest_of(mean_windows(base["ranks"]))
        for run in runs:
            if run is base:
                continue
            excess = _excess(rest_of(mean_windows(run["ranks"])), base_rest)
            lines.append(f"- round {round_}, {run['layout']} against {base['layout']}: "
                         f"{excess}")
    lines += ["", "Each core's ranks together (mean over the cores that two ranks share): the "
              "time some rank on the core is in its exchange window, the ranks' own exchange "
              "windows, and the quiet rest, when none is, against the round's one-node run "
              "(ms per step):", ""]
    for round_ in sorted({run["round"] for run in result["runs"]}):
        runs = [run for run in result["runs"] if run["round"] == round_ and run.get("cores")]
        base = next((run for run in runs if run["layout"].startswith("1x")), None)
        for run in runs:
            core = mean_core(run["cores"])
            own = mean_windows(run["ranks"]).get("exchange", {}).get("ms", 0.0)
            line = (f"- round {round_}, {run['layout']}: exchange on the core "
                    f"{core['exchange_ms']:.1f} (a rank's own {own:.1f}), quiet "
                    f"{core['quiet']['ms']:.1f}")
            if base is not None and run is not base:
                line += (f"; quiet against {base['layout']}: "
                         + _excess(core["quiet"], mean_core(base["cores"])["quiet"]))
            lines.append(line)
    lost = [run for run in result["runs"] if run.get("events_lost")]
    if lost:
        lines.append(f"\nThe tracer lost events in {len(lost)} run(s): their windows are short "
                     "of what ran.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp", choices=("mlp", "resnet50"))
    parser.add_argument("--gbit", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layouts", default=DEFAULT_LAYOUTS)
    parser.add_argument("--skip", type=int, default=200,
                        help="steps left out at the start (mlp's first progress interval)")
    parser.add_argument("--report", action="store_true", help="report a saved result")
    parser.add_argument("--result", type=Path, default=RESULT)
    args = parser.parse_args(argv)
    if args.report:
        print(report(json.loads(args.result.read_text())))
        return 0
    if os.geteuid() != 0:
        sys.exit("bench.step_windows needs root: the tracer and the cluster's namespaces")
    result = measure(args.model, args.gbit, args.rounds,
                     [name.strip() for name in args.layouts.split(",")], args.skip)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
