"""Object relevancy's follow-up images (SPEC §3): object-preserving and object-removing mutations.

Each source image comes with a mask of its object. Six mutation functions turn it into ``F`` follow-ups,
in this order (the index is the function id in :attr:`FollowUps.function`):

====  ==============================  ==========  ==========================================================
 id   function                        type        operations
====  ==============================  ==========  ==========================================================
 0    MoveObjectToBackground          preserving  one per background: the object pasted onto it, seam median-blurred
 1    BlendObjectIntoBackground       preserving  one per background: ``cv2.seamlessClone`` of the object onto it
                                                  (Poisson blending; the clone mask is the mask grown by 4 px)
 2    GrayBackground                  preserving  ``gray``: everything outside the mask 0.5, seam median-blurred
 3    FillObjectWithColor             removing    9 colours (black ... magenta): the mask filled, seam median-blurred
 4    InpaintObject                   removing    ``ns``, ``telea``: ``cv2.inpaint`` over the mask dilated by one pixel
 5    FillObjectWithMarginStatistic   removing    ``mean``, ``median`` of the pixels in the mask's box but not in it
                                                  (per channel; invalid where there are none, e.g. a box mask)
====  ==============================  ==========  ==========================================================

so ``F = 2·n_backgrounds + 1 + 9 + 2 + 2``; objects stay where they are (backgrounds have the images' size).
The *seam* is the ring ``dilate(mask) ∧ ¬mask`` (3×3) just outside the object: only its pixels take the
3×3 median (a thin stroke stays whole), the rest is exactly the composite. Mutations work in float
``H×W×C`` arrays and touch only the pixels they change, so every pixel a mutation leaves alone is the
source's (or the background's) exact float value; OpenCV's 8-bit-only operations (inpainting,
``seamlessClone``) are quantised to ``uint8`` and their results used only where they apply. For grayscale
images (``C = 1``) RGB backgrounds and fill colours
become gray by ITU-R BT.601 luminance (``0.299 R + 0.587 G + 0.114 B``, OpenCV's ``RGB2GRAY``).

Follow-ups do not depend on the model: :class:`FollowUpCache` generates them once per probe set (in memory,
optionally one ``.pt`` file per image) and hands them back every epoch. Generation runs across images
in a thread pool: OpenCV releases the GIL, and each image's follow-ups depend only on that image, so the
output is the same for any number of workers.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import Tensor

from dlguard._validation import check_tensor, check_values, positive_int

__all__ = ["MUTATION_FUNCTIONS", "FollowUpCache", "FollowUps", "MutationFunction", "object_follow_ups", "transplant"]


@dataclass(frozen=True)
class MutationFunction:
    """One mutation function of SPEC §3: a name, its type and its operations.

    Attributes:
        name: the function's name (e.g. ``"InpaintObject"``).
        preserving: ``True`` for an object-preserving function (MR-1), ``False`` for object-removing (MR-2).
        operations: the operations' names; empty for the functions with one operation per background
            (their operations are named by the background's index when follow-ups are generated).
    """

    name: str
    preserving: bool
    operations: tuple[str, ...]

    def operation_names(self, n_backgrounds: int) -> tuple[str, ...]:
        """``"name/operation"`` of every operation, given the number of backgrounds."""
        operations = self.operations or tuple(str(i) for i in range(n_backgrounds))
        return tuple(f"{self.name}/{operation}" for operation in operations)


_COLORS: dict[str, tuple[float, float, float]] = {
    "black": (0.0, 0.0, 0.0),
    "white": (1.0, 1.0, 1.0),
    "gray": (0.5, 0.5, 0.5),
    "red": (1.0, 0.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
    "yellow": (1.0, 1.0, 0.0),
    "cyan": (0.0, 1.0, 1.0),
    "magenta": (1.0, 0.0, 1.0),
}

MUTATION_FUNCTIONS: tuple[MutationFunction, ...] = (
    MutationFunction("MoveObjectToBackground", True, ()),
    MutationFunction("BlendObjectIntoBackground", True, ()),
    MutationFunction("GrayBackground", True, ("gray",)),
    MutationFunction("FillObjectWithColor", False, tuple(_COLORS)),
    MutationFunction("InpaintObject", False, ("ns", "telea")),
    MutationFunction("FillObjectWithMarginStatistic", False, ("mean", "median")),
)

_LUMA = (0.299, 0.587, 0.114)
_KERNEL = np.ones((3, 3), np.uint8)
_INPAINT_RADIUS = 3
_CLONE_GROW = 4  # seamlessClone erodes its mask 3 times (3×3): the object sits a pixel further in
_CLONE_PAD = _CLONE_GROW + 2


@dataclass
class FollowUps:
    """Follow-ups of ``B`` source images, ``F`` per image, in :data:`MUTATION_FUNCTIONS` order.

    Attributes:
        inputs: ``(B, F, C, H, W)`` float32 in ``[0, 1]``, the sources' ``C``.
        function: ``(F,)`` long, index of each follow-up's function in :data:`MUTATION_FUNCTIONS`.
        preserving: ``(F,)`` bool, whether that function preserves the object.
        operation: ``F`` names, e.g. ``"FillObjectWithColor/red"``, ``"MoveObjectToBackground/3"``.
        valid: ``(B, F)`` bool; ``False`` where an operation does not apply to an image (a margin statistic
            when the mask fills its bounding box); such a follow-up is a copy of the source.
    """

    inputs: Tensor
    function: Tensor
    preserving: Tensor
    operation: list[str]
    valid: Tensor

    def __len__(self) -> int:
        return len(self.inputs)

    def to(self, device: torch.device | str) -> FollowUps:
        """The same follow-ups on ``device``."""
        return FollowUps(
            self.inputs.to(device),
            self.function.to(device),
            self.preserving.to(device),
            list(self.operation),
            self.valid.to(device),
        )

    def select(self, index: int | slice | Sequence[int] | Tensor) -> FollowUps:
        """The follow-ups of the source images ``index`` (an ``int`` keeps the batch dimension)."""
        if isinstance(index, int):
            index = [index]
        if isinstance(index, Sequence):
            index = torch.as_tensor(index, dtype=torch.long, device=self.inputs.device)
        return FollowUps(self.inputs[index], self.function, self.preserving, list(self.operation), self.valid[index])

    def background_swapped(self) -> Tensor:
        """``(B, n_backgrounds, C, H, W)``: the sources' objects moved onto each background (function 0)."""
        return self.inputs[:, self.function == 0]


def _layout(n_backgrounds: int) -> tuple[Tensor, Tensor, list[str]]:
    """``function (F,)``, ``preserving (F,)`` and the operation names for ``n_backgrounds`` backgrounds."""
    function, preserving, names = [], [], []
    for index, mutation in enumerate(MUTATION_FUNCTIONS):
        for name in mutation.operation_names(n_backgrounds):
            function.append(index)
            preserving.append(mutation.preserving)
            names.append(name)
    return torch.tensor(function, dtype=torch.long), torch.tensor(preserving, dtype=torch.bool), names


# --- validation ---------------------------------------------------------------------------------------------


def _check_images(name: str, images: object) -> Tensor:
    images = check_tensor(name, images, floating=True)
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"{name}: expected images (B, C, H, W) with C in {{1, 3}}, got shape {tuple(images.shape)}")
    check_values(name, images)
    return images


