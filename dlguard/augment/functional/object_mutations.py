"""Object relevancy's mutations (SPEC §3) with OpenCV, and the object transplant: per-image ops, no model.

Each source image comes with a mask of its object. :func:`follow_up_images` applies every operation of the six
mutation functions to it, giving ``F`` follow-ups in this order (the id is the function's index in
:data:`~dlguard.augment.MUTATION_FUNCTIONS`, which names them):

====  ==============================  ==========  ==========================================================
 id   function                        type        operations
====  ==============================  ==========  ==========================================================
 0    MoveObjectToBackground          preserving  one per background: the object pasted onto it, seam median-blurred
 1    BlendObjectIntoBackground       preserving  one per background: ``cv2.seamlessClone`` of the object onto it
                                                  (Poisson blending; the clone mask is the mask grown by 4 px)
 2    GrayBackground                  preserving  ``gray``: everything outside the mask 0.5, seam median-blurred
 3    FillObjectWithColor             removing    9 colours (black ... magenta): the region filled, seam median-blurred
 4    InpaintObject                   removing    ``ns``, ``telea``: ``cv2.inpaint`` over the region grown by a pixel
 5    FillObjectWithMarginStatistic   removing    the region filled with the ``mean``, ``median`` of the pixels in the
                                                  mask's box but not in it (per channel; invalid where there are none,
                                                  e.g. a box mask)
====  ==============================  ==========  ==========================================================

so ``F = 2·n_backgrounds + 1 + 9 + 2 + 2``; objects stay where they are (backgrounds have the images' size).
The *region* the removing operations replace is the object's bounding box by default (``removal="box"``), so
that no silhouette is left for a model to read; ``removal="mask"`` replaces the object's pixels only.
The *seam* is the ring ``dilate(mask) ∧ ¬mask`` (3×3) just outside the object: only its pixels take the
3×3 median (a thin stroke stays whole), the rest is exactly the composite. Mutations work in float
``H×W×C`` arrays and touch only the pixels they change, so every pixel a mutation leaves alone is the
source's (or the background's) exact float value; OpenCV's 8-bit-only operations (inpainting,
``seamlessClone``) are quantised to ``uint8`` and their results used only where they apply. For grayscale
images (``C = 1``) RGB backgrounds and fill colours
become gray by ITU-R BT.601 luminance (``0.299 R + 0.587 G + 0.114 B``, OpenCV's ``RGB2GRAY``).
:func:`transplant` (the guided transplant attack's image, SPEC §3) is two of these operations: an object
inpainted away, another pasted in its place.

Both run across images in a thread pool: OpenCV releases the GIL, and each image's output depends only on
that image, so the output is the same for any number of workers.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import torch
from torch import Tensor

from dlguard._validation import check_object_images, check_object_masks, one_of
from dlguard.augment.functional._object_inputs import check_backgrounds, worker_count

__all__ = ["FILL_COLORS", "REMOVAL_REGIONS", "check_removal", "follow_up_images", "move_objects", "transplant"]

FILL_COLORS: dict[str, tuple[float, float, float]] = {
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
"""``FillObjectWithColor``'s nine colours, RGB in ``[0, 1]``, in their follow-ups' order."""

REMOVAL_REGIONS = ("box", "mask")
"""Regions the object-removing operations may replace: the object's bounding box, or its mask."""

_LUMA = (0.299, 0.587, 0.114)
_KERNEL = np.ones((3, 3), np.uint8)
_INPAINT_RADIUS = 3
_CLONE_GROW = 4  # seamlessClone erodes its mask 3 times (3×3): the object sits a pixel further in
_CLONE_PAD = _CLONE_GROW + 2


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


def _removal_region(mask: np.ndarray, removal: str) -> np.ndarray:
    """The pixels the object-removing operations replace: the object's mask, or its bounding box."""
    if removal == "mask":
        return mask
    x1, y1, x2, y2 = _box(mask)
    region = np.zeros_like(mask)
    region[y1:y2, x1:x2] = True
    return region


