"""How tfscale writes a duration for people: ``H:MM:SS`` (progress lines, ETAs)."""

from __future__ import annotations


def clock(seconds: float) -> str:
    """``seconds`` as ``H:MM:SS``, rounded to the second: ``clock(3725.4) == "1:02:05"``."""
    whole = max(0, int(round(seconds)))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"
