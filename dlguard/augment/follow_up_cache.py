"""Object relevancy's follow-ups generated once per source image and kept, in memory and on disk (SPEC §3).

Follow-ups do not depend on the model: :class:`FollowUpCache` generates them once per probe set (in memory,
optionally one ``.pt`` file per image) and hands them back every epoch.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import cv2
import torch
from torch import Tensor

from dlguard._validation import check_object_images, check_object_masks
from dlguard.augment.follow_ups import FollowUps, follow_up_layout
from dlguard.augment.functional._object_inputs import check_backgrounds, worker_count
from dlguard.augment.functional.object_mutations import check_removal, follow_up_images

__all__ = ["FollowUpCache"]

FORMAT = 1
"""The follow-ups' format: bump it whenever :func:`follow_up_images` makes other images from the same inputs, so
that files written before are not read back. The OpenCV version, whose filters make the pixels, is part of the
file name as well."""


def _made_by() -> str:
    """What made a file's follow-ups: the format and the OpenCV version."""
    return f"f{FORMAT}-cv{cv2.__version__}"


def _backgrounds_hash(backgrounds: Tensor) -> str:
    data = backgrounds.detach().to("cpu", torch.float32).contiguous().numpy()
    return hashlib.sha256(str(data.shape).encode() + data.tobytes()).hexdigest()[:16]


class FollowUpCache:
    """Follow-ups generated once per source image and kept: in memory, and on disk when given a directory.

    Entries are keyed by an integer per image (e.g. :func:`~dlguard._random.content_keys` of the probe set)
    together with a hash of the backgrounds and the removal region, so changing either regenerates everything.
    With a ``directory`` each image's follow-ups are also one file
    ``<key>_<backgrounds hash>-<removal>-f<FORMAT>-cv<OpenCV version>.pt`` (written atomically, so processes
    may share the directory), read back by later caches made by the same follow-up format and OpenCV version:
    after an upgrade that changes how follow-ups are made, the old files are ignored and new ones written.

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
        self,
        keys: Tensor,
        images: Tensor,
        masks: Tensor,
        backgrounds: Tensor,
        workers: int | None = None,
        removal: str = "box",
    ) -> FollowUps:
        """The follow-ups of ``images`` in the order of ``keys``, generating only those not held yet.

        Args:
            keys: ``(B,)`` integer key of each image; equal keys mean the same image.
            images: ``(B, C, H, W)`` sources, as in :func:`~dlguard.augment.object_follow_ups`.
            masks: ``(B, H, W)`` bool object masks.
            backgrounds: ``(N, 3 or C, H, W)`` backgrounds.
            workers: threads for the images that need generating (see :func:`~dlguard.augment.object_follow_ups`).
            removal: the region the removing operations replace (``"box"`` or ``"mask"``); part of the key.

        Returns:
            :class:`FollowUps` on ``images``' device.
        """
        if not isinstance(keys, Tensor) or keys.is_floating_point() or keys.is_complex() or keys.dtype == torch.bool:
            raise ValueError(f"keys: expected an integer tensor (B,), got {getattr(keys, 'dtype', type(keys))}")
        images = check_object_images("images", images)
        if keys.ndim != 1 or len(keys) != len(images):
            raise ValueError(f"keys: expected shape ({len(images)},), one key per image, got {tuple(keys.shape)}")
        masks = check_object_masks("masks", masks, images)
        backgrounds = check_backgrounds(backgrounds, images)
        workers = worker_count(workers, len(images))
        removal = check_removal(removal)
        digest = f"{_backgrounds_hash(backgrounds)}-{removal}-{_made_by()}"
        function, preserving, names = follow_up_layout(len(backgrounds))
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
            # made and kept on the CPU; follow_up_images checks the rows again (a trifle next to OpenCV)
            inputs, valid = follow_up_images(
                images.cpu()[rows], masks.cpu()[rows], backgrounds.cpu(), removal=removal, workers=workers
            )
            self.generated += len(rows)
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
