"""Fog and rain: batched on the device, per-sample parameters, differentiable in the image (SPEC §2).

Each effect is split into a random *layer* drawn once per image (a depth field, a streak map) and
a pure, differentiable composition with the image, so parameters can be stored and replayed.
"""

from __future__ import annotations

import math

import torch
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
    """Smooth random fields ``(B, 1, H, W)`` in ``[0, 1]``: octaves of noise (a plasma-like fractal).

    The batched counterpart of the plasma fractal ImageNet-C fog uses: octave ``o`` adds a
    ``(2^o + 1)²`` grid of uniform noise weighted ``roughness^o``. The octaves are summed up a
    pyramid (each level bilinearly upsampled to the next) and upsampled to ``(H, W)`` once.

    Example:
        >>> field = plasma_field(2, 32, 48, generator=torch.Generator().manual_seed(0))
        >>> field.shape, bool(field.min() >= 0), bool(field.max() <= 1), bool(field.std() > 0.05)
        (torch.Size([2, 1, 32, 48]), True, True, True)
    """
    octaves = max(1, math.ceil(math.log2(max(height, width))) - 1)
    source = "cpu" if generator is not None else device
    field = torch.rand(batch, 1, 2, 2, generator=generator, device=source)
    for octave in range(1, octaves):
        side = 2**octave + 1
        noise = torch.rand(batch, 1, side, side, generator=generator, device=source)
        field = F.interpolate(field, (side, side), mode="bilinear", align_corners=True) + roughness**octave * noise
    low = field.amin(dim=(1, 2, 3), keepdim=True)
    high = field.amax(dim=(1, 2, 3), keepdim=True)
    field = (field - low) / (high - low).clamp(min=1e-12)  # normalised while small; upsampling keeps [0, 1]
    return F.interpolate(field.to(device), (height, width), mode="bilinear", align_corners=True)


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
    if (beta < 0).any() or (light < 0).any() or (light > 1).any():
        raise ValueError("density and airlight: expected density >= 0 and airlight in [0, 1]")
    transmission = torch.exp(-beta * depth.to(images))
    # J·τ + A·(1 − τ) in one fused op; a convex combination of values in [0, 1] needs no clamp
    return torch.lerp(light.expand_as(images), images, transmission)


