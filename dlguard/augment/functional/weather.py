"""Fog and rain: batched on the device, per-sample parameters, differentiable in the image (SPEC §2).

Each effect is split into a random *layer* drawn once per image (a depth field, a streak map) and
a pure, differentiable composition with the image, so parameters can be stored and replayed.
"""

from __future__ import annotations

import math

import torch
from kornia.filters import gaussian_blur2d
from torch import Tensor
from torch.nn import functional as F

from dlguard.augment.functional._checks import check_images
from dlguard.augment.functional._params import per_sample

__all__ = ["fog", "plasma_field", "rain", "rain_streaks"]


def plasma_field(
    batch: int,
    height: int,
    width: int,
    roughness: float = 0.55,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Smooth random fields ``(B, 1, H, W)`` in ``[0, 1]``: octaves of upsampled noise (fractal).

    The batched counterpart of the plasma fractal ImageNet-C fog uses: octave ``o`` is a
    ``(2^o + 1)²`` grid of uniform noise, bilinearly upsampled and weighted ``roughness^o``.

    Example:
        >>> field = plasma_field(2, 32, 48, generator=torch.Generator().manual_seed(0))
        >>> field.shape, float(field.min()), float(field.max())
        (torch.Size([2, 1, 32, 48]), 0.0, 1.0)
    """
    octaves = max(1, math.ceil(math.log2(max(height, width))) - 1)
    field = torch.zeros(batch, 1, height, width, device=device)
    for octave in range(octaves):
        side = 2**octave + 1
        noise = torch.rand(batch, 1, side, side, generator=generator, device="cpu" if generator else device)
        field += roughness**octave * F.interpolate(noise.to(field.device), (height, width), mode="bilinear")
    low = field.amin(dim=(1, 2, 3), keepdim=True)
    high = field.amax(dim=(1, 2, 3), keepdim=True)
    return (field - low) / (high - low).clamp(min=1e-12)


def fog(images: Tensor, depth: Tensor, density: Tensor | float, airlight: Tensor | float = 0.9) -> Tensor:
    """Atmospheric scattering ``I = J·τ + A·(1 − τ)`` with transmission ``τ = exp(−density·depth)``.

    Args:
        images: ``J``, float ``(B, C, H, W)`` in ``[0, 1]``.
        depth: scene depth ``(B, 1, H, W)`` (or ``(1, 1, H, W)``), e.g. ``0.4 + 0.6·plasma_field``.
        density: scattering coefficient ``β`` per image ``(B,)`` or one for all.
        airlight: ``A`` in ``[0, 1]`` per image or one for all (near white for fog).

    Returns:
        Foggy images, differentiable with respect to ``images`` (linear in them).

    Example:
        >>> import torch
        >>> out = fog(torch.zeros(1, 3, 4, 4), torch.ones(1, 1, 4, 4), density=math.log(2), airlight=1.0)
        >>> out.unique()  # half the light is scattered airlight
        tensor([0.5000])
    """
    check_images(images)
    batch = images.shape[0]
    if depth.ndim != 4 or depth.shape[1] != 1 or depth.shape[-2:] != images.shape[-2:]:
        raise ValueError(f"depth: expected (B, 1, {images.shape[-2]}, {images.shape[-1]}), got {tuple(depth.shape)}")
    beta = per_sample("density", density, batch, images).view(-1, 1, 1, 1)
    light = per_sample("airlight", airlight, batch, images).view(-1, 1, 1, 1)
    transmission = torch.exp(-beta * depth.to(images))
    return (images * transmission + light * (1 - transmission)).clamp(0, 1)


def _line_kernels(length: Tensor, angle: Tensor, size: int) -> Tensor:
    """``(B, 1, size, size)`` normalised anti-aliased line kernels of given length and angle (degrees)."""
    coords = torch.arange(size, device=length.device, dtype=length.dtype) - (size - 1) / 2
    y, x = torch.meshgrid(coords, coords, indexing="ij")
    theta = torch.deg2rad(angle).view(-1, 1, 1)
    along = x * torch.sin(theta) + y * torch.cos(theta)  # 0° = vertical streaks
    across = x * torch.cos(theta) - y * torch.sin(theta)
    line = (1 - across.abs()).clamp(min=0) * (along.abs() <= length.view(-1, 1, 1) / 2)
    return (line / line.sum(dim=(1, 2), keepdim=True).clamp(min=1e-12)).unsqueeze(1)


def rain_streaks(
    batch: int,
    height: int,
    width: int,
    density: Tensor,
    length: Tensor,
    angle: Tensor,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Streak maps ``(B, 1, H, W)`` in ``[0, 1]``: sparse drops smeared by a slanted line kernel.

    Args:
        batch: number of maps.
        height: map height.
        width: map width.
        density: fraction of pixels that start a drop, per map ``(B,)``.
        length: streak length in pixels ``(B,)``.
        angle: slant in degrees from vertical ``(B,)``.
        generator: random generator (CPU) for the drops.

    Example:
        >>> density, length, angle = torch.tensor([0.01, 0.02]), torch.tensor([9.0, 9.0]), torch.tensor([10.0, -10.0])
        >>> s = rain_streaks(2, 32, 32, density, length, angle)
        >>> s.shape, bool(s.max() <= 1), bool((s > 0).float().mean() > 0.05)
        (torch.Size([2, 1, 32, 32]), True, True)
    """
    device = density.device
    drops = torch.rand(batch, 1, height, width, generator=generator, device="cpu" if generator else device)
    drops = (drops.to(device) < density.view(-1, 1, 1, 1)).to(density.dtype)
    size = int(length.max().item()) | 1
    kernels = _line_kernels(length, angle, size).to(density.dtype)
    # one grouped convolution smears every map with its own kernel
    smeared = F.conv2d(drops.view(1, batch, height, width), kernels, padding=size // 2, groups=batch)
    streaks = smeared.view(batch, 1, height, width) * length.view(-1, 1, 1, 1).clamp(min=1) / 2
    return streaks.clamp(0, 1)


def rain(
    images: Tensor,
    streaks: Tensor,
    brightness: Tensor | float = 0.8,
    darkening: Tensor | float = 0.85,
    blur_sigma: Tensor | float = 0.6,
) -> Tensor:
    """Rain: a slight blur and darkening of the scene, with bright streaks blended on top.

    ``I = blur(J)·darkening·(1 − s) + brightness·s`` for streak map ``s`` (per image parameters).

    Args:
        images: float ``(B, C, H, W)`` in ``[0, 1]``.
        streaks: ``(B, 1, H, W)`` in ``[0, 1]`` from :func:`rain_streaks`.
        brightness: streak brightness per image or one for all.
        darkening: scene multiplier in ``(0, 1]`` per image or one for all.
        blur_sigma: Gaussian blur of the scene in pixels per image or one for all (``> 0``).

    Example:
        >>> import torch
        >>> out = rain(torch.full((1, 1, 8, 8), 0.5), torch.zeros(1, 1, 8, 8), darkening=0.8)
        >>> round(float(out.mean()), 3)
        0.4
    """
    check_images(images)
    batch = images.shape[0]
    if streaks.shape != (batch, 1, *images.shape[-2:]):
        raise ValueError(f"streaks: expected {(batch, 1, *images.shape[-2:])}, got {tuple(streaks.shape)}")
    sigma = per_sample("blur_sigma", blur_sigma, batch, images)
    sigma = torch.stack([sigma, sigma], dim=1)
    size = 2 * math.ceil(3 * float(sigma.max())) + 1
    blurred = gaussian_blur2d(images, (size, size), sigma, border_type="replicate")
    dark = per_sample("darkening", darkening, batch, images).view(-1, 1, 1, 1)
    light = per_sample("brightness", brightness, batch, images).view(-1, 1, 1, 1)
    layer = streaks.to(images)
    return (blurred * dark * (1 - layer) + light * layer).clamp(0, 1)