def _check_masks(name: str, masks: object, images: Tensor) -> Tensor:
    expected = (images.shape[0], *images.shape[2:])
    if not isinstance(masks, Tensor) or masks.dtype != torch.bool or tuple(masks.shape) != expected:
        got = f"{masks.dtype} {tuple(masks.shape)}" if isinstance(masks, Tensor) else type(masks).__name__
        raise ValueError(f"{name}: expected a bool tensor (B, H, W) = {expected} matching the images, got {got}")
    if len(masks):
        empty = (~masks.flatten(1).any(1)).nonzero().flatten()
        if len(empty):
            raise ValueError(
                f"{name}: the mask of image {int(empty[0])} is empty (no object); every image needs its object "
                f"marked ({len(empty)} empty in all)"
            )
    return masks


def _check_backgrounds(backgrounds: object, images: Tensor) -> Tensor:
    backgrounds = check_tensor("backgrounds", backgrounds, floating=True)
    channels = images.shape[1]
    size = tuple(images.shape[2:])
    if (
        backgrounds.ndim != 4
        or backgrounds.shape[1] not in {3, channels}
        or tuple(backgrounds.shape[2:]) != size
        or len(backgrounds) == 0
    ):
        raise ValueError(
            f"backgrounds: expected at least one background (N, 3, {size[0]}, {size[1]}) or (N, {channels}, "
            f"{size[0]}, {size[1]}) of the images' size, got shape {tuple(backgrounds.shape)}"
        )
    check_values("backgrounds", backgrounds)
    return backgrounds


