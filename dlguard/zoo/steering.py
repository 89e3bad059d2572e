"""Steering-angle CNNs shaped like DeepTest's Epoch and Chauffeur models (papers/004_…, Table 3), scaled down.

Both map RGB road images ``(B, 3, H, W)`` in ``[0, 1]`` (:func:`~dlguard.data.roads.make_roads`, default
``48 x 64``) to one steering angle per image, ``(B, 1)``; :class:`SteeringModule` trains either with the
mean squared error and serves ``(B,)`` angles.

- **Epoch** (Udacity challenge 2, team cg23): three blocks of a 3x3 convolution (``same`` padding), ReLU,
  2x2 max-pool and dropout, then a fully connected ReLU layer with dropout and a linear output. The
  original has 32/64/128 filters and 1,024 hidden units on 128x128 images; here 16/32/64 and 128.
- **Chauffeur** (team chauffeur, its CNN part without the LSTM): six convolutions with ReLU, spatial dropout
  and max-pooling after the first five, then dropout and a linear output. The original widths
  16/20/40/60/80/128 are halved.
"""

from __future__ import annotations

from collections import OrderedDict

import lightning as L
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torchmetrics.regression import MeanSquaredError

from dlguard._validation import finite_float, positive_int

__all__ = ["SteeringModule", "chauffeur_steering", "epoch_steering"]


class Centre(nn.Module):
    """``2·x − 1``: pixels from ``[0, 1]`` to ``[−1, 1]``, the first layer of both steering networks (as in Epoch)."""

    def forward(self, x: Tensor) -> Tensor:
        return 2.0 * x - 1.0


def _check_input(in_channels: int, input_size: tuple[int, int], halvings: int) -> tuple[int, int]:
    positive_int("in_channels", in_channels)
    if len(input_size) != 2:
        raise ValueError(f"input_size: expected (H, W), got {input_size!r}")
    height, width = (positive_int("input_size", side) for side in input_size)
    if min(height, width) < 2**halvings:
        raise ValueError(
            f"input_size: expected sides of at least {2**halvings} ({halvings} max-pools halve them), got {input_size}"
        )
    return height >> halvings, width >> halvings


def epoch_steering(
    in_channels: int = 3,
    input_size: tuple[int, int] = (48, 64),
    widths: tuple[int, int, int] = (16, 32, 64),
    hidden: int = 128,
) -> nn.Sequential:
    """DeepTest's Epoch model scaled down: 3x (conv3x3 → ReLU → max-pool → dropout), FC, out ``(B, 1)``.

    Dropout is 0.25 after the first two blocks and 0.5 after the third and the hidden layer, as in Epoch.

    Args:
        in_channels: image channels.
        input_size: ``(H, W)`` of the images (the fully connected layer depends on it).
        widths: filters of the three convolutions.
        hidden: units of the fully connected layer.

    Example:
        >>> net = epoch_steering()
        >>> net(torch.zeros(2, 3, 48, 64)).shape
        torch.Size([2, 1])
        >>> [m.out_channels for m in net.modules() if isinstance(m, nn.Conv2d)], net.fc2.in_features
        ([16, 32, 64], 128)
    """
    height, width = _check_input(in_channels, input_size, 3)
    positive_int("hidden", hidden)
    channels = [in_channels, *(positive_int("widths", w) for w in widths)]
    if len(channels) != 4:
        raise ValueError(f"widths: expected three filter counts, got {widths!r}")
    layers: OrderedDict[str, nn.Module] = OrderedDict(centre=Centre())
    for i, drop in enumerate((0.25, 0.25, 0.5)):
        layers[f"conv{i + 1}"] = nn.Conv2d(channels[i], channels[i + 1], 3, padding=1)
        layers[f"relu{i + 1}"] = nn.ReLU()
        layers[f"pool{i + 1}"] = nn.MaxPool2d(2)
        layers[f"drop{i + 1}"] = nn.Dropout(drop)
    layers["flatten"] = nn.Flatten()
    layers["fc1"] = nn.Linear(channels[-1] * height * width, hidden)
    layers["relu4"] = nn.ReLU()
    layers["drop4"] = nn.Dropout(0.5)
    layers["fc2"] = nn.Linear(hidden, 1)
    return nn.Sequential(layers)


