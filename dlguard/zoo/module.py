"""A LightningModule that trains any classifier network."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torchmetrics.classification import MulticlassAccuracy

__all__ = ["ClassifierModule"]


class ClassifierModule(L.LightningModule):
    """Wrap a network that maps a batch to logits ``(B, K)``: cross-entropy and Adam.

    Logged metrics:
        ``train_loss`` (per step and epoch), ``val_loss`` and ``val_acc`` (per epoch).

    Args:
        net: the classifier; its forward returns logits.
        num_classes: ``K``.
        lr: Adam learning rate.
        weight_decay: Adam weight decay.

    Example:
        >>> import torch
        >>> from dlguard.zoo import mnist_a
        >>> module = ClassifierModule(mnist_a(), num_classes=10)
        >>> module(torch.zeros(4, 1, 28, 28)).shape
        torch.Size([4, 10])
    """

    def __init__(self, net: nn.Module, num_classes: int = 10, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes: expected at least 2, got {num_classes}")
        if lr <= 0:
            raise ValueError(f"lr: expected a positive learning rate, got {lr}")
        self.save_hyperparameters(ignore=["net"])
        self.net = net
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x, y = batch[0], batch[1]  # (image, label, ...): scene batches carry masks too
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        logits = self(x)
        self.val_acc(logits, y)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True, sync_dist=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
