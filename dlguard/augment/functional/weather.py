"""Fog and rain: batched on the device, per-sample parameters, differentiable in the image (SPEC §2).

Each effect is split into a random *layer* drawn once per image (a depth field, a streak map) and
a pure, differentiable composition with the image, so parameters can be stored and replayed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F

from dlguard._random import keyed_uniform
from dlguard.augment.functional._inputs import check_image_input, reads_values
from dlguard.augment.functional._params import check_keys, per_sample

__all__ = [
    "FOG_DENSITY",
    "RAIN_BLUR",
    "RAIN_DARKENING",
    "RAIN_DROPS",
    "RAIN_LENGTH",
    "fog",
    "plasma_field",
    "rain",
    "rain_streaks",
]

# The five severities of RandomFog, RandomRain and the "fog" and "rain" properties: entry s - 1 is severity s.
FOG_DENSITY: tuple[float, ...] = (0.6, 1.0, 1.5, 2.1, 2.8)
"""Fog's scattering coefficient ``β`` (``density`` of :func:`fog`) at severities 1-5."""
RAIN_DROPS: tuple[float, ...] = (0.004, 0.008, 0.013, 0.02, 0.03)
"""Rain's drops per pixel (``density`` of :func:`rain_streaks`) at severities 1-5."""
RAIN_LENGTH: tuple[float, ...] = (0.04, 0.05, 0.065, 0.08, 0.1)
"""Rain's streak length as a fraction of the image height at severities 1-5."""
RAIN_DARKENING: tuple[float, ...] = (0.95, 0.9, 0.85, 0.79, 0.72)
"""Rain's scene multiplier (``darkening`` of :func:`rain`) at severities 1-5."""
RAIN_BLUR: tuple[float, ...] = (0.3, 0.45, 0.6, 0.8, 1.0)
"""Rain's vertical blur width (``blur_sigma`` of :func:`rain`) at severities 1-5."""

# salts of the keyed draws, one per draw site (and per octave of the plasma field), so that no two
# draws for the same key share numbers
_PLASMA_SALT = 0x706C_0000  # + octave
_RAIN_SALTS = {"y": 0x7261_0001, "x": 0x7261_0002, "brightness": 0x7261_0003}


def plasma_field(
    batch: int,
    height: int,
    width: int,
    roughness: float = 0.55,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    keys: Tensor | None = None,
) -> Tensor:
    """Smooth random fields ``(B, 1, H, W)`` in ``[0, 1]``: octaves of noise (a plasma-like fractal).

    The batched counterpart of the plasma fractal ImageNet-C fog uses: octave ``o`` adds a
    ``(2^o + 1)²`` grid of uniform noise weighted ``roughness^o``. The octaves are summed up a
    pyramid (each level bilinearly upsampled to the next) and upsampled to ``(H, W)`` once.

    Args:
        batch: number of fields.
        height: field height.
        width: field width.
        roughness: weight ratio of successive octaves.
        generator: random generator (CPU) for the noise; default the global RNG on ``device``.
        device: device of the fields (default: the keys' device, or the CPU).
        keys: ``(B,)`` integer keys, one per input (:mod:`dlguard._random`): field ``b`` is then fixed
            by ``keys[b]`` alone (:func:`~dlguard._random.keyed_uniform`, one salt per octave),
            whatever batch or process it is drawn in. Exclusive with ``generator``.

    Example:
        >>> field = plasma_field(2, 32, 48, generator=torch.Generator().manual_seed(0))
        >>> field.shape, bool(field.min() >= 0), bool(field.max() <= 1), bool(field.std() > 0.05)
        (torch.Size([2, 1, 32, 48]), True, True, True)
        >>> keyed = plasma_field(2, 32, 48, keys=torch.tensor([5, 9]))
        >>> torch.equal(plasma_field(1, 32, 48, keys=torch.tensor([9]))[0], keyed[1])
        True
    """
    octaves = max(1, math.ceil(math.log2(max(height, width))) - 1)
    if keys is not None:
        if generator is not None:
            raise ValueError("keys: pass keys or a generator, not both")
        keys = check_keys(keys, batch).to(device if device is not None else keys.device)
        device = keys.device
    source = "cpu" if generator is not None else device

    def draw(octave: int, side: int) -> Tensor:
        if keys is None:
            return torch.rand(batch, 1, side, side, generator=generator, device=source)
        return keyed_uniform(keys, (1, side, side), salt=_PLASMA_SALT + octave)

    field = draw(0, 2)
    for octave in range(1, octaves):
        side = 2**octave + 1
        noise = draw(octave, side)
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
        >>> torch.allclose(out, torch.full_like(out, 0.5))  # half the light is scattered airlight
        True
    """
    check_image_input(images)
    batch = images.shape[0]
    if depth.ndim != 4 or depth.shape[1] != 1 or depth.shape[-2:] != images.shape[-2:]:
        raise ValueError(f"depth: expected (B, 1, {images.shape[-2]}, {images.shape[-1]}), got {tuple(depth.shape)}")
    beta = per_sample("density", density, batch, images).view(-1, 1, 1, 1)
    light = per_sample("airlight", airlight, batch, images).view(-1, 1, 1, 1)
    if reads_values() and ((beta < 0).any() or (light < 0).any() or (light > 1).any()):
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
    keys: Tensor | None = None,
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
        generator: random generator (CPU) for the drops; default the global RNG.
        keys: ``(B,)`` integer keys, one per map (:mod:`dlguard._random`): drop ``j`` of map ``b`` is
            then fixed by ``keys[b]`` and ``j`` alone (:func:`~dlguard._random.keyed_uniform`, one
            salt per drawn quantity), whatever batch or process it is drawn in. Exclusive with
            ``generator``.

    Example:
        >>> density, length, angle = torch.tensor([0.01, 0.02]), torch.tensor([9.0, 9.0]), torch.tensor([10.0, -10.0])
        >>> s = rain_streaks(2, 32, 32, density, length, angle)
        >>> s.shape, bool(s.max() <= 1), bool((s > 0).float().mean() > 0.05)
        (torch.Size([2, 1, 32, 32]), True, True)
        >>> keyed = rain_streaks(2, 32, 32, density, length, angle, keys=torch.tensor([5, 9]))
        >>> alone = rain_streaks(1, 32, 32, density[1:], length[1:], angle[1:], keys=torch.tensor([9]))
        >>> torch.equal(alone[0], keyed[1])
        True
    """
    if keys is not None:
        if generator is not None:
            raise ValueError("keys: pass keys or a generator, not both")
        keys = check_keys(keys, batch).to(density.device)
    counts = (density * height * width).round().long()
    drops = int(counts.max()) if batch else 0  # host syncs; RandomRain knows both sizes from its severities
    half = math.ceil(float(length.max()) / 2) if drops else 0
    return _streak_maps(batch, height, width, density, length, angle, drops, half, generator, keys)