def chauffeur_steering(
    in_channels: int = 3,
    input_size: tuple[int, int] = (48, 64),
    widths: tuple[int, ...] = (8, 10, 20, 30, 40, 64),
) -> nn.Sequential:
    """DeepTest's Chauffeur CNN scaled down: six convolutions (5x5, 5x5, then 3x3), five max-pools, out ``(B, 1)``.

    Each of the first five convolutions is followed by ReLU, spatial dropout (0.1) and a 2x2 max-pool;
    the sixth by ReLU; then dropout (0.5) and a linear layer.

    Args:
        in_channels: image channels.
        input_size: ``(H, W)``, each at least 32.
        widths: filters of the six convolutions.

    Example:
        >>> net = chauffeur_steering()
        >>> net(torch.zeros(2, 3, 48, 64)).shape
        torch.Size([2, 1])
        >>> sum(isinstance(m, nn.Conv2d) for m in net.modules())
        6
    """
    height, width = _check_input(in_channels, input_size, 5)
    channels = [in_channels, *(positive_int("widths", w) for w in widths)]
    if len(channels) != 7:
        raise ValueError(f"widths: expected six filter counts, got {widths!r}")
    layers: OrderedDict[str, nn.Module] = OrderedDict(centre=Centre())
    for i in range(6):
        kernel = 5 if i < 2 else 3
        layers[f"conv{i + 1}"] = nn.Conv2d(channels[i], channels[i + 1], kernel, padding=kernel // 2)
        layers[f"relu{i + 1}"] = nn.ReLU()
        if i < 5:
            layers[f"drop{i + 1}"] = nn.Dropout2d(0.1)
            layers[f"pool{i + 1}"] = nn.MaxPool2d(2)
    layers["flatten"] = nn.Flatten()
    layers["drop6"] = nn.Dropout(0.5)
    layers["fc"] = nn.Linear(channels[-1] * height * width, 1)
    return nn.Sequential(layers)


class SteeringModule(L.LightningModule):
    """Wrap a steering network (output ``(B, 1)`` or ``(B,)``): mean squared error and Adam.

    ``forward`` returns the angles ``(B,)`` (a trailing dimension of size 1 is squeezed). Batches are
    ``(images, angles, ...)`` tuples with float angles ``(B,)``.

    Logged metrics:
        ``train/mse`` (per step and epoch), ``val/mse`` and ``test/mse`` (per epoch, over the whole set).

    Args:
        net: the steering network.
        lr: Adam learning rate.
        weight_decay: Adam weight decay.
        cosine_decay: anneal the learning rate from ``lr`` to 0 over the trainer's ``max_epochs`` (a cosine,
            stepped per epoch); ``False`` keeps it constant.

    Example:
        >>> module = SteeringModule(epoch_steering())
        >>> module(torch.zeros(4, 3, 48, 64)).shape
        torch.Size([4])
    """

    def __init__(self, net: nn.Module, lr: float = 1e-3, weight_decay: float = 0.0, cosine_decay: bool = False) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            raise ValueError(f"net: expected an nn.Module, got {type(net).__name__}")
        if finite_float("lr", lr) <= 0:
            raise ValueError(f"lr: expected a positive learning rate, got {lr}")
        if finite_float("weight_decay", weight_decay) < 0:
            raise ValueError(f"weight_decay: expected 0 or more, got {weight_decay}")
        self.save_hyperparameters(ignore=["net"])
        self.net = net
        self.val_mse = MeanSquaredError()
        self.test_mse = MeanSquaredError()

    def forward(self, x: Tensor) -> Tensor:
        out = self.net(x)
        return out.squeeze(-1) if out.ndim == 2 and out.shape[-1] == 1 else out

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x, y = batch[0], batch[1]
        loss = F.mse_loss(self(x), y.to(x.dtype))
        self.log("train/mse", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        self.val_mse(self(x), y.to(x.dtype))
        self.log("val/mse", self.val_mse, prog_bar=True)

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        self.test_mse(self(x), y.to(x.dtype))
        self.log("test/mse", self.test_mse)

    def configure_optimizers(self) -> torch.optim.Optimizer | dict[str, object]:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        if not self.hparams.cosine_decay:
            return optimizer
        epochs = self.trainer.max_epochs
        if epochs is None or epochs < 1:
            raise ValueError(f"cosine_decay: needs a trainer with max_epochs >= 1, got max_epochs={epochs}")
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)}
