"""Padding translation towards a grid region (D-Score's attention probe, SPEC §1)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from dlguard._validation import check_translation
from dlguard.augment.functional._inputs import check_image_input, values_trusted

__all__ = ["pad_to_region", "region_translations"]


def pad_to_region(images: Tensor, n: int, region: int | Tensor, t: int = 5) -> Tensor:
    """Push each image towards grid ``region`` by zero padding, then resize back to ``(H, W)``.

    For region ``(r, c)`` (0-based, ``region = r·n + c``): pad ``top = r·⌊H/t⌋``,
    ``bottom = (n−1−r)·⌊H/t⌋``, ``left = c·⌊W/t⌋``, ``right = (n−1−c)·⌊W/t⌋``; resize bilinear,
    antialiased. The padded size does not depend on the region, so a batch with per-sample
    regions is resized in one call.

    Args:
        images: float ``(B, C, H, W)`` in ``[0, 1]``.
        n: grid size (``>= 2``).
        region: one region for all images, or ``(B,)`` regions in ``0..n²−1``.
        t: padding step divisor (``> 1``); smaller moves further.

    Example:
        >>> import torch
        >>> dot = torch.zeros(1, 1, 30, 30); dot[..., 15, 15] = 1
        >>> moved = pad_to_region(dot, n=3, region=0, t=2)
        >>> divmod(int(moved.flatten().argmax()), 30)  # now in the top-left third
        (7, 7)
    """
    check_translation(n, t)
    check_image_input(images)
    batch, _, height, width = images.shape
    regions = torch.as_tensor(region, device=images.device).long().expand(batch) if batch else torch.zeros(0)
    if regions.numel() and (regions.min() < 0 or regions.max() >= n * n):
        raise ValueError(f"region: expected values in 0..{n * n - 1}, got {region}")
    step_h, step_w = height // t, width // t
    canvas = images.new_zeros(batch, images.shape[1], height + (n - 1) * step_h, width + (n - 1) * step_w)
    for value in regions.unique().tolist():
        rows = regions == value
        top, left = (value // n) * step_h, (value % n) * step_w
        canvas[rows, :, top : top + height, left : left + width] = images[rows]
    resized = F.interpolate(canvas, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    return resized.clamp(0, 1)


def region_translations(images: Tensor, n: int, t: int = 5) -> Tensor:
    """All ``n²`` translated copies of ``images``: ``(n², B, C, H, W)``, row-major over regions.

    Example:
        >>> import torch
        >>> region_translations(torch.rand(4, 1, 28, 28), n=3).shape
        torch.Size([9, 4, 1, 28, 28])
    """
    check_translation(n, t)
    check_image_input(images)
    regions = torch.arange(n * n, device=images.device).repeat_interleave(len(images))
    with values_trusted():  # checked above, once, rather than on the n² copies
        moved = pad_to_region(images.repeat(n * n, 1, 1, 1), n, regions, t)
    return moved.reshape(n * n, *images.shape)
