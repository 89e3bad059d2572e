"""Photometric ops: brightness (additive and multiplicative), contrast (a gain, or lowered about the mean), noise.

Per-sample parameters. ``brightness_shift``, ``contrast`` (DeepTest's) and ``reduced_contrast`` take images
``(B, C, H, W)`` in ``[0, 1]`` and clamp to it. ``gaussian_noise`` and ``brightness_scale`` (the
comprehensive framework's) take any tensor ``(B, ...)``, e.g. 1-D signals ``(B, C, T)`` (SPEC §0):
they check the input against and clamp the output to ``value_range``, or neither when it is ``None``.
"""

from __future__ import annotations

import torch
from kornia.enhance import adjust_brightness, adjust_contrast, adjust_contrast_with_mean_subtraction
from torch import Tensor

from dlguard._validation import value_range as check_value_range
from dlguard.augment.functional._inputs import check_any_input, check_image_input, reads_values
from dlguard.augment.functional._params import per_sample

__all__ = ["brightness_scale", "brightness_shift", "contrast", "gaussian_noise", "reduced_contrast"]


def _per_input(values: Tensor, like: Tensor) -> Tensor:
    """``(B,)`` values shaped to broadcast over ``like``'s ``(B, ...)``."""
    return values.reshape(-1, *([1] * (like.ndim - 1)))


def brightness_shift(images: Tensor, beta: Tensor | float) -> Tensor:
    """DeepTest brightness ``x + β`` (kornia's additive ``adjust_brightness``).

    Example:
        >>> brightness_shift(torch.full((2, 1, 1, 1), 0.5), torch.tensor([0.1, 0.9])).flatten()
        tensor([0.6000, 1.0000])
    """
    check_image_input(images)
    return adjust_brightness(images, per_sample("beta", beta, len(images), images), clip_output=True)


def brightness_scale(
    images: Tensor, beta: Tensor | float, value_range: tuple[float, float] | None = (0.0, 1.0)
) -> Tensor:
    """The framework's brightness ``β·x`` (``β > 1`` brighter; contrast-preserving, SPEC §5) on any tensor.

    Args:
        images: float ``(B, ...)``: images ``(B, C, H, W)``, signals ``(B, C, T)``, ...
        beta: factor per input ``(B,)``, or one for all.
        value_range: ``(low, high)`` the inputs must lie in and the output is clamped to; ``None``
            for unbounded values (no check, no clamp).

    Example:
        >>> brightness_scale(torch.full((2, 1, 1, 1), 0.5), torch.tensor([0.5, 3.0])).flatten()
        tensor([0.2500, 1.0000])
        >>> brightness_scale(torch.tensor([[[-1.0, 2.0]]]), 3.0, value_range=None)  # a signal (B, C, T)
        tensor([[[-3.,  6.]]])
    """
    bounds = check_value_range("value_range", value_range)
    check_any_input(images, bounds)
    out = images * _per_input(per_sample("beta", beta, len(images), images), images)
    return out if bounds is None else out.clamp(*bounds)


def contrast(images: Tensor, alpha: Tensor | float) -> Tensor:
    """DeepTest contrast: gain ``α·x`` (kornia's multiplicative ``adjust_contrast``).

    Numerically the framework's ``brightness_scale`` on images; the two are kept apart by name
    because the papers mean different things by them and use different parameter ranges.

    Example:
        >>> round(contrast(torch.full((1, 1, 1, 1), 0.25), 1.2).item(), 4)
        0.3
    """
    check_image_input(images)
    return adjust_contrast(images, per_sample("alpha", alpha, len(images), images), clip_output=True)


def reduced_contrast(images: Tensor, reduction: Tensor | float) -> Tensor:
    """Contrast about each image's mean grey level lowered by ``reduction`` in ``[0, 1]``: a flat exposure.

    ``m + (1 - reduction)·(x - m)``, with ``m`` the image's mean grey level (kornia's
    ``adjust_contrast_with_mean_subtraction``); unlike DeepTest's :func:`contrast`, a gain ``α·x``, it
    keeps a dark image dark. ``reduction = 1`` leaves a flat grey image.

    Raises:
        ValueError: naming ``reduction``, for a value outside ``[0, 1]`` (above 1 would invert the
            contrast); naming ``images``, for anything but a float batch ``(B, C, H, W)`` in ``[0, 1]``
            without NaN. Both value checks are skipped where values are trusted, as on a guide's path.

    Example:
        >>> ramp = torch.linspace(0, 1, 5).expand(1, 1, 5, 5)  # mean 0.5
        >>> [round(v, 3) for v in reduced_contrast(ramp, 0.5)[0, 0, 0].tolist()]
        [0.25, 0.375, 0.5, 0.625, 0.75]
    """
    check_image_input(images)
    amount = per_sample("reduction", reduction, len(images), images)
    if reads_values() and (outside := (amount < 0) | (amount > 1)).any():
        shown = [round(v, 4) for v in amount[outside].unique()[:5].tolist()]
        raise ValueError(f"reduction: expected values in [0, 1], got {shown}")
    return adjust_contrast_with_mean_subtraction(images, 1 - amount)


def gaussian_noise(
    images: Tensor,
    sigma: Tensor | float,
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
    value_range: tuple[float, float] | None = (0.0, 1.0),
) -> Tensor:
    """``x + ε``, ``ε ~ N(0, σ²)`` per input (SPEC §5) on any tensor; pass ``noise`` (standard normal) to replay.

    Args:
        images: float ``(B, ...)``: images ``(B, C, H, W)``, signals ``(B, C, T)``, ...
        sigma: standard deviation per input ``(B,)``, or one for all (``>= 0``).
        noise: standard normal draws of ``images``' shape (default: drawn here).
        generator: CPU generator for the draws (default: the global RNG on ``images``' device).
        value_range: ``(low, high)`` the inputs must lie in and the output is clamped to; ``None``
            for unbounded values (no check, no clamp).

    Example:
        >>> out = gaussian_noise(torch.full((1, 1, 2, 2), 0.5), 0.1, noise=torch.ones(1, 1, 2, 2))
        >>> out.flatten()
        tensor([0.6000, 0.6000, 0.6000, 0.6000])
        >>> gaussian_noise(torch.full((1, 1, 3), 4.0), 2.0, noise=torch.ones(1, 1, 3), value_range=None)
        tensor([[[6., 6., 6.]]])
    """
    bounds = check_value_range("value_range", value_range)
    check_any_input(images, bounds)
    std = per_sample("sigma", sigma, len(images), images)
    if reads_values() and (std < 0).any():
        raise ValueError("sigma: expected non-negative standard deviations")
    if noise is None:
        noise = torch.randn(images.shape, generator=generator, device="cpu" if generator else images.device)
    elif noise.shape != images.shape:
        raise ValueError(f"noise: expected shape {tuple(images.shape)}, got {tuple(noise.shape)}")
    out = images + _per_input(std, images) * noise.to(images)
    return out if bounds is None else out.clamp(*bounds)
