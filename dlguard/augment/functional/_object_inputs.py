"""Input checks of the OpenCV object ops' backgrounds (and the follow-up cache's), and their thread count.

Unlike the checks of :mod:`dlguard.augment.functional._inputs`, these always read values: the object ops
convert to NumPy anyway, and the cache checks once per call before it looks anything up.
"""

from __future__ import annotations

import os

from torch import Tensor

from dlguard._validation import check_tensor, check_values, positive_int


def check_backgrounds(backgrounds: object, images: Tensor) -> Tensor:
    """At least one floating ``(N, 3 or C, H, W)`` background in ``[0, 1]`` of ``images``' size."""
    backgrounds = check_tensor("backgrounds", backgrounds, floating=True)
    channels = images.shape[1]
    size = tuple(images.shape[2:])
    if (
        backgrounds.ndim != 4
        or backgrounds.shape[1] not in {3, channels}
        or tuple(backgrounds.shape[2:]) != size
        or len(backgrounds) == 0
    ):
        raise ValueError(
            f"backgrounds: expected at least one background (N, 3, {size[0]}, {size[1]}) or (N, {channels}, "
            f"{size[0]}, {size[1]}) of the images' size, got shape {tuple(backgrounds.shape)}"
        )
    check_values("backgrounds", backgrounds)
    return backgrounds


def worker_count(workers: int | None, batch: int) -> int:
    """``workers`` checked; ``None``: ``min(os.cpu_count(), batch)`` (at least 1)."""
    if workers is None:
        return max(1, min(os.cpu_count() or 1, batch))
    return positive_int("workers", workers)
