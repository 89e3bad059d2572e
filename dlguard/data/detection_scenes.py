"""Detection scenes: several non-overlapping MNIST digits per scene, with torchvision-style targets.

:func:`make_detection_scenes` shares the digits out several per scene, places them apart, and
composites each in its own bright colour over a background of a uniformly random kind
(:func:`~dlguard.data.backgrounds.scene_backgrounds`), the way :func:`~dlguard.data.scenes.make_scenes`
composites one. Each scene serves torchvision-style detection targets ``{"boxes", "labels", "masks"}``
with ``labels = digit + 1`` (0 is the background class); a digit's mask is ``alpha > 0.3`` and its box
the mask's tight box (torchvision's ``xyxy`` with exclusive ``x2``, ``y2``). :class:`DetectionSceneDataModule`
serves scenes of the embedded MNIST sample to Lightning, batched as torchvision's detection models take them.

Every random choice comes from ``torch.Generator`` objects seeded from ``seed``: the same seed gives
identical tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import torch
from torch import Tensor
from torch.utils.data import Dataset

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

__all__ = ["DetectionSceneDataModule", "DetectionScenes", "make_detection_scenes"]

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
    backgrounds = scene_backgrounds(len(kinds), size, kinds=kinds, seed=seed)[0]
    images = painted + (1.0 - alpha[:, None]) * backgrounds
    return DetectionScenes(images, _boxes_from_masks(masks), labels[keep] + 1, masks, kinds, scene[keep], keep)


class DetectionSceneDataModule(_EmbeddedSceneDataModule[DetectionScenes]):
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
        size = _check_scene_size(size)
        objects = _check_objects(objects, size)
        super().__init__(size, batch_size, num_workers, train_size, seed)
        self.objects = objects

    def _make_sets(
        self, train_x: Tensor, train_y: Tensor, val_x: Tensor, val_y: Tensor
    ) -> tuple[DetectionScenes, DetectionScenes]:
        return (
            make_detection_scenes(train_x, train_y, size=self.size, objects=self.objects, seed=self.seed),
            make_detection_scenes(val_x, val_y, size=self.size, objects=self.objects, seed=self.seed + 1),
        )
