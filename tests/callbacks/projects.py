"""A user's own Lightning project, written the way users write them, to run dlguard's callbacks against.

- ``NormalizedDigits``: a LightningModule whose network expects *normalised* input (as every
  torchvision classifier does); its steps normalise the pixel batches themselves, so callbacks
  must be given ``preprocess=normalize`` to see what the model sees. Optionally its forward returns
  ``{"logits": ...}`` (needs ``output_transform``). Its weights are the shipped ``mnist_a`` weights,
  folded into a first layer that undoes the normalisation, so the model is accurate from the start.
- ``DigitDicts``: a LightningDataModule of dict batches ``{"image", "label"}`` over the embedded
  MNIST, with a fixed (unshuffled) training order, and optionally several validation loaders.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from dlguard.data import MNISTDataModule
from dlguard.zoo import pretrained

MEAN, STD = 0.5, 0.25  # fed raw pixels, the network gets 23 % of the digits right instead of 95 %


def normalize(images: Tensor) -> Tensor:
    return (images - MEAN) / STD


class Denormalize(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * STD + MEAN


class NormalizedDigits(L.LightningModule):
    def __init__(self, output_dict: bool = False, lr: float = 1e-3) -> None:
        super().__init__()
        self.output_dict, self.lr = output_dict, lr
        self.backbone = nn.Sequential(Denormalize(), pretrained("mnist_a"))

    def forward(self, x: Tensor) -> Any:
        logits = self.backbone(x)
        return {"logits": logits} if self.output_dict else logits

    def _logits(self, batch: dict[str, Tensor]) -> Tensor:
        out = self(normalize(batch["image"]))
        return out["logits"] if self.output_dict else out

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = F.cross_entropy(self._logits(batch), batch["label"])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        accuracy = (self._logits(batch).argmax(1) == batch["label"]).float().mean()
        self.log("val_acc", accuracy, add_dataloader_idx=True)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.log("test_acc", (self._logits(batch).argmax(1) == batch["label"]).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class _Dicts(Dataset):
    def __init__(self, base: Dataset, indices: range) -> None:
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, label = self.base[self.indices[index]]
        return {"image": image, "label": label}


class DigitDicts(L.LightningDataModule):
    """Dict batches; ``val_splits`` cut the 1,000 validation digits into several loaders."""

    def __init__(self, batch_size: int = 50, val_splits: tuple[int, ...] = (1000,), train_size: int = 4000) -> None:
        super().__init__()
        self.batch_size, self.val_splits, self.train_size = batch_size, val_splits, train_size
        self._mnist = MNISTDataModule()

    def setup(self, stage: str | None = None) -> None:
        self._mnist.setup()

    def train_dataloader(self) -> DataLoader:
        data = _Dicts(self._mnist.train_set, range(self.train_size))
        return DataLoader(data, batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self) -> list[DataLoader] | DataLoader:
        loaders, start = [], 0
        for size in self.val_splits:
            loaders.append(
                DataLoader(_Dicts(self._mnist.val_set, range(start, start + size)), batch_size=self.batch_size)
            )
            start += size
        return loaders if len(loaders) > 1 else loaders[0]

    def test_dataloader(self) -> DataLoader:
        return DataLoader(_Dicts(self._mnist.val_set, range(500, 1000)), batch_size=self.batch_size)