def rain_streaks(
    batch: int,
    height: int,
    width: int,
    density: Tensor,
    length: Tensor,
    angle: Tensor,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Streak maps ``(B, 1, H, W)`` in ``[0, 1]``: drops of random brightness drawn as slanted segments.

    Each map gets ``density·H·W`` drops at uniform positions with brightness ``U(0.5, 1)``; each
    drop is splatted bilinearly (anti-aliased) at one-pixel steps along a segment of ``length``
    pixels through it, all maps at once with one scatter-add: the cost grows with drops × length,
    not with the image.

    Args:
        batch: number of maps.
        height: map height.
        width: map width.
        density: drops per pixel, per map ``(B,)``.
        length: streak length in pixels ``(B,)``.
        angle: slant in degrees from vertical ``(B,)``; positive tilts the top of a streak to the right.
        generator: random generator (CPU) for the drops.

    Example:
        >>> density, length, angle = torch.tensor([0.01, 0.02]), torch.tensor([9.0, 9.0]), torch.tensor([10.0, -10.0])
        >>> s = rain_streaks(2, 32, 32, density, length, angle)
        >>> s.shape, bool(s.max() <= 1), bool((s > 0).float().mean() > 0.05)
        (torch.Size([2, 1, 32, 32]), True, True)
    """
    device, dtype = density.device, density.dtype
    counts = (density * height * width).round().long()
    drops = int(counts.max()) if batch else 0
    if drops == 0:
        return torch.zeros(batch, 1, height, width, device=device, dtype=dtype)
    source = "cpu" if generator is not None else device
    draws = torch.rand(3, batch, drops, generator=generator, device=source).to(device=device, dtype=dtype)
    y0, x0, bright = draws[0] * height, draws[1] * width, 0.5 + 0.5 * draws[2]
    real = torch.arange(drops, device=device) < counts.view(-1, 1)
    return _draw_streaks(y0, x0, bright * real, length, angle, height, width)


def _draw_streaks(
    y0: Tensor, x0: Tensor, bright: Tensor, length: Tensor, angle: Tensor, height: int, width: int
) -> Tensor:
    """Splat segments through drops at ``(y0, x0)`` ``(B, N)`` with brightness ``bright`` (0: none)."""
    batch = y0.shape[0]
    device, dtype = y0.device, y0.dtype
    half = math.ceil(float(length.max()) / 2)
    steps = torch.arange(-half, half + 1, device=device, dtype=dtype)  # along the streak, in pixels
    theta = torch.deg2rad(angle).view(-1, 1, 1)
    ys = y0.unsqueeze(2) + steps * torch.cos(theta)
    xs = x0.unsqueeze(2) - steps * torch.sin(theta)
    weight = bright.unsqueeze(2) * (steps.abs() <= length.view(-1, 1, 1) / 2)
    image = torch.arange(batch, device=device).view(-1, 1, 1) * (height * width)
    row = ys.round()
    left = xs.floor()
    inside_row = (row >= 0) & (row < height)
    base = image + row.clamp(0, height - 1).long() * width
    pieces = []
    for dx in (0, 1):  # split each step between the two pixels across the streak (anti-aliasing)
        col = left + dx
        share = 1 - (xs - col).abs()
        inside = inside_row & (col >= 0) & (col < width)
        pieces.append((base + col.clamp(0, width - 1).long(), weight * share * inside))
    flat = torch.cat([p[0].flatten() for p in pieces])
    weights = torch.cat([p[1].flatten() for p in pieces])
    streaks = torch.bincount(flat, weights=weights, minlength=batch * height * width).to(dtype)
    return streaks.view(batch, 1, height, width).clamp(0, 1)


def rain(
    images: Tensor,
    streaks: Tensor,
    brightness: Tensor | float = 0.8,
    darkening: Tensor | float = 0.85,
    blur_sigma: Tensor | float = 0.6,
) -> Tensor:
    """Rain: a slight vertical blur and darkening of the scene, with bright streaks blended on top.

    ``I = blur(J)·darkening·(1 − s) + brightness·s`` for streak map ``s`` (per image parameters);
    ``blur`` is a vertical 3-tap Gaussian of width ``blur_sigma``, the motion blur of falling rain.

    Args:
        images: float ``(B, C, H, W)`` in ``[0, 1]``.
        streaks: ``(B, 1, H, W)`` in ``[0, 1]`` from :func:`rain_streaks`.
        brightness: streak brightness per image or one for all.
        darkening: scene multiplier in ``(0, 1]`` per image or one for all.
        blur_sigma: width ``σ`` of the scene's vertical blur, per image or one for all (``> 0``).

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
    if (sigma <= 0).any():
        raise ValueError("blur_sigma: expected positive blur widths")
    dark = per_sample("darkening", darkening, batch, images).view(-1, 1, 1, 1)
    light = per_sample("brightness", brightness, batch, images).view(-1, 1, 1, 1)
    layer = streaks.to(images)
    # I = darkening·(1 − s)·blur(J) + brightness·s, with blur(J) = w·J + (1 − w)/2·(J above + J below):
    # every per-pixel coefficient lives on the 1-channel streak map, so the image is read in
    # three full passes (neighbour sum, two multiply-adds)
    side = torch.exp(-1 / (2 * sigma * sigma)).view(-1, 1, 1, 1)
    keep = 1 / (1 + 2 * side)  # centre tap of the 3-tap Gaussian of width σ
    scene = dark * (1 - layer)
    neighbours = _vertical_neighbours(images)
    out = torch.addcmul(light * layer, images, scene * keep)
    return torch.addcmul(out, neighbours, scene * (side * keep))


def _vertical_neighbours(images: Tensor) -> Tensor:
    """``J`` above + ``J`` below each pixel, edges replicated.

    Written in place into one buffer (5x faster on CPU than concatenating shifted copies) unless
    gradients must flow to ``images``, which ``out=`` ops do not support.
    """
    if images.requires_grad and torch.is_grad_enabled():
        padded = F.pad(images, (0, 0, 1, 1), mode="replicate")
        return padded[:, :, :-2] + padded[:, :, 2:]
    neighbours = torch.empty_like(images)
    torch.add(images[:, :, :-2], images[:, :, 2:], out=neighbours[:, :, 1:-1])
    torch.add(images[:, :, :1], images[:, :, 1:2], out=neighbours[:, :, :1])
    torch.add(images[:, :, -1:], images[:, :, -2:-1], out=neighbours[:, :, -1:])
    return neighbours