def _workers(workers: int | None, batch: int) -> int:
    if workers is None:
        return max(1, min(os.cpu_count() or 1, batch))
    return positive_int("workers", workers)


# --- numpy / OpenCV ------------------------------------------------------------------------------------------


def _hwc(images: Tensor, channels: int) -> np.ndarray:
    """``(B, H, W, channels)`` float32 numpy; 3-channel images become gray (BT.601) when ``channels`` is 1."""
    images = images.detach().to("cpu", torch.float32)
    if images.shape[1] != channels:
        luma = torch.tensor(_LUMA).view(1, 3, 1, 1)
        images = (images * luma).sum(1, keepdim=True).clamp(0.0, 1.0)
    return images.permute(0, 2, 3, 1).contiguous().numpy()


def _uint8(image: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)


def _channels(result: np.ndarray, channels: int) -> np.ndarray:
    """OpenCV drops a single channel's axis; put it back (``H×W×C`` float32)."""
    return result.reshape(*result.shape[:2], channels)


def _box(mask: np.ndarray) -> tuple[int, int, int, int]:
    """``(x1, y1, x2, y2)`` of a non-empty mask, ``x2``/``y2`` exclusive."""
    x, y, w, h = cv2.boundingRect(mask.astype(np.uint8))
    return x, y, x + w, y + h


def _seam_blurred(composites: np.ndarray, seam: np.ndarray) -> np.ndarray:
    """``composites`` (``K×H×W×C``) with their 3×3 medians (edges replicated) inside ``seam`` only.

    The ``K`` images go through one ``cv2.medianBlur`` as a column of tiles, each padded by one replicated
    pixel, so that no window reaches into a neighbouring tile.
    """
    k, h, w, c = composites.shape
    tiles = np.empty((k, h + 2, w + 2, c), np.float32)
    tiles[:, 1:-1, 1:-1] = composites
    tiles[:, 0, 1:-1], tiles[:, -1, 1:-1] = composites[:, 0], composites[:, -1]
    tiles[:, :, 0], tiles[:, :, -1] = tiles[:, :, 1], tiles[:, :, -2]
    blurred = cv2.medianBlur(tiles.reshape(k * (h + 2), w + 2, c), 3).reshape(k, h + 2, w + 2, c)[:, 1:-1, 1:-1]
    result = composites.copy()  # boolean assignment: several times faster than a broadcasting np.where
    result[:, seam] = blurred[:, seam]
    return result


def _clone_target(background: np.ndarray) -> np.ndarray:
    """A background as :meth:`_Object.blended` hands it to ``cv2.seamlessClone``: padded 3-channel ``uint8``."""
    three = np.repeat(background, 3, axis=2) if background.shape[2] == 1 else background
    return cv2.copyMakeBorder(_uint8(three), *(_CLONE_PAD,) * 4, cv2.BORDER_REPLICATE)