def _streak_maps(
    batch: int,
    height: int,
    width: int,
    density: Tensor,
    length: Tensor,
    angle: Tensor,
    drops: int,
    half: int,
    generator: torch.Generator | None = None,
    keys: Tensor | None = None,
) -> Tensor:
    """:func:`rain_streaks` given upper bounds on the drops per map and on half a streak's steps (no host sync).

    Drops past a map's count and steps past a streak's length weigh 0, so any bounds at least the
    actual sizes give the same maps (with keys; other random draws depend on the bounds).
    """
    device, dtype = density.device, density.dtype
    if drops == 0:
        return torch.zeros(batch, 1, height, width, device=device, dtype=dtype)
    counts = (density * height * width).round().long()
    if keys is None:
        source = "cpu" if generator is not None else device
        draws = torch.rand(3, batch, drops, generator=generator, device=source).to(device=device, dtype=dtype)
    else:  # drop j of a map depends on (key, j, salt) only, not on how many drops its batch needs
        draws = torch.stack(
            [keyed_uniform(keys, (drops,), _RAIN_SALTS[site], dtype) for site in ("y", "x", "brightness")]
        )
    y0, x0, bright = draws[0] * height, draws[1] * width, 0.5 + 0.5 * draws[2]
    real = torch.arange(drops, device=device) < counts.view(-1, 1)
    return _draw_streaks(y0, x0, bright * real, length, angle, height, width, half)


def _draw_streaks(
    y0: Tensor,
    x0: Tensor,
    bright: Tensor,
    length: Tensor,
    angle: Tensor,
    height: int,
    width: int,
    half: int | None = None,
) -> Tensor:
    """Splat segments through drops at ``(y0, x0)`` ``(B, N)`` with brightness ``bright`` (0: none).

    ``half``: steps on each side of a drop, at least ``⌈max(length)/2⌉`` (default: that, one host sync).
    """
    batch = y0.shape[0]
    device, dtype = y0.device, y0.dtype
    if half is None:
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
    # a scatter-add into a buffer of known size (bincount would read the largest index: a host sync)
    streaks = torch.zeros(batch * height * width, device=device, dtype=dtype).index_add_(0, flat, weights)
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
    check_image_input(images)
    batch = images.shape[0]
    if streaks.shape != (batch, 1, *images.shape[-2:]):
        raise ValueError(f"streaks: expected {(batch, 1, *images.shape[-2:])}, got {tuple(streaks.shape)}")
    sigma = per_sample("blur_sigma", blur_sigma, batch, images)
    if reads_values() and (sigma <= 0).any():
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
