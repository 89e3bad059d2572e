"""Pixelation: an image averaged down to a fraction of its side and shown at full size again."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from dlguard.augment.functional._inputs import check_image_input
from dlguard.augment.functional._params import by_level, per_sample

__all__ = ["pixelate"]


def _pixelated(images: Tensor, loss: float) -> Tensor:
    if not 0 <= loss < 1:  # each distinct value, read once with the levels themselves
        raise ValueError(f"loss: expected values in [0, 1), got {loss}")
    height, width = images.shape[-2:]
    size = (max(1, int(height * (1 - loss) + 0.5)), max(1, int(width * (1 - loss) + 0.5)))
    return F.interpolate(F.interpolate(images, size=size, mode="area"), size=(height, width), mode="nearest")


def pixelate(images: Tensor, loss: Tensor | float) -> Tensor:
    """Pixelation: each image area-averaged to ``1 - loss`` of its side, then scaled back by nearest neighbour.

    Per-sample ``loss`` in ``[0, 1)``; one pair of interpolations per distinct value. The result keeps
    the input's range.

    Raises:
        ValueError: naming ``loss``, for a value outside ``[0, 1)``; naming ``images``, for anything but
            a float batch ``(B, C, H, W)`` in ``[0, 1]`` without NaN.

    Example:
        >>> import torch
        >>> ramp = torch.linspace(0, 1, 8).expand(1, 1, 8, 8)
        >>> [round(v, 3) for v in pixelate(ramp, 0.5)[0, 0, 0].tolist()]  # 8 pixels averaged to 4, shown twice
        [0.071, 0.071, 0.357, 0.357, 0.643, 0.643, 0.929, 0.929]
    """
    check_image_input(images)
    return by_level(images, per_sample("loss", loss, len(images), images), _pixelated)
