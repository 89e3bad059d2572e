"""An in-memory labelled image dataset stored as uint8, served as float images in ``[0, 1]``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

__all__ = ["LabelledImages", "make_loader"]


class LabelledImages(Dataset[tuple[Tensor, int]]):
    """Images ``(N, H, W)`` or ``(N, C, H, W)`` of uint8 with integer labels.

    Items are ``(image, label)`` with ``image`` float ``(C, H', W')`` in ``[0, 1]``, zero-padded
    to ``image_size`` (centred) when it is larger than the stored size.

    Args:
        images: uint8 tensor.
        targets: integer labels ``(N,)``.
        image_size: output side; ``None`` keeps the stored size.
        transform: optional callable applied to each float image (a training augmentation).

    Example:
        >>> import torch
        >>> ds = LabelledImages(torch.full((2, 28, 28), 255, dtype=torch.uint8), torch.tensor([3, 7]),
        ...                     image_size=32)
        >>> x, y = ds[1]
        >>> tuple(x.shape), x.max().item(), x[0, 0, 0].item(), y
        ((1, 32, 32), 1.0, 0.0, 7)
    """

    def __init__(
        self,
        images: Tensor,
        targets: Tensor,
        image_size: int | None = None,
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        if images.dtype != torch.uint8:
            raise ValueError(f"images: expected uint8 pixels, got {images.dtype}")
        if images.ndim == 3:
            images = images.unsqueeze(1)
        if images.ndim != 4:
            raise ValueError(f"images: expected (N, H, W) or (N, C, H, W), got {tuple(images.shape)}")
        if targets.shape != (images.shape[0],):
            raise ValueError(
                f"targets: expected shape ({images.shape[0]},) to match images, got {tuple(targets.shape)}"
            )
        height, width = images.shape[-2:]
        if image_size is not None and image_size < max(height, width):
            raise ValueError(f"image_size: expected at least {max(height, width)}, got {image_size}")
        self.images = images
        self.targets = targets.long()
        self.transform = transform
        extra_h = 0 if image_size is None else image_size - height
        extra_w = 0 if image_size is None else image_size - width
        self._padding = (extra_w // 2, extra_w - extra_w // 2, extra_h // 2, extra_h - extra_h // 2)

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image = self.images[index].float().div_(255.0)
        if any(self._padding):
            image = F.pad(image, self._padding)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])


def make_loader(
    dataset: Dataset,
    batch_size: int,
    num_workers: int,
    shuffle_seed: int | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> DataLoader:
    """The loader every dlguard datamodule returns.

    Shuffled by a generator seeded with ``shuffle_seed`` (training) or in order (``None``: evaluation);
    workers kept alive across epochs when there are any.
    """
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle_seed is not None,
        num_workers=num_workers,
        generator=None if shuffle_seed is None else torch.Generator().manual_seed(shuffle_seed),
        persistent_workers=num_workers > 0,
        collate_fn=collate_fn,
    )
