"""Backgrounds of the digit scenes: crops of two sample photos and eight procedural textures; no download.

A background is an RGB image ``(3, S, S)`` of one of ten kinds (:data:`BACKGROUND_KINDS`): random crops
of scikit-learn's two sample photos, or one of eight procedural textures (stripes, checker, dots, ...)
with a random phase and scale, each texture with its own palette jittered per background. Backgrounds
are kept in ``[0.05, 0.6]``, below the bright digit colours of :mod:`~dlguard.data.scenes`, so a digit
stays visible on every kind. The road images of :mod:`~dlguard.data.roads` texture their ground with them.

Every random choice comes from ``torch.Generator`` objects seeded from ``seed``: the same seed gives
identical tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from dlguard._validation import positive_int
from dlguard.data._seeds import _check_seed, _seed_for

__all__ = ["BACKGROUND_KINDS", "scene_backgrounds"]

BACKGROUND_KINDS: tuple[str, ...] = (
    "china",
    "flower",
    "stripes",
    "checker",
    "dots",
    "waves",
    "noise",
    "gradient",
    "grid",
    "plaid",
)
"""The ten background kinds; a kind's index is its position (``spurious`` pairs kind ``k`` with digit ``k``)."""

_BACKGROUND_RANGE = (0.05, 0.6)  # every background lies in this range
_PHOTO_RANGE = (0.05, 0.5)  # photos are scaled into this range (the china photo's sky is bright)

# two colours per texture: the pattern mixes them (jittered per background by ±0.04 per channel)
_PALETTES: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "stripes": ((0.08, 0.12, 0.40), (0.30, 0.40, 0.58)),  # navy / steel blue
    "checker": ((0.45, 0.08, 0.08), (0.58, 0.42, 0.30)),  # dark red / tan
    "dots": ((0.08, 0.30, 0.10), (0.45, 0.55, 0.15)),  # dark green / olive
    "waves": ((0.05, 0.25, 0.30), (0.15, 0.50, 0.52)),  # teal
    "noise": ((0.10, 0.10, 0.10), (0.55, 0.55, 0.55)),  # colour confetti around grey
    "gradient": ((0.38, 0.08, 0.45), (0.58, 0.35, 0.08)),  # purple to orange
    "grid": ((0.44, 0.40, 0.24), (0.12, 0.10, 0.05)),  # beige paper, dark brown lines
    "plaid": ((0.45, 0.08, 0.28), (0.10, 0.20, 0.45)),  # magenta and blue bands
}


@functools.lru_cache(maxsize=1)
def _sample_photos() -> tuple[Tensor, Tensor]:
    """scikit-learn's two sample photos ("china", "flower") as float ``(3, 427, 640)`` in ``[0, 1]``."""
    from sklearn.datasets import load_sample_images

    china, flower = load_sample_images().images
    return tuple(torch.from_numpy(np.array(p)).permute(2, 0, 1).float().div_(255.0) for p in (china, flower))


@functools.lru_cache(maxsize=16)
def _photo(index: int, size: int) -> Tensor:
    """Photo ``index`` downscaled (antialiased) to a height of ``2.5·size``, scaled into the background range."""
    photo = _sample_photos()[index]
    height = min(photo.shape[1], round(2.5 * size))
    width = round(photo.shape[2] * height / photo.shape[1])
    small = F.interpolate(photo[None], size=(height, width), mode="bilinear", antialias=True, align_corners=False)[0]
    low, high = _PHOTO_RANGE
    return (low + (high - low) * small.clamp(0.0, 1.0)).contiguous()


