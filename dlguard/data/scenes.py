"""Scenes of MNIST digits composited onto photo and texture backgrounds, with masks and boxes; no download.

Each scene is an RGB image ``(3, S, S)`` in ``[0, 1]``: an embedded MNIST digit (see
:func:`~dlguard.data.mnist.embedded_mnist`) scaled to a random side in ``[16, 24]`` pixels, placed fully
inside the image, and alpha-composited (alpha = the digit's intensity) in a bright colour over a
background of one of ten kinds (:data:`~dlguard.data.backgrounds.BACKGROUND_KINDS`): crops of
scikit-learn's two sample photos and eight procedural textures, each with its own palette. Backgrounds
are kept in ``[0.05, 0.6]`` and digit colours have every channel at least ``0.7`` (the brightest at
``1``), so the digit stays visible on every kind.

The object's mask is ``alpha > 0.3`` and its box the mask's tight box (torchvision's ``xyxy`` with
exclusive ``x2``, ``y2``). With ``spurious = q``, a scene's background kind equals its label with
probability ``q`` (otherwise a uniformly random kind): a planted defect, since a model trained at
``q = 1`` can read the background instead of the digit, the kind of model object relevancy (SPEC §3)
is meant to flag.

:class:`SceneDataModule` serves scenes of the embedded MNIST sample to Lightning. Scenes of several
digits each, with detection targets, are in :mod:`~dlguard.data.detection_scenes`.

Every random choice comes from ``torch.Generator`` objects seeded from ``seed``: the same seed gives
identical tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import Dataset

from dlguard._validation import probability
from dlguard.data._digits import (
    MASK_THRESHOLD,
    MAX_DIGIT_SIDE,
    MIN_DIGIT_SIDE,
    _boxes_from_masks,
    _check_digits,
    _check_scene_size,
    _paste,
    _random_colours,
    _scaled_digits,
)
from dlguard.data._scene_datamodule import _EmbeddedSceneDataModule
from dlguard.data._seeds import _check_seed, _seed_for
from dlguard.data.backgrounds import BACKGROUND_KINDS, scene_backgrounds

__all__ = ["SceneDataModule", "Scenes", "make_scenes"]


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
        kinds: long ``(N,)`` background kinds (indices into
            :data:`~dlguard.data.backgrounds.BACKGROUND_KINDS`).
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
            seed: seed of the new backgrounds (:func:`~dlguard.data.backgrounds.scene_backgrounds`).

        Returns:
            New :class:`Scenes` sharing labels, masks, boxes, alpha and colours with this one.
        """
        backgrounds, kinds = scene_backgrounds(len(self), self.size, kinds=kinds, seed=seed)
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
    images = _composite(alpha, colors, scene_backgrounds(len(kinds), size, kinds=kinds, seed=seed)[0])
    return Scenes(images, labels, masks, _boxes_from_masks(masks), kinds, alpha, colors)


class SceneDataModule(_EmbeddedSceneDataModule[Scenes]):
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
        size = _check_scene_size(size)
        spurious = probability("spurious", spurious)
        val_spurious = spurious if val_spurious is None else probability("val_spurious", val_spurious)
        super().__init__(size, batch_size, num_workers, train_size, seed)
        self.spurious = spurious
        self.val_spurious = val_spurious
        self.shuffle_backgrounds_in_val = bool(shuffle_backgrounds_in_val)

    def _make_sets(self, train_x: Tensor, train_y: Tensor, val_x: Tensor, val_y: Tensor) -> tuple[Scenes, Scenes]:
        train_set = make_scenes(train_x, train_y, size=self.size, spurious=self.spurious, seed=self.seed)
        val_set = make_scenes(val_x, val_y, size=self.size, spurious=self.val_spurious, seed=self.seed + 1)
        if self.shuffle_backgrounds_in_val:
            generator = torch.Generator().manual_seed(_seed_for(self.seed, 3))
            kinds = val_set.kinds[torch.randperm(len(val_set), generator=generator)]
            val_set = val_set.with_backgrounds(kinds, seed=self.seed + 2)
        return train_set, val_set
