"""Geometric ops (translation, scale, shear, rotation) over kornia, per-sample, clamped to ``[0, 1]``.

Uncovered pixels are zero (black), as in DeepTest's OpenCV transforms.
"""

from __future__ import annotations

import torch
from kornia.geometry.transform import rotate as _rotate
from kornia.geometry.transform import scale as _scale
from kornia.geometry.transform import shear as _shear
from kornia.geometry.transform import translate as _translate
from torch import Tensor

from dlguard.augment.functional._inputs import check_image_input, reads_values
from dlguard.augment.functional._params import per_sample

__all__ = ["rotation", "scaling", "shearing", "translation"]


def translation(images: Tensor, tx: Tensor | float, ty: Tensor | float) -> Tensor:
    """Shift by ``(tx, ty)`` pixels (positive: right, down).

    Example:
        >>> x = torch.zeros(1, 1, 5, 5); x[0, 0, 2, 2] = 1
        >>> divmod(int(translation(x, 1.0, 2.0).flatten().argmax()), 5)
        (4, 3)
    """
    check_image_input(images)
    batch = len(images)
    shift = torch.stack([per_sample("tx", tx, batch, images), per_sample("ty", ty, batch, images)], dim=1)
    return _translate(images, shift, align_corners=True).clamp(0, 1)


def scaling(images: Tensor, factor: Tensor | float) -> Tensor:
    """Zoom by ``factor`` about the image centre (``> 1`` enlarges), as DeepTest's scale.

    Example:
        >>> x = torch.zeros(1, 1, 5, 5); x[0, 0, 2, 3] = 1
        >>> divmod(int(scaling(x, 2.0).flatten().argmax()), 5)  # 1 px right of centre -> 2 px
        (2, 4)
    """
    check_image_input(images)
    factor = per_sample("factor", factor, len(images), images)
    if reads_values() and (factor <= 0).any():
        raise ValueError("factor: expected positive scale factors")
    return _scale(images, torch.stack([factor, factor], dim=1), align_corners=True).clamp(0, 1)


def shearing(images: Tensor, sx: Tensor | float, sy: Tensor | float = 0.0) -> Tensor:
    """Shear ``x' = x + sx·y``, ``y' = y + sy·x`` (DeepTest shears horizontally, ``sy = 0``).

    Example:
        >>> x = torch.zeros(1, 1, 5, 5); x[0, 0, 4, 0] = 1
        >>> divmod(int(shearing(x, 0.5).flatten().argmax()), 5)
        (4, 2)
    """
    check_image_input(images)
    batch = len(images)
    factors = torch.stack([per_sample("sx", sx, batch, images), per_sample("sy", sy, batch, images)], dim=1)
    return _shear(images, factors, align_corners=True).clamp(0, 1)


def rotation(images: Tensor, degrees: Tensor | float) -> Tensor:
    """Rotate by ``degrees`` about the image centre (positive: counter-clockwise).

    Example:
        >>> x = torch.zeros(1, 1, 5, 5); x[0, 0, 2, 4] = 1
        >>> divmod(int(rotation(x, 90.0).flatten().argmax()), 5)  # right of centre -> above it
        (0, 2)
    """
    check_image_input(images)
    return _rotate(images, per_sample("degrees", degrees, len(images), images), align_corners=True).clamp(0, 1)
