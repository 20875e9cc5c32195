"""Which compute precision the hardware runs natively: ``--precision=auto`` and the warning for
an explicit mixed precision that the hardware only emulates.

Mixed precision is a speed-up only where the device computes in the low-precision type: measured
ResNet-50 training with ``mixed_bfloat16`` was 1.32x faster than float32 on a CPU with bf16
instructions and about 10x slower on an AVX2-only AMD EPYC (which converts every bf16 operand in
software). So:

- GPUs (the first one decides): bfloat16 from compute capability 8.0 (Ampere), float16 from 7.0
  (Volta/Turing tensor cores), float32 below.
- CPUs: bfloat16 with x86-64's AVX512_BF16 or AMX-BF16 instructions or Arm's BF16 extension
  (``bf16`` in an aarch64 ``/proc/cpuinfo``'s Features: Neoverse V1/V2, e.g. AWS Graviton3/4,
  where TensorFlow's oneDNN/ACL kernels use it; not Graviton2); float16 is never native on CPUs
  TensorFlow supports; float32 otherwise.

:func:`detect` reads the machine (``/proc/cpuinfo``; TensorFlow's GPU list, so it imports
TensorFlow); :func:`resolve` is a pure function of a :class:`Hardware` description, for tests
and for other machines' descriptions.
"""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86-64's two; aarch64's Features
# Instruction-set flags that decide compute speed: x86-64's vector/matrix ones, aarch64's (not
# "sme": on x86-64 that names AMD's memory encryption).
VECTOR_FLAG_PREFIXES = ("avx", "amx", "fma", "asimd", "sve", "bf16", "i8mm")
NATIVE = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What decides the precision: the CPU's model and flags, each GPU's compute capability."""

    cpu_model: str = ""
    cpu_flags: frozenset[str] = frozenset()
    gpu_capabilities: tuple[tuple[int, int], ...] = ()

    @property
    def native(self) -> tuple[str, ...]:
        """The low-precision types the training device computes natively."""
        if self.gpu_capabilities:
            major, minor = self.gpu_capabilities[0]
            if (major, minor) >= (8, 0):
                return ("bfloat16", "float16")
            return ("float16",) if major >= 7 else ()
        return ("bfloat16",) if self.cpu_flags.intersection(CPU_BF16_FLAGS) else ()

    def describe(self) -> str:
        """One line naming the device and what it computes natively."""
        if self.gpu_capabilities:
            major, minor = self.gpu_capabilities[0]
            device = f"GPU with compute capability {major}.{minor}"
        else:
            wide = vector_flags(self.cpu_flags)
            device = f"CPU {self.cpu_model or 'unknown'} ({wide or 'no vector flags read'})"
        native = " and ".join(self.native) or "neither bfloat16 nor float16"
        return f"{device}: computes {native} natively"


def resolve(requested: str, hardware: Hardware) -> tuple[str, str]:
    """The precision to train in, and a warning ("" for none).

    Args:
        requested: ``--precision`` (``auto``, ``fp32``, ``mixed_float16``, ``mixed_bfloat16``).
        hardware: the training device.

    Returns:
        (precision, warning): ``auto`` becomes ``mixed_bfloat16``, ``mixed_float16`` or ``fp32``,
        in that order of preference, by what ``hardware`` computes natively. An explicit mixed
        precision is kept (the user's flag wins) with a warning when it would be emulated.
    """
    native = hardware.native
    if requested == "auto":
        if "bfloat16" in native:
            return "mixed_bfloat16", ""
        if "float16" in native:
            return "mixed_float16", ""
        return "fp32", ""
    if requested in NATIVE and NATIVE[requested] not in native:
        return requested, (
            f"--precision={requested}: this {hardware.describe()}; {NATIVE[requested]} is "
            "emulated here and may be several times slower than fp32 (--precision=auto picks "
            "what the hardware runs natively)")
    return requested, ""


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, frozenset[str]]:
    """The CPU's model name and instruction-set flags (empty flags where not readable)."""
    model, flags = platform.processor() or platform.machine(), frozenset[str]()
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return model, flags
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
        elif key.strip() in ("flags", "Features"):
            flags = frozenset(value.split())
            break
    return model, flags


def vector_flags(flags: frozenset[str]) -> str:
    """The vector, matrix and bf16 instruction-set flags among ``flags``, sorted, one line."""
    return " ".join(sorted(f for f in flags if f.startswith(VECTOR_FLAG_PREFIXES)))


def detect() -> Hardware:
    """This machine's :class:`Hardware` (imports TensorFlow to list the GPUs)."""
    import tensorflow as tf

    capabilities = []
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if capability:
            capabilities.append((int(capability[0]), int(capability[1])))
    model, flags = cpu_info()
    return Hardware(model, flags, tuple(capabilities))
