"""Digits scaled and pasted into scenes: the steps that classification and detection scenes share.

A digit (uint8 ``(H, W)``, e.g. 28x28 MNIST) is scaled (bilinear, antialiased) to a square side in
``MIN_DIGIT_SIDE..MAX_DIGIT_SIDE`` pixels; its intensity is its opacity ``alpha`` in ``[0, 1]``, its
mask ``alpha > MASK_THRESHOLD`` and its box the mask's tight box (torchvision's ``xyxy`` with exclusive
``x2``, ``y2``). Digit colours have every channel at least ``0.7`` (the brightest at ``1``), above the
backgrounds' ``[0.05, 0.6]`` (:mod:`~dlguard.data.backgrounds`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from dlguard._validation import check_labels, positive_int

MIN_DIGIT_SIDE = 16
MAX_DIGIT_SIDE = 24
MASK_THRESHOLD = 0.3
_MIN_COLOUR = 0.7  # every digit colour channel is at least this (and the brightest is 1)


def _check_scene_size(size: object) -> int:
    """``size`` as the side of a scene, which must hold the smallest digit."""
    size = positive_int("size", size)
    if size < MIN_DIGIT_SIDE:
        raise ValueError(f"size: expected at least {MIN_DIGIT_SIDE} (the smallest digit side), got {size}")
    return size


def _check_digits(digits: object, labels: object, size: object) -> tuple[Tensor, Tensor, int]:
    if not isinstance(digits, Tensor):
        raise ValueError(f"digits: expected a uint8 tensor (N, 28, 28), got {type(digits).__name__}")
    if digits.dtype != torch.uint8:
        raise ValueError(f"digits: expected uint8 pixels, got {digits.dtype}")
    if digits.ndim != 3 or digits.shape[0] == 0 or digits.shape[1] < 2 or digits.shape[2] < 2:
        raise ValueError(f"digits: expected shape (N, H, W) with N >= 1, e.g. (N, 28, 28), got {tuple(digits.shape)}")
    labels = check_labels("labels", labels, num_classes=10)
    if labels.shape[0] != digits.shape[0]:
        raise ValueError(f"labels: expected {digits.shape[0]} labels (one per digit), got {labels.shape[0]}")
    return digits.cpu(), labels.long().cpu(), _check_scene_size(size)


def _scaled_digits(digits: Tensor, sides: Tensor) -> dict[int, tuple[Tensor, Tensor]]:
    """Per side ``s``: the indices of the digits scaled to ``s`` and those digits ``(n, s, s)`` in ``[0, 1]``."""
    out = {}
    pixels = digits.float().div_(255.0).unsqueeze(1)
    for side in sides.unique().tolist():
        index = (sides == side).nonzero().flatten()
        scaled = F.interpolate(pixels[index], size=(side, side), mode="bilinear", antialias=True, align_corners=False)
        out[side] = (index, scaled[:, 0].clamp_(0.0, 1.0))
    return out


def _paste(canvas: Tensor, rows: Tensor, x: Tensor, y: Tensor, patches: Tensor) -> None:
    """Write square ``patches (n, s, s)`` into ``canvas[rows]`` at top-left corners ``(x, y)``."""
    side = patches.shape[-1]
    offsets = torch.arange(side)
    ys = (y[:, None] + offsets)[:, :, None]
    xs = (x[:, None] + offsets)[:, None, :]
    canvas[rows[:, None, None], ys, xs] = patches


def _boxes_from_masks(masks: Tensor) -> Tensor:
    """Tight ``xyxy`` boxes ``(N, 4)`` of non-empty masks ``(N, H, W)``, with exclusive ``x2``, ``y2``."""
    height, width = masks.shape[-2:]
    cols, rows = masks.any(dim=1), masks.any(dim=2)
    x1 = cols.float().argmax(dim=1)
    x2 = width - cols.flip(1).float().argmax(dim=1)
    y1 = rows.float().argmax(dim=1)
    y2 = height - rows.flip(1).float().argmax(dim=1)
    return torch.stack((x1, y1, x2, y2), dim=1).float()


def _random_colours(count: int, generator: torch.Generator) -> Tensor:
    """Bright digit colours ``(count, 3)``: every channel in ``[0.7, 1]``, the brightest at 1."""
    colours = _MIN_COLOUR + (1.0 - _MIN_COLOUR) * torch.rand(count, 3, generator=generator)
    return colours / colours.amax(dim=1, keepdim=True)