def _mutate(
    image: np.ndarray,
    mask: np.ndarray,
    backgrounds: np.ndarray,
    targets: list[np.ndarray],
    out: np.ndarray,
    valid: np.ndarray,
    removal: str,
) -> None:
    """Write one image's ``F`` follow-ups into ``out`` (``F×H×W×C``) and their validity into ``valid``.

    ``targets`` are the backgrounds prepared for ``cv2.seamlessClone`` (:func:`_clone_target`); ``removal``
    names the region the object-removing operations replace (:func:`_removal_region`).
    """
    obj = _Object(image, mask)
    removed = obj if removal == "mask" else _Object(image, _removal_region(mask, removal))
    n = len(backgrounds)
    colors = np.array(list(FILL_COLORS.values()), np.float32)
    if obj.channels == 1:
        colors = colors @ np.array(_LUMA, np.float32)[:, None]
    composites = np.empty((n + 1, *image.shape), np.float32)  # moved, gray background
    composites[:n], composites[n] = backgrounds, 0.5
    composites[:, mask] = image[mask]
    fills = np.repeat(image[None], len(colors), axis=0)  # the region in each colour
    fills[:, removed.mask] = colors[:, None, :]
    pasted = _seam_blurred(composites, obj.seam)
    out[:n], out[2 * n] = pasted[:n], pasted[n]
    out[2 * n + 1 : 2 * n + 1 + len(colors)] = _seam_blurred(fills, removed.seam)
    for i in range(n):
        out[n + i] = obj.blended(targets[i], backgrounds[i])
    f = 2 * n + 1 + len(colors)
    for flag in (cv2.INPAINT_NS, cv2.INPAINT_TELEA):
        out[f] = removed.inpainted(flag)
        f += 1
    margin = obj.margin()  # the pixels between the object and its box: what surrounds it
    for statistic in (np.mean, np.median):
        valid[f] = len(margin) > 0
        out[f] = image
        if valid[f]:
            out[f][removed.mask] = statistic(margin, axis=0)
        f += 1


def check_removal(removal: object) -> str:
    """``removal`` if it is one of :data:`REMOVAL_REGIONS`; a ``ValueError`` naming it otherwise."""
    return one_of("removal", removal, REMOVAL_REGIONS)


def _for_each(fn: Callable[[int], None], count: int, workers: int) -> None:
    """``fn(0) ... fn(count - 1)``, in a pool of ``workers`` threads (in this thread for one)."""
    if workers == 1 or count <= 1:
        for index in range(count):
            fn(index)
        return
    with ThreadPoolExecutor(max_workers=min(workers, count)) as pool:
        list(pool.map(fn, range(count)))  # list: re-raises a worker's exception here


def follow_up_images(
    images: Tensor, masks: Tensor, backgrounds: Tensor, *, removal: str = "box", workers: int | None = None
) -> tuple[Tensor, Tensor]:
    """Every operation of the six mutation functions on each image: ``F = 2·N + 14`` follow-ups, ``N`` backgrounds.

    Args:
        images: ``(B, C, H, W)`` floating sources in ``[0, 1]``, ``C`` in ``{1, 3}``.
        masks: ``(B, H, W)`` bool, ``True`` on each image's object; none may be empty.
        backgrounds: ``(N, 3, H, W)`` or ``(N, C, H, W)`` floating backgrounds in ``[0, 1]`` of the images'
            size, ``N ≥ 1`` (RGB ones become gray for grayscale images).
        removal: the region the object-removing operations replace: ``"box"`` (default), the object's
            bounding box, so that no trace of its shape is left; or ``"mask"``, the object's own pixels
            (the paper's, for segmentations of photographed objects). Filling only the mask of a
            shape-defined object -- a digit's strokes, a square -- leaves its silhouette in the fill's
            colour, and a model that reads the object still recognises it.
        workers: threads generating images in parallel; ``None``: ``min(os.cpu_count(), B)``; ``1``: in
            this thread. The result does not depend on it. OpenCV's own thread pool (``cv2.setNumThreads``)
            is left as it is: an OpenCV call made while another thread holds that pool runs in its caller,
            so the two never multiply.

    Returns:
        ``(inputs, valid)`` on ``images``' device: ``(B, F, C, H, W)`` float32 follow-ups in ``[0, 1]``, in
        the order of the module's table, and ``(B, F)`` bool, ``False`` where an operation does not apply to
        an image (a margin statistic when the mask fills its bounding box; that follow-up is a copy of the
        source). :func:`~dlguard.augment.object_follow_ups` names them.

    Raises:
        ValueError: before any work, naming ``images``, ``masks``, ``backgrounds``, ``removal`` or ``workers``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> images, backgrounds = torch.rand(2, 1, 8, 8, generator=g), torch.rand(3, 1, 8, 8, generator=g)
        >>> masks = torch.zeros(2, 8, 8, dtype=torch.bool)
        >>> masks[:, 2:6, 2:6] = True  # a square fills its box: no margin statistic
        >>> inputs, valid = follow_up_images(images, masks, backgrounds)
        >>> tuple(inputs.shape), valid[0, -3:].tolist()
        ((2, 20, 1, 8, 8), [True, False, False])
        >>> moved = inputs[0, 0]  # the object on background 0: the object and the far background exact
        >>> torch.equal(moved[:, 3, 3], images[0, :, 3, 3]), torch.equal(moved[:, 0, 0], backgrounds[0, :, 0, 0])
        (True, True)
    """
    images = check_object_images("images", images)
    masks = check_object_masks("masks", masks, images)
    backgrounds = check_backgrounds(backgrounds, images)
    removal = check_removal(removal)
    workers = worker_count(workers, len(images))
    channels = images.shape[1]
    sources, grounds = _hwc(images, channels), _hwc(backgrounds, channels)
    regions = masks.detach().cpu().numpy()
    height, width = sources.shape[1:3]
    count = 2 * len(grounds) + 1 + len(FILL_COLORS) + 2 + 2  # moved, blended, gray, colours, inpainted, margin
    out = np.empty((len(sources), count, channels, height, width), np.float32)
    valid = np.ones((len(sources), count), bool)

    targets = [_clone_target(ground) for ground in grounds]

    def one(b: int) -> None:
        _mutate(sources[b], regions[b], grounds, targets, out[b].transpose(0, 2, 3, 1), valid[b], removal)  # F×H×W×C

    _for_each(one, len(sources), workers)
    device = images.device
    return torch.from_numpy(out).to(device), torch.from_numpy(valid).to(device)


