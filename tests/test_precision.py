"""--precision=auto and the emulation warning, for described machines (no hardware needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfscale.training.precision import Hardware, cpu_info, resolve

EPYC_AVX2 = Hardware("AMD EPYC 7B13", frozenset({"avx", "avx2", "fma"}))
SAPPHIRE_RAPIDS = Hardware("Intel Xeon Platinum 8480+",
                           frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))
COOPER_LAKE = Hardware("Intel Xeon 8380H", frozenset({"avx2", "avx512f", "avx512_bf16"}))
SKYLAKE = Hardware("Intel Xeon Gold 6148", frozenset({"avx2", "avx512f"}))
# aarch64 Features lines as Linux prints them (abridged): Neoverse V1 has the BF16 extension,
# Neoverse N1 not.
GRAVITON3_FEATURES = "fp asimd aes crc32 atomics asimddp sve asimdfhm svebf16 i8mm bf16 rng"
GRAVITON2_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp lrcpc ssbs"
GRAVITON3 = Hardware("aarch64", frozenset(GRAVITON3_FEATURES.split()))
GRAVITON2 = Hardware("aarch64", frozenset(GRAVITON2_FEATURES.split()))


@pytest.mark.parametrize(("hardware", "expected"), [
    (EPYC_AVX2, "fp32"),
    (SKYLAKE, "fp32"),
    (COOPER_LAKE, "mixed_bfloat16"),
    (SAPPHIRE_RAPIDS, "mixed_bfloat16"),
    (GRAVITON3, "mixed_bfloat16"),
    (GRAVITON2, "fp32"),
    (Hardware(gpu_capabilities=((9, 0),)), "mixed_bfloat16"),  # H100
    (Hardware(gpu_capabilities=((8, 0),)), "mixed_bfloat16"),  # A100
    (Hardware(gpu_capabilities=((7, 0),)), "mixed_float16"),  # V100 (Summit)
    (Hardware(gpu_capabilities=((7, 5),)), "mixed_float16"),  # T4
    (Hardware(gpu_capabilities=((6, 0),)), "fp32"),  # P100
    # The GPU trains, so a bf16-capable host CPU does not matter.
    (Hardware("x", frozenset({"avx512_bf16"}), ((7, 0),)), "mixed_float16"),
])
def test_auto_picks_what_the_hardware_computes_natively(hardware: Hardware,
                                                        expected: str) -> None:
    assert resolve("auto", hardware) == (expected, "")


def test_explicit_mixed_precision_on_emulating_hardware_warns_and_is_kept() -> None:
    precision, warning = resolve("mixed_bfloat16", EPYC_AVX2)
    assert precision == "mixed_bfloat16"  # the user's flag wins
    assert "--precision=mixed_bfloat16" in warning
    assert "AMD EPYC 7B13" in warning and "bfloat16 is emulated" in warning
    precision, warning = resolve("mixed_bfloat16", GRAVITON2)
    assert "bfloat16 is emulated" in warning and "asimd" in warning  # the flags it read
    precision, warning = resolve("mixed_float16", Hardware(gpu_capabilities=((6, 0),)))
    assert precision == "mixed_float16" and "compute capability 6.0" in warning


@pytest.mark.parametrize(("requested", "hardware"), [
    ("fp32", EPYC_AVX2), ("mixed_bfloat16", SAPPHIRE_RAPIDS),
    ("mixed_float16", Hardware(gpu_capabilities=((7, 0),))),
    ("mixed_bfloat16", Hardware(gpu_capabilities=((8, 6),))),
])
def test_native_or_fp32_choices_do_not_warn(requested: str, hardware: Hardware) -> None:
    assert resolve(requested, hardware) == (requested, "")


def test_cpu_info_reads_model_and_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n"
                       "flags\t\t: fpu avx avx2 fma\n\nprocessor\t: 1\n")
    assert cpu_info(cpuinfo) == ("AMD EPYC 7B13", frozenset({"fpu", "avx", "avx2", "fma"}))
    # aarch64 has no model name line; its flags are the Features line.
    cpuinfo.write_text(f"processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: {GRAVITON3_FEATURES}\n"
                       "CPU implementer\t: 0x41\nCPU part\t: 0xd40\n")
    model, flags = cpu_info(cpuinfo)
    assert resolve("auto", Hardware(model, flags)) == ("mixed_bfloat16", "")
    model, flags = cpu_info(tmp_path / "missing")
    assert flags == frozenset()