def _photo_crops(index: int, count: int, size: int, generator: torch.Generator) -> Tensor:
    """``count`` random square crops (side ``size`` to ``2·size`` of the downscaled photo, random flip)."""
    photo = _photo(index, size)
    height, width = photo.shape[1:]
    side = size * (1.0 + torch.rand(count, generator=generator))
    side = torch.minimum(side, torch.tensor(float(height)))
    x0 = torch.rand(count, generator=generator) * (width - side)
    y0 = torch.rand(count, generator=generator) * (height - side)
    flip = torch.rand(count, generator=generator) < 0.5
    # sample at pixel centres of each crop, in grid_sample's normalised coordinates (align_corners=False)
    steps = (torch.arange(size, dtype=torch.float32) + 0.5) / size  # (S,)
    xs = x0[:, None] + side[:, None] * torch.where(flip[:, None], 1.0 - steps, steps)  # (n, S)
    ys = y0[:, None] + side[:, None] * steps  # (n, S)
    gx = (2.0 * xs / width - 1.0)[:, None, :].expand(count, size, size)
    gy = (2.0 * ys / height - 1.0)[:, :, None].expand(count, size, size)
    grid = torch.stack((gx, gy), dim=-1).reshape(1, count * size, size, 2)
    out = F.grid_sample(photo[None], grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out[0].reshape(3, count, size, size).permute(1, 0, 2, 3)


def _texture(name: str, count: int, size: int, generator: torch.Generator) -> Tensor:
    """``count`` backgrounds ``(count, 3, S, S)`` of procedural texture ``name`` with random phase/scale/jitter."""
    g = generator
    first, second = (torch.tensor(c) for c in _PALETTES[name])
    c0 = (first + 0.08 * (torch.rand(count, 3, generator=g) - 0.5))[:, :, None, None]
    c1 = (second + 0.08 * (torch.rand(count, 3, generator=g) - 0.5))[:, :, None, None]
    coords = torch.arange(size, dtype=torch.float32)
    y, x = coords[None, :, None], coords[None, None, :]  # broadcast against (count, 1, 1) parameters

    def draw(low: float, high: float) -> Tensor:
        return (low + (high - low) * torch.rand(count, generator=g))[:, None, None]

    if name == "stripes":  # sharp stripes at a random angle, period 5-9 px
        angle, period, phase = draw(0.0, np.pi), draw(5.0, 9.0), draw(0.0, 2 * np.pi)
        wave = torch.sin(2 * np.pi * (x * torch.cos(angle) + y * torch.sin(angle)) / period + phase)
        t = (0.5 + 2.0 * wave).clamp(0.0, 1.0)
    elif name == "checker":  # checkerboard, cells 3-7 px
        cell, ox, oy = draw(3.0, 7.0), draw(0.0, 8.0), draw(0.0, 8.0)
        t = (torch.floor((x + ox) / cell) + torch.floor((y + oy) / cell)).remainder(2.0)
    elif name == "dots":  # polka dots on a lattice 6-9 px apart
        spacing, ox, oy = draw(6.0, 9.0), draw(0.0, 9.0), draw(0.0, 9.0)
        radius = spacing * draw(0.25, 0.38)
        dx = (x + ox).remainder(spacing) - spacing / 2
        dy = (y + oy).remainder(spacing) - spacing / 2
        t = (radius + 0.5 - torch.sqrt(dx**2 + dy**2)).clamp(0.0, 1.0)
    elif name == "waves":  # smooth wavy bands
        angle, period, phase = draw(0.0, np.pi), draw(8.0, 14.0), draw(0.0, 2 * np.pi)
        amplitude, wobble = draw(1.0, 2.5), draw(10.0, 20.0)
        u = x * torch.cos(angle) + y * torch.sin(angle)
        v = -x * torch.sin(angle) + y * torch.cos(angle)
        t = 0.5 + 0.5 * torch.sin(2 * np.pi * u / period + amplitude * torch.sin(2 * np.pi * v / wobble) + phase)
    elif name == "noise":  # independent colour noise per pixel and channel
        t = torch.rand(count, 3, size, size, generator=g)
        return c0 + t * (c1 - c0)
    elif name == "gradient":  # linear ramp in a random direction
        angle = draw(0.0, 2 * np.pi)
        u = (x - size / 2) * torch.cos(angle) + (y - size / 2) * torch.sin(angle)
        t = (u / size + 0.5).clamp(0.0, 1.0)
    elif name == "grid":  # one-pixel lines every 5-8 px
        spacing, ox, oy = draw(5.0, 8.0), draw(0.0, 8.0), draw(0.0, 8.0)
        t = (((x + ox).remainder(spacing) < 1.0) | ((y + oy).remainder(spacing) < 1.0)).float()
    elif name == "plaid":  # crossing horizontal and vertical bands
        period_x, period_y, ox, oy = draw(6.0, 10.0), draw(6.0, 10.0), draw(0.0, 10.0), draw(0.0, 10.0)
        bands_x = ((x + ox).remainder(period_x) < period_x / 2).float()
        bands_y = ((y + oy).remainder(period_y) < period_y / 2).float()
        t = 0.5 * (bands_x + bands_y)
    else:  # pragma: no cover - the names come from BACKGROUND_KINDS
        raise AssertionError(name)
    t = t.expand(count, size, size)[:, None]
    return c0 + t * (c1 - c0)


def _check_kinds(kinds: Tensor | Sequence[int], count: int) -> Tensor:
    if isinstance(kinds, Tensor):
        values = kinds
    else:
        try:
            values = torch.as_tensor(list(kinds))
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"kinds: expected a tensor or sequence of integer kinds, got {kinds!r}") from None
    if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        raise ValueError(f"kinds: expected integer kind indices, got {values.dtype}")
    if values.shape != (count,):
        raise ValueError(f"kinds: expected shape ({count},) (one kind per background), got {tuple(values.shape)}")
    if count and (int(values.min()) < 0 or int(values.max()) >= len(BACKGROUND_KINDS)):
        raise ValueError(
            f"kinds: expected indices into BACKGROUND_KINDS (0..{len(BACKGROUND_KINDS) - 1}), "
            f"got values in [{int(values.min())}, {int(values.max())}]"
        )
    return values.long().cpu()


