"""Blurs (box, Gaussian, median, bilateral) over kornia's filters, per-sample kernel sizes.

Images sharing a kernel size are filtered together: one kornia call per distinct size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from kornia.filters import bilateral_blur as _bilateral
from kornia.filters import box_blur as _box
from kornia.filters import filter2d_separable
from kornia.filters import gaussian_blur2d as _gaussian
from kornia.filters import median_blur as _median
from torch import Tensor

from dlguard.augment.functional._inputs import check_image_input
from dlguard.augment.functional._params import by_level

__all__ = ["bilateral_blur", "box_blur", "gaussian_blur", "median_blur"]


def _by_size(images: Tensor, size: Tensor | int, op: Callable[[Tensor, int], Tensor], odd: bool) -> Tensor:
    check_image_input(images)
    sizes = (
        torch.as_tensor(size).long().expand(len(images)) if torch.as_tensor(size).ndim == 0 else torch.as_tensor(size)
    )
    if sizes.shape != (len(images),):
        raise ValueError(f"size: expected an int or shape ({len(images)},), got {tuple(sizes.shape)}")
    if (sizes < 1).any() or (odd and (sizes % 2 == 0).any()):
        raise ValueError(f"size: expected {'odd ' if odd else ''}kernel sizes of at least 1, got {sizes.tolist()}")
    return by_level(images, sizes, lambda rows, value: op(rows, int(value))).clamp(0, 1)


def box_blur(images: Tensor, size: Tensor | int) -> Tensor:
    """Averaging blur with a ``size x size`` kernel (DeepTest: 3-6).

    Example:
        >>> round(box_blur(torch.eye(3)[None, None], 3)[0, 0, 1, 1].item(), 4)  # mean of the 3x3 window
        0.3333
    """
    return _by_size(images, size, lambda x, k: _box(x, (k, k)), odd=False)


# OpenCV's fixed kernels for cv2.GaussianBlur(img, (k, k), 0) with k = 3, 5, 7 (as DeepTest called it)
_OPENCV_SMALL_GAUSSIANS = {
    3: (0.25, 0.5, 0.25),
    5: (0.0625, 0.25, 0.375, 0.25, 0.0625),
    7: (0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125),
}


def gaussian_blur(images: Tensor, size: Tensor | int, sigma: float | None = None) -> Tensor:
    """Gaussian blur (DeepTest: 3, 5, 7), by default as OpenCV's ``GaussianBlur(img, (k, k), 0)``.

    Without ``sigma``, sizes 3, 5 and 7 use OpenCV's fixed kernels and other sizes its
    ``σ = 0.3·((k − 1)·0.5 − 1) + 0.8``.

    Example:
        >>> float(gaussian_blur(torch.eye(5)[None, None], 5).sum()) > 4.0  # mass kept up to the borders
        True
    """

    def op(x: Tensor, k: int) -> Tensor:
        if sigma is None and k in _OPENCV_SMALL_GAUSSIANS:
            kernel = torch.tensor(_OPENCV_SMALL_GAUSSIANS[k], dtype=x.dtype, device=x.device)[None]
            return filter2d_separable(x, kernel, kernel, border_type="reflect")
        s = sigma if sigma is not None else 0.3 * ((k - 1) * 0.5 - 1) + 0.8
        return _gaussian(x, (k, k), (s, s))

    return _by_size(images, size, op, odd=True)


def median_blur(images: Tensor, size: Tensor | int) -> Tensor:
    """Median blur with aperture ``size`` (DeepTest: 3, 5).

    Example:
        >>> x = torch.zeros(1, 1, 5, 5); x[0, 0, 2, 2] = 1  # a lone bright pixel is removed
        >>> median_blur(x, 3).max().item()
        0.0
    """
    return _by_size(images, size, lambda x, k: _median(x, (k, k)), odd=True)


def bilateral_blur(
    images: Tensor, size: Tensor | int = 9, sigma_color: float = 75 / 255, sigma_space: float = 75.0
) -> Tensor:
    """Edge-preserving bilateral filter (DeepTest: diameter 9, sigmaColor 75, sigmaSpace 75 in 0-255 units).

    Example:
        >>> x = torch.zeros(1, 1, 9, 9); x[..., 4:] = 1  # a step edge survives
        >>> y = bilateral_blur(x, 5)
        >>> float(y[0, 0, 4, 0]) < 0.05, float(y[0, 0, 4, 8]) > 0.95
        (True, True)
    """
    return _by_size(images, size, lambda x, k: _bilateral(x, (k, k), sigma_color, (sigma_space, sigma_space)), odd=True)