class _Object:
    """One image and its mask, with the regions every mutation reads computed once."""

    def __init__(self, image: np.ndarray, mask: np.ndarray) -> None:
        self.image, self.mask = image, mask
        self.channels = image.shape[2]
        mask8 = mask.astype(np.uint8)
        self.dilated = cv2.dilate(mask8, _KERNEL).astype(bool)
        self.seam = self.dilated & ~mask  # the ring outside the object: thin strokes stay whole
        self._clone: tuple[np.ndarray, np.ndarray, tuple[int, int, int, int]] | None = None

    def pasted(self, content: np.ndarray, onto: np.ndarray) -> np.ndarray:
        """``content`` inside the mask over ``onto`` outside it, seam blurred."""
        composite = np.broadcast_to(onto, self.image.shape).copy()
        composite[self.mask] = np.broadcast_to(content, self.image.shape)[self.mask]
        return _seam_blurred(composite[None], self.seam)[0]

    def blended(self, target: np.ndarray, background: np.ndarray) -> np.ndarray:
        """``cv2.seamlessClone`` (``NORMAL_CLONE``) of the object onto ``background``, in place.

        ``target`` is ``background`` prepared by :func:`_clone_target`. OpenCV erodes the clone mask three
        times (3×3) and keeps only the gradients inside what is left, so the mask is grown by
        :data:`_CLONE_GROW` pixels: every object pixel keeps the source's gradients, and the result inside
        the object is the source plus a smooth (for constant surroundings, constant) offset towards the
        background. The images are padded by edge replication, so that an object touching the border clones
        like any other, and the clone's centre is the centre of the grown mask's box, so the object stays
        where it was. Outside that box the result is ``background`` exactly.
        """
        pad = _CLONE_PAD
        if self._clone is None:
            source = _clone_target(self.image)
            mask = cv2.copyMakeBorder(self.mask.astype(np.uint8) * 255, *(pad,) * 4, cv2.BORDER_CONSTANT, value=0)
            mask = cv2.dilate(mask, _KERNEL, iterations=_CLONE_GROW)
            self._clone = source, mask, cv2.boundingRect(mask)
        source, mask, (x, y, w, h) = self._clone
        # a copy: seamlessClone writes into its mask argument (OpenCV 4 and 5)
        clone = cv2.seamlessClone(source, target, mask.copy(), (x + w // 2, y + h // 2), cv2.NORMAL_CLONE)
        x1, y1, x2, y2 = max(x, pad), max(y, pad), min(x + w, target.shape[1] - pad), min(y + h, target.shape[0] - pad)
        region = clone[y1:y2, x1:x2].astype(np.float32) / 255.0
        result = background.copy()
        result[y1 - pad : y2 - pad, x1 - pad : x2 - pad] = (
            region.mean(2, keepdims=True) if self.channels == 1 else region
        )
        return result

    def inpainted(self, flag: int) -> np.ndarray:
        """``cv2.inpaint`` (``flag``) over the mask dilated by a pixel; the rest is the source exactly."""
        filled = cv2.inpaint(_uint8(self.image), self.dilated.astype(np.uint8), _INPAINT_RADIUS, flag)
        result = self.image.copy()
        result[self.dilated] = _channels(filled, self.channels)[self.dilated].astype(np.float32) / 255.0
        return result

    def margin(self) -> np.ndarray:
        """``(n, C)`` pixels inside the mask's bounding box but outside the mask."""
        x1, y1, x2, y2 = _box(self.mask)
        return self.image[y1:y2, x1:x2][~self.mask[y1:y2, x1:x2]]


def _mutate(
    image: np.ndarray,
    mask: np.ndarray,
    backgrounds: np.ndarray,
    targets: list[np.ndarray],
    out: np.ndarray,
    valid: np.ndarray,
) -> None:
    """Write one image's ``F`` follow-ups into ``out`` (``F×H×W×C``) and their validity into ``valid``.

    ``targets`` are the backgrounds prepared for ``cv2.seamlessClone`` (:func:`_clone_target`).
    """
    obj = _Object(image, mask)
    n = len(backgrounds)
    colors = np.array(list(_COLORS.values()), np.float32)
    if obj.channels == 1:
        colors = colors @ np.array(_LUMA, np.float32)[:, None]
    composites = np.empty((n + 10, *image.shape), np.float32)  # moved, gray background, colour fills
    composites[:n], composites[n], composites[n + 1 :] = backgrounds, 0.5, image
    composites[: n + 1, mask] = image[mask]
    composites[n + 1 :, mask] = colors[:, None, :]
    pasted = _seam_blurred(composites, obj.seam)
    out[:n], out[2 * n : 2 * n + 10] = pasted[:n], pasted[n:]
    for i in range(n):
        out[n + i] = obj.blended(targets[i], backgrounds[i])
    f = 2 * n + 10
    for flag in (cv2.INPAINT_NS, cv2.INPAINT_TELEA):
        out[f] = obj.inpainted(flag)
        f += 1
    margin = obj.margin()
    for statistic in (np.mean, np.median):
        valid[f] = len(margin) > 0
        out[f] = image
        if valid[f]:
            out[f][mask] = statistic(margin, axis=0)
        f += 1


def _for_each(fn: Callable[[int], None], count: int, workers: int) -> None:
    """``fn(0) ... fn(count - 1)``, in a pool of ``workers`` threads (in this thread for one)."""
    if workers == 1 or count <= 1:
        for index in range(count):
            fn(index)
        return
    with ThreadPoolExecutor(max_workers=min(workers, count)) as pool:
        list(pool.map(fn, range(count)))  # list: re-raises a worker's exception here


def _generate(images: Tensor, masks: Tensor, backgrounds: Tensor, workers: int) -> FollowUps:
    """Follow-ups of checked inputs (the caller validated them)."""
    channels = images.shape[1]
    function, preserving, names = _layout(len(backgrounds))
    sources, grounds = _hwc(images, channels), _hwc(backgrounds, channels)
    regions = masks.detach().cpu().numpy()
    height, width = sources.shape[1:3]
    out = np.empty((len(sources), len(names), channels, height, width), np.float32)
    valid = np.ones((len(sources), len(names)), bool)

    targets = [_clone_target(ground) for ground in grounds]

    def one(b: int) -> None:
        _mutate(sources[b], regions[b], grounds, targets, out[b].transpose(0, 2, 3, 1), valid[b])  # F×H×W×C

    _for_each(one, len(sources), workers)
    device = images.device
    inputs, valid = torch.from_numpy(out).to(device), torch.from_numpy(valid).to(device)
    return FollowUps(inputs, function.to(device), preserving.to(device), names, valid)


def object_follow_ups(images: Tensor, masks: Tensor, backgrounds: Tensor, *, workers: int | None = None) -> FollowUps:
    """All follow-ups of SPEC §3 for each image: ``F = 2·N + 14`` with ``N`` backgrounds.

    Args:
        images: ``(B, C, H, W)`` floating sources in ``[0, 1]``, ``C`` in ``{1, 3}``.
        masks: ``(B, H, W)`` bool, ``True`` on each image's object; none may be empty.
        backgrounds: ``(N, 3, H, W)`` or ``(N, C, H, W)`` floating backgrounds in ``[0, 1]`` of the images'
            size, ``N ≥ 1`` (RGB ones become gray for grayscale images).
        workers: threads generating images in parallel; ``None``: ``min(os.cpu_count(), B)``; ``1``: in
            this thread. The result does not depend on it. OpenCV's own thread pool (``cv2.setNumThreads``)
            is left as it is: an OpenCV call made while another thread holds that pool runs in its caller,
            so the two never multiply.

    Returns:
        :class:`FollowUps` on ``images``' device.

    Raises:
        ValueError: before any work, naming ``images``, ``masks``, ``backgrounds`` or ``workers``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> images, backgrounds = torch.rand(2, 3, 16, 16, generator=g), torch.rand(4, 3, 16, 16, generator=g)
        >>> masks = torch.zeros(2, 16, 16, dtype=torch.bool)
        >>> masks[:, 4:12, 5:10] = True
        >>> masks[:, 4, 5] = False  # a margin pixel inside the box
        >>> follow_ups = object_follow_ups(images, masks, backgrounds)
        >>> follow_ups.inputs.shape, follow_ups.operation[9]
        (torch.Size([2, 22, 3, 16, 16]), 'FillObjectWithColor/black')
        >>> red = follow_ups.inputs[0, follow_ups.operation.index("FillObjectWithColor/red"), :, 6, 7]
        >>> red.tolist(), bool(follow_ups.valid.all())
        ([1.0, 0.0, 0.0], True)
    """
    images = _check_images("images", images)
    masks = _check_masks("masks", masks, images)
    backgrounds = _check_backgrounds(backgrounds, images)
    return _generate(images, masks, backgrounds, _workers(workers, len(images)))


def _backgrounds_hash(backgrounds: Tensor) -> str:
    data = backgrounds.detach().to("cpu", torch.float32).contiguous().numpy()
    return hashlib.sha256(str(data.shape).encode() + data.tobytes()).hexdigest()[:16]


class FollowUpCache:
    """Follow-ups generated once per source image and kept: in memory, and on disk when given a directory.

    Entries are keyed by an integer per image (e.g. :func:`~dlguard._random.content_keys` of the probe set)
    together with a hash of the backgrounds, so changing the backgrounds regenerates everything. With a
    ``directory`` each image's follow-ups are also one file ``<key>_<backgrounds hash>.pt`` (written
    atomically, so processes may share the directory), read back by later caches.

    Attributes:
        directory: where the files live, or ``None`` (memory only).
        generated: how many images' follow-ups this cache has generated (not loaded).
        loaded: how many it has read from files.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> images, backgrounds = torch.rand(3, 1, 8, 8, generator=g), torch.rand(2, 1, 8, 8, generator=g)
        >>> masks = torch.zeros(3, 8, 8, dtype=torch.bool)
        >>> masks[:, 2:6, 2:6] = True
        >>> cache = FollowUpCache()
        >>> first = cache.get_or_make(torch.tensor([10, 11, 12]), images, masks, backgrounds)
        >>> again = cache.get_or_make(torch.tensor([12, 10]), images[[2, 0]], masks[[2, 0]], backgrounds)
        >>> cache.generated, torch.equal(again.inputs[1], first.inputs[0]), tuple(again.inputs.shape)
        (3, True, (2, 18, 1, 8, 8))
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = None if directory is None else Path(directory)
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._entries: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}
        self.generated = 0
        self.loaded = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget the entries held in memory (files stay)."""
        self._entries.clear()

    def _path(self, key: int, digest: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{key}_{digest}.pt"

    def _load(self, key: int, digest: str, shape: tuple[int, ...]) -> tuple[Tensor, Tensor] | None:
        if self.directory is None or not self._path(key, digest).exists():
            return None
        stored = torch.load(self._path(key, digest), map_location="cpu", weights_only=True)
        if tuple(stored["inputs"].shape) != shape or tuple(stored["valid"].shape) != shape[:1]:
            return None  # another channel count or size under the same key: regenerate
        return stored["inputs"], stored["valid"]

    def _save(self, key: int, digest: str, inputs: Tensor, valid: Tensor) -> None:
        path = self._path(key, digest)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        torch.save({"inputs": inputs.clone(), "valid": valid.clone()}, partial)
        os.replace(partial, path)

    def get_or_make(
        self, keys: Tensor, images: Tensor, masks: Tensor, backgrounds: Tensor, workers: int | None = None
    ) -> FollowUps:
        """The follow-ups of ``images`` in the order of ``keys``, generating only those not held yet.

        Args:
            keys: ``(B,)`` integer key of each image; equal keys mean the same image.
            images: ``(B, C, H, W)`` sources, as in :func:`object_follow_ups`.
            masks: ``(B, H, W)`` bool object masks.
            backgrounds: ``(N, 3 or C, H, W)`` backgrounds.
            workers: threads for the images that need generating (see :func:`object_follow_ups`).

        Returns:
            :class:`FollowUps` on ``images``' device.
        """
        if not isinstance(keys, Tensor) or keys.is_floating_point() or keys.is_complex() or keys.dtype == torch.bool:
            raise ValueError(f"keys: expected an integer tensor (B,), got {getattr(keys, 'dtype', type(keys))}")
        images = _check_images("images", images)
        if keys.ndim != 1 or len(keys) != len(images):
            raise ValueError(f"keys: expected shape ({len(images)},), one key per image, got {tuple(keys.shape)}")
        masks = _check_masks("masks", masks, images)
        backgrounds = _check_backgrounds(backgrounds, images)
        workers = _workers(workers, len(images))
        digest = _backgrounds_hash(backgrounds)
        function, preserving, names = _layout(len(backgrounds))
        shape = (len(names), *images.shape[1:])
        wanted = [int(k) for k in keys.tolist()]
        missing: dict[int, int] = {}  # key -> first row holding it
        for row, key in enumerate(wanted):
            held = self._entries.get((key, digest))
            if (held is not None and held[0].shape == shape) or key in missing:
                continue
            stored = self._load(key, digest, shape)
            if stored is None:
                missing[key] = row
            else:
                self._entries[key, digest] = stored
                self.loaded += 1
        if missing:
            rows = torch.tensor(list(missing.values()), dtype=torch.long)
            made = _generate(images.cpu()[rows], masks.cpu()[rows], backgrounds.cpu(), workers)  # kept on the CPU
            self.generated += len(rows)
            inputs, valid = made.inputs, made.valid
            for i, key in enumerate(missing):
                self._entries[key, digest] = (inputs[i], valid[i])
                if self.directory is not None:
                    self._save(key, digest, inputs[i], valid[i])
        if not wanted:
            inputs, valid = torch.zeros(0, *shape), torch.zeros(0, len(names), dtype=torch.bool)
        else:
            inputs = torch.stack([self._entries[key, digest][0] for key in wanted])
            valid = torch.stack([self._entries[key, digest][1] for key in wanted])
        device = images.device
        return FollowUps(inputs.to(device), function.to(device), preserving.to(device), names, valid.to(device))


def _transplant_one(
    donor: np.ndarray, donor_mask: np.ndarray, scene: np.ndarray, scene_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``scene`` without its object (Telea) with ``donor``'s object scaled into its box, and the new mask."""
    x1, y1, x2, y2 = _box(scene_mask)
    u1, v1, u2, v2 = _box(donor_mask)
    size = (x2 - x1, y2 - y1)
    crop = _channels(cv2.resize(donor[v1:v2, u1:u2], size, interpolation=cv2.INTER_LINEAR), donor.shape[2])
    crop_mask = donor_mask[v1:v2, u1:u2].astype(np.uint8)
    placed = cv2.resize(crop_mask, size, interpolation=cv2.INTER_NEAREST).astype(bool)
    if not placed.any():  # a thin object shrunk below the nearest neighbour's grid
        placed = cv2.resize(crop_mask.astype(np.float32), size, interpolation=cv2.INTER_LINEAR) > 0
    mask = np.zeros_like(scene_mask)
    mask[y1:y2, x1:x2] = placed
    content = np.zeros_like(scene)
    content[y1:y2, x1:x2] = np.clip(crop, 0.0, 1.0)
    emptied = _Object(scene, scene_mask).inpainted(cv2.INPAINT_TELEA)
    return _Object(emptied, mask).pasted(content, emptied), mask


def transplant(
    object_images: Tensor,
    object_masks: Tensor,
    background_images: Tensor,
    background_masks: Tensor,
    *,
    return_masks: bool = False,
    workers: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Each donor's object moved into the place of each scene's own object (the guided transplant attack, SPEC §3).

    For row ``b``: the scene ``background_images[b]`` loses its object (``cv2.INPAINT_TELEA`` over its mask
    dilated by a pixel); the bounding-box crop of ``object_images[b]`` and of its mask is resized to the
    scene's object box (bilinear for the image, nearest for the mask) and pasted there, seam median-blurred.

    Args:
        object_images: ``(B, C, H', W')`` donors in ``[0, 1]``.
        object_masks: ``(B, H', W')`` bool masks of the donors' objects, none empty.
        background_images: ``(B, C, H, W)`` scenes in ``[0, 1]``, the donors' ``C``.
        background_masks: ``(B, H, W)`` bool masks of the scenes' objects, none empty.
        return_masks: also return the pasted objects' masks.
        workers: threads, as in :func:`object_follow_ups` (the result does not depend on it).

    Returns:
        ``(B, C, H, W)`` float32 images on ``background_images``' device, and with ``return_masks`` their
        ``(B, H, W)`` bool masks.

    Example:
        >>> donors, scenes = torch.zeros(1, 3, 12, 12), torch.full((1, 3, 12, 12), 0.25)
        >>> donors[:, 0, 2:6, 2:6] = 1.0  # a red 4x4 square
        >>> scenes[:, :, 3:9, 4:10] = 0.75  # a light gray 6x6 square
        >>> out, mask = transplant(donors, donors[:, 0] > 0.5, scenes, scenes[:, 0] > 0.5, return_masks=True)
        >>> out[0, :, 6, 6].tolist(), out[0, :, 0, 0].tolist(), int(mask.sum())
        ([1.0, 0.0, 0.0], [0.25, 0.25, 0.25], 36)
    """
    object_images = _check_images("object_images", object_images)
    background_images = _check_images("background_images", background_images)
    if object_images.shape[:2] != background_images.shape[:2]:
        raise ValueError(
            f"object_images: expected the batch size and channels of background_images "
            f"{tuple(background_images.shape[:2])}, got {tuple(object_images.shape[:2])}"
        )
    object_masks = _check_masks("object_masks", object_masks, object_images)
    background_masks = _check_masks("background_masks", background_masks, background_images)
    workers = _workers(workers, len(background_images))
    channels = background_images.shape[1]
    donors, scenes = _hwc(object_images, channels), _hwc(background_images, channels)
    donor_masks, scene_masks = object_masks.cpu().numpy(), background_masks.cpu().numpy()
    out, masks = np.empty_like(scenes), np.empty_like(scene_masks)

    def one(b: int) -> None:
        out[b], masks[b] = _transplant_one(donors[b], donor_masks[b], scenes[b], scene_masks[b])

    _for_each(one, len(scenes), workers)
    images = torch.from_numpy(out).permute(0, 3, 1, 2).contiguous().to(background_images.device)
    if return_masks:
        return images, torch.from_numpy(masks).to(background_images.device)
    return images
