"""bench.step_profile reads perf's report and the progress lines into milliseconds per step."""

from __future__ import annotations

import pytest

from bench.step_profile import JIT, NO_OP, compare, parse_ops, parse_report, step_ms_from

REPORT = """\
# Samples: 11K of event 'cpu-clock'
#
# Overhead  Shared Object                 Symbol
# ........  ............................  ......
#
    45.19%  [JIT] tid 16641               [.] 0x00007f24a84c165d
     4.00%  [JIT] tid 16641               [.] 0x00007f24a84c1517
     5.12%  libc.so.6                     [.] __memmove_avx512_unaligned_erms
     4.00%  _multiarray_umath.cpython-311-x86_64-linux-gnu.so  [.] FLOAT_add_X86_V3
     0.80%  libtensorflow_cc.so.2         [.] tensorflow::ApplyKerasMomentumOp<float>::Compute
     0.30%  [kernel.kallsyms]             [k] irqentry_exit_to_user_mode

"""


def test_report_lines_become_shares_with_jit_code_as_one_entry() -> None:
    shares = parse_report(REPORT)
    assert shares[(JIT, JIT)] == pytest.approx(0.4919)
    assert shares[("libc.so.6", "__memmove_avx512_unaligned_erms")] == pytest.approx(0.0512)
    assert shares[("libtensorflow_cc.so.2",
                   "tensorflow::ApplyKerasMomentumOp<float>::Compute")] == pytest.approx(0.008)
    assert shares[("[kernel.kallsyms]", "irqentry_exit_to_user_mode")] == pytest.approx(0.003)
    assert len(shares) == 5  # headers and blank lines are not rows


def test_step_time_comes_from_the_job_wide_rate_of_the_sampled_lines() -> None:
    lines = ["[0] step 300/1000000  loss 1.6  12000.0 images/s (exchange 15%)  elapsed 0:00:03",
             "[0] some other line",
             "[0] step 400/1000000  loss 1.5  13600.0 images/s (exchange 14%)  elapsed 0:00:04"]
    # 2 workers x 64 images per step at a mean of 12,800 images/s: 10 ms a step.
    assert step_ms_from(lines, workers=2) == pytest.approx(10.0)
    with pytest.raises(RuntimeError, match="no progress line"):
        step_ms_from(["[0] first step compiled in 0.2 s"], workers=1)


def test_comparison_puts_what_grew_most_first_in_milliseconds_per_step() -> None:
    alone = {"step_ms": 8.0, "shares": {("libc.so.6", "memmove"): 0.05, (JIT, JIT): 0.5}}
    worker = {"step_ms": 10.0, "shares": {("libc.so.6", "memmove"): 0.06,
                                          ("numpy.so", "FLOAT_add"): 0.04, (JIT, JIT): 0.45}}
    rows = compare(alone, worker)
    # JIT'd code: 0.45 x 10 - 0.5 x 8 = +0.5 ms; the add: +0.4 ms; memmove: 0.6 - 0.4 = +0.2.
    functions = [(r["where"], round(r["more ms"], 6)) for r in rows["functions"]]
    assert functions == [(f"{JIT} ({JIT})", 0.5), ("FLOAT_add (numpy.so)", 0.4),
                         ("memmove (libc.so.6)", 0.2)]
    libraries = [(r["where"], round(r["more ms"], 6)) for r in rows["libraries"]]
    assert libraries == [(JIT, 0.5), ("numpy.so", 0.4), ("libc.so.6", 0.2)]
    assert rows["libraries"][1]["one process ms"] == 0.0  # not in the one-process profile


# perf script -F ip,sym of five samples, innermost frame first (as perf prints them).
_CONTEXT = "(tensorflow::OpKernelContext*)"
_UPDATE = f"tensorflow::ApplyKerasMomentumOp<Eigen::ThreadPoolDevice, float>::Compute{_CONTEXT}"
_ADD = ("tensorflow::BinaryOp<Eigen::ThreadPoolDevice, tensorflow::functor::add<float> >"
        f"::Compute{_CONTEXT}")
_SAMPLES = [
    ["std::_Function_handler<void (long, long), Eigen::internal::TensorExecutor<...>",
     "tensorflow::functor::ApplyKerasMomentum<Eigen::ThreadPoolDevice, float>::operator()",
     _UPDATE, "tensorflow::ThreadPoolDevice::Compute(tensorflow::OpKernel*, ...)"],
    ["Eigen::internal::EvalRange<...>::run", _ADD, _UPDATE],
    ["[unknown]", "[unknown]"],
    ["FLOAT_add_X86_V3", "generic_wrapped_legacy_loop"],
    ["__memmove_avx512_unaligned_erms",
     f"tfscale::(anonymous namespace)::NodeAllReduce<float>::Compute{_CONTEXT}"],
]
STACKS = "\n" + "".join(
    "".join(f"\t    7f3a2b1c{k:04x} {frame}\n" for k, frame in enumerate(sample)) + "\n"
    for sample in _SAMPLES)


def test_samples_count_for_the_innermost_tensorflow_kernel_in_their_stack() -> None:
    ops = parse_ops(STACKS)
    # The second sample ran in the add's kernel, the op nearest its leaf; the JIT'd and the
    # NumPy sample name no op; the copy in tfscale's exchange names its kernel's class.
    assert ops == {"ApplyKerasMomentumOp": 0.2, "BinaryOp": 0.2, NO_OP: 0.4,
                   "NodeAllReduce": 0.2}
    assert parse_ops("\n\n") == {}


def test_ops_are_compared_like_functions_when_both_runs_have_them() -> None:
    alone = {"step_ms": 10.0, "shares": {}, "ops": {"ApplyKerasMomentumOp": 0.08, NO_OP: 0.92}}
    worker = {"step_ms": 12.5, "shares": {}, "ops": {"ApplyKerasMomentumOp": 0.12, NO_OP: 0.88}}
    rows = compare(alone, worker)["ops"]
    # The update: 0.12 x 12.5 - 0.08 x 10 = +0.7 ms; the rest: 11 - 9.2 = +1.8 ms.
    assert [(r["where"], round(r["more ms"], 6)) for r in rows] == [
        (NO_OP, 1.8), ("ApplyKerasMomentumOp", 0.7)]
    assert compare({"step_ms": 1.0, "shares": {}}, {"step_ms": 1.0, "shares": {}})["ops"] == []
