"""Input checks of the OpenCV object ops (and of the follow-up cache built on them), and their thread count.

Unlike the checks of :mod:`dlguard.augment.functional._inputs`, these always read values: the object ops
convert to NumPy anyway, and the cache checks once per call before it looks anything up.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from dlguard._validation import check_tensor, check_values, positive_int


def check_object_images(name: str, images: object) -> Tensor:
    """Floating ``(B, C, H, W)`` images in ``[0, 1]`` with ``C`` in ``{1, 3}``."""
    images = check_tensor(name, images, floating=True)
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"{name}: expected images (B, C, H, W) with C in {{1, 3}}, got shape {tuple(images.shape)}")
    check_values(name, images)
    return images


def check_object_masks(name: str, masks: object, images: Tensor) -> Tensor:
    """Bool ``(B, H, W)`` object masks of ``images``, none empty."""
    expected = (images.shape[0], *images.shape[2:])
    if not isinstance(masks, Tensor) or masks.dtype != torch.bool or tuple(masks.shape) != expected:
        got = f"{masks.dtype} {tuple(masks.shape)}" if isinstance(masks, Tensor) else type(masks).__name__
        raise ValueError(f"{name}: expected a bool tensor (B, H, W) = {expected} matching the images, got {got}")
    if len(masks):
        empty = (~masks.flatten(1).any(1)).nonzero().flatten()
        if len(empty):
            raise ValueError(
                f"{name}: the mask of image {int(empty[0])} is empty (no object); every image needs its object "
                f"marked ({len(empty)} empty in all)"
            )
    return masks


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