def move_objects(images: Tensor, masks: Tensor, backgrounds: Tensor, *, workers: int | None = None) -> Tensor:
    """Each image's object moved onto backgrounds, seam median-blurred: ``MoveObjectToBackground`` alone.

    The same pixels as the ``MoveObjectToBackground`` follow-ups of :func:`follow_up_images`, without the
    other operations: what a feedback loop needs to show an object on backgrounds it has not seen.

    Args:
        images: ``(B, C, H, W)`` floating sources in ``[0, 1]``, ``C`` in ``{1, 3}``.
        masks: ``(B, H, W)`` bool, ``True`` on each image's object; none may be empty.
        backgrounds: ``(N, 3 or C, H, W)`` backgrounds for every image, as :func:`follow_up_images` takes
            them, or ``(B, N, 3 or C, H, W)``: ``N`` backgrounds of each image's own.
        workers: threads, as in :func:`follow_up_images` (the result does not depend on it).

    Returns:
        ``(B, N, C, H, W)`` float32 on ``images``' device.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> images, backgrounds = torch.rand(2, 3, 8, 8, generator=g), torch.rand(3, 3, 8, 8, generator=g)
        >>> masks = torch.zeros(2, 8, 8, dtype=torch.bool)
        >>> masks[:, 2:6, 2:6] = True
        >>> moved = move_objects(images, masks, backgrounds)
        >>> follow_ups, _ = follow_up_images(images, masks, backgrounds)
        >>> tuple(moved.shape), torch.equal(moved, follow_ups[:, :3])
        ((2, 3, 3, 8, 8), True)
        >>> own = move_objects(images, masks, torch.stack([backgrounds[:2], backgrounds[1:]]))  # each its own two
        >>> torch.equal(own[1, 0], moved[1, 1]), torch.equal(own[0, 1], moved[0, 1])
        (True, True)
    """
    images = check_object_images("images", images)
    masks = check_object_masks("masks", masks, images)
    own = isinstance(backgrounds, Tensor) and backgrounds.ndim == 5
    if own and len(backgrounds) != len(images):
        raise ValueError(
            f"backgrounds: expected (B, N, C, H, W) with B = {len(images)}, one set per image, "
            f"got {tuple(backgrounds.shape)}"
        )
    checked = check_backgrounds(backgrounds.flatten(0, 1) if own else backgrounds, images)
    workers = worker_count(workers, len(images))
    channels = images.shape[1]
    sources, grounds = _hwc(images, channels), _hwc(checked, channels)
    grounds = grounds.reshape(len(images), -1, *grounds.shape[1:]) if own else grounds
    regions = masks.detach().cpu().numpy()
    count = grounds.shape[1] if own else len(grounds)
    out = np.empty((len(sources), count, *sources.shape[1:]), np.float32)

    def one(b: int) -> None:
        composites = (grounds[b] if own else grounds).copy()
        composites[:, regions[b]] = sources[b][regions[b]]
        out[b] = _seam_blurred(composites, _Object(sources[b], regions[b]).seam)

    _for_each(one, len(sources), workers)
    return torch.from_numpy(out).permute(0, 1, 4, 2, 3).contiguous().to(images.device)


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
        workers: threads, as in :func:`follow_up_images` (the result does not depend on it).

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
    object_images = check_object_images("object_images", object_images)
    background_images = check_object_images("background_images", background_images)
    if object_images.shape[:2] != background_images.shape[:2]:
        raise ValueError(
            f"object_images: expected the batch size and channels of background_images "
            f"{tuple(background_images.shape[:2])}, got {tuple(object_images.shape[:2])}"
        )
    object_masks = check_object_masks("object_masks", object_masks, object_images)
    background_masks = check_object_masks("background_masks", background_masks, background_images)
    workers = worker_count(workers, len(background_images))
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