def _backgrounds(kinds: Tensor, size: int, seed: int) -> Tensor:
    """Backgrounds of the given kinds ``(N, 3, S, S)``; draws kind by kind from one seeded generator."""
    generator = torch.Generator().manual_seed(_seed_for(seed, 1))
    out = torch.empty(len(kinds), 3, size, size)
    for kind, name in enumerate(BACKGROUND_KINDS):
        index = (kinds == kind).nonzero().flatten()
        if len(index) == 0:
            continue
        if kind < 2:
            out[index] = _photo_crops(kind, len(index), size, generator)
        else:
            out[index] = _texture(name, len(index), size, generator)
    return out.clamp_(*_BACKGROUND_RANGE)


def scene_backgrounds(
    count: int, size: int = 32, *, kinds: Tensor | Sequence[int] | None = None, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Random backgrounds of the ten :data:`BACKGROUND_KINDS`, with random crops, phases and colour jitter.

    Args:
        count: number of backgrounds.
        size: side ``S`` in pixels.
        kinds: the kind index of each background ``(count,)``; ``None`` draws kinds uniformly.
        seed: seed of every random choice.

    Returns:
        ``(backgrounds, kinds)``: float32 ``(count, 3, S, S)`` with values in ``[0.05, 0.6]`` and long ``(count,)``.

    Example:
        >>> backgrounds, kinds = scene_backgrounds(4, 16, kinds=[0, 2, 6, 9], seed=0)
        >>> tuple(backgrounds.shape), backgrounds.dtype, kinds.tolist()
        ((4, 3, 16, 16), torch.float32, [0, 2, 6, 9])
        >>> bool(backgrounds.min() >= 0.05), bool(backgrounds.max() <= 0.6)
        (True, True)
        >>> torch.equal(backgrounds, scene_backgrounds(4, 16, kinds=[0, 2, 6, 9], seed=0)[0])
        True
    """
    count = positive_int("count", count)
    size = positive_int("size", size)
    seed = _check_seed(seed)
    if kinds is None:
        generator = torch.Generator().manual_seed(_seed_for(seed, 0))
        kinds = torch.randint(len(BACKGROUND_KINDS), (count,), generator=generator)
    else:
        kinds = _check_kinds(kinds, count)
    return _backgrounds(kinds, size, seed), kinds
