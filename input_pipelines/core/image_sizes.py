"""The sizes of a dataset's training images: what the converters record, and how to say it.

The converters add each training image's shape as stored (height, width, channels) to an
:class:`ImageSizes` (inside the per-shard statistics of
:class:`~input_pipelines.core.stats.ImageStats`), and write the whole training split's under
``image_sizes`` in ``manifest.json``; ``python -m input_pipelines.tools.stats`` writes the same
for an image folder into ``stats.json``. The trainer takes its default ``--image_size`` and
``--input_channels`` from them (:mod:`input_pipelines.core.data_shape`). Light: no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

KEY = "image_sizes"  # where manifest.json and stats.json keep the summary


class ImageSizes:
    """How many images, the range of their heights and widths, the sum of their shorter sides
    (for the mean) and how many have each channel count; mergeable, so shards can be reused."""

    def __init__(self) -> None:
        self.images = 0
        self.height: list[int] = []  # [smallest, largest], empty before the first image
        self.width: list[int] = []
        self.shorter_side_sum = 0
        self.channels: dict[int, int] = {}

    def add(self, shape: Sequence[int]) -> None:
        """Adds one image of ``shape`` ``(height, width[, channels])`` (channels 1 if left
        out)."""
        height, width = int(shape[0]), int(shape[1])
        channels = int(shape[2]) if len(shape) > 2 else 1
        self._merge(1, [height, height], [width, width], min(height, width), {channels: 1})

    def _merge(self, images: int, height: Sequence[int], width: Sequence[int],
               shorter_side_sum: int, channels: dict[int, int]) -> None:
        if not images:
            return
        self.height = _union(self.height, height)
        self.width = _union(self.width, width)
        self.images += images
        self.shorter_side_sum += shorter_side_sum
        for count, n in channels.items():
            self.channels[count] = self.channels.get(count, 0) + n

    def merge(self, saved: dict[str, Any]) -> None:
        """Adds a summary saved by :meth:`to_dict` (another shard's, say)."""
        self._merge(int(saved["images"]), saved["height"], saved["width"],
                    int(saved["shorter_side_sum"]),
                    {int(c): int(n) for c, n in saved["channels"].items()})

    def to_dict(self) -> dict[str, Any]:
        return {"images": self.images, "height": list(self.height), "width": list(self.width),
                "shorter_side_sum": self.shorter_side_sum,
                "channels": {str(c): n for c, n in sorted(self.channels.items())}}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> ImageSizes:
        sizes = cls()
        sizes.merge(saved)
        return sizes

    @property
    def uniform(self) -> bool:
        """Whether every image has the same height and width."""
        return self.height[0] == self.height[1] and self.width[0] == self.width[1]

    @property
    def shorter_side_mean(self) -> float:
        return self.shorter_side_sum / self.images

    @property
    def smallest_side(self) -> int:
        """The shortest side of any image."""
        return min(self.height[0], self.width[0])

    @property
    def largest_side(self) -> int:
        """The longest side of any image."""
        return max(self.height[1], self.width[1])

    @property
    def grayscale(self) -> bool:
        """Whether every image has one channel (or one and alpha)."""
        return max(self.channels) <= 2

    def describe(self) -> str:
        """``"32x32"`` (height x width), or ``"20-40 px high, 24-48 px wide, mean shorter side
        31 px"``."""
        if self.uniform:
            return f"{self.height[0]}x{self.width[0]}"
        return (f"{self.height[0]}-{self.height[1]} px high, {self.width[0]}-{self.width[1]} px "
                f"wide, mean shorter side {self.shorter_side_mean:.0f} px")


def _union(span: Sequence[int], other: Sequence[int]) -> list[int]:
    """The smallest ``[low, high]`` covering both spans (``span`` may be empty)."""
    if not span:
        return [int(other[0]), int(other[1])]
    return [min(span[0], int(other[0])), max(span[1], int(other[1]))]
