"""Photometric ops: brightness (additive and multiplicative), contrast, Gaussian noise.

Per-sample parameters; the output is clamped to ``[0, 1]``.
"""

from __future__ import annotations

import torch
from kornia.enhance import adjust_brightness, adjust_contrast
from torch import Tensor

from dlguard.augment.functional._checks import check_images
from dlguard.augment.functional._params import per_sample

__all__ = ["brightness_scale", "brightness_shift", "contrast", "gaussian_noise"]


def brightness_shift(images: Tensor, beta: Tensor | float) -> Tensor:
    """DeepTest brightness ``x + β`` (kornia's additive ``adjust_brightness``).

    Example:
        >>> brightness_shift(torch.full((2, 1, 1, 1), 0.5), torch.tensor([0.1, 0.9])).flatten()
        tensor([0.6000, 1.0000])
    """
    check_images(images)
    return adjust_brightness(images, per_sample("beta", beta, len(images), images), clip_output=True)


def brightness_scale(images: Tensor, beta: Tensor | float) -> Tensor:
    """The framework's brightness ``β·x`` (``β > 1`` brighter; contrast-preserving, SPEC §5).

    Example:
        >>> brightness_scale(torch.full((2, 1, 1, 1), 0.5), torch.tensor([0.5, 3.0])).flatten()
        tensor([0.2500, 1.0000])
    """
    check_images(images)
    return adjust_contrast(images, per_sample("beta", beta, len(images), images), clip_output=True)


def contrast(images: Tensor, alpha: Tensor | float) -> Tensor:
    """DeepTest contrast: gain ``α·x`` (kornia's multiplicative ``adjust_contrast``).

    Numerically the framework's ``brightness_scale``; the two are kept apart by name because the
    papers mean different things by them and use different parameter ranges.

    Example:
        >>> contrast(torch.full((1, 1, 1, 1), 0.25), 1.2).item()
        0.30000001192092896
    """
    check_images(images)
    return adjust_contrast(images, per_sample("alpha", alpha, len(images), images), clip_output=True)


def gaussian_noise(
    images: Tensor, sigma: Tensor | float, noise: Tensor | None = None, generator: torch.Generator | None = None
) -> Tensor:
    """``x + ε``, ``ε ~ N(0, σ²)`` per image (SPEC §5); pass ``noise`` (standard normal) to replay.

    Example:
        >>> out = gaussian_noise(torch.full((1, 1, 2, 2), 0.5), 0.1, noise=torch.ones(1, 1, 2, 2))
        >>> out.flatten()
        tensor([0.6000, 0.6000, 0.6000, 0.6000])
    """
    check_images(images)
    std = per_sample("sigma", sigma, len(images), images)
    if (std < 0).any():
        raise ValueError("sigma: expected non-negative standard deviations")
    if noise is None:
        noise = torch.randn(images.shape, generator=generator, device="cpu" if generator else images.device)
    elif noise.shape != images.shape:
        raise ValueError(f"noise: expected shape {tuple(images.shape)}, got {tuple(noise.shape)}")
    return (images + std.view(-1, 1, 1, 1) * noise.to(images)).clamp(0, 1)
