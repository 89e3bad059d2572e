"""Gaussian noise on the training batches, as the first callback: the standard augmentation under dlguard's loops."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from dlguard._random import content_keys, keyed_normal, keyed_uniform
from dlguard._validation import check_tensor, check_values, finite_float
from dlguard._validation import value_range as check_value_range
from dlguard.callbacks.replay import changes_batches
from dlguard.data.batch import BatchAccessor, BatchKeys

__all__ = ["GaussianNoise"]

_RANGE_HINT = (
    "the noise goes on the pixels before the network's normalisation (give that as the loops' preprocess), or set "
    "GaussianNoise(value_range=...) to the range the inputs lie in"
)
_NOISE_SALT = 1 << 20  # the noise's draws for epoch e use salts 2^21 + 2e and 2^21 + 2e + 1; sigma's use e


class GaussianNoise(Callback):
    """Gaussian noise ``x + σ·ε``, ``σ ~ U(0, max_sigma)`` per input, on every training batch before the loops.

    The standard augmentation under dlguard's loops in the closed-loop benchmark's anchored arm (README,
    "Against the goal"; :func:`~dlguard.callbacks.closed_loop_callbacks` lists it first). It is a
    callback, not a dataset transform, for three reasons: :class:`~dlguard.callbacks.HDACallback` fits
    its distribution on ``train_dataloader.dataset``, which stays clean; listed before the loops, it
    noises the loader's rows before a guide transforms them and before :class:`FailureReplay` puts
    stored failures in their stead, so a replayed failure is not noised again; and
    :class:`~dlguard.callbacks.KeepOriginals` keeps the rows as the noise left them.

    The output is clamped to ``value_range``. Each input's ``σ`` and noise are keyed by its content,
    the ``seed`` and the epoch (``dlguard._random``): a new draw every epoch, the same for 1 or N
    processes and any batch order, and a run resumed from a checkpoint draws what an uninterrupted run
    draws, with no state to save; two identical inputs get the same noise. The global RNG is not
    touched. The first training batch of a fit is checked (no NaN, inside ``value_range``); later
    ones are not read. A list or dict batch gets a new inputs tensor, so a loader whose batches are
    views of its dataset (``batch_size=None`` over pre-batched tensors) keeps the dataset clean; a
    tuple batch or a bare tensor is written in place.

    Args:
        max_sigma: the largest standard deviation, in units of ``value_range`` (``>= 0``; 0.3, the
            benchmark's, by default).
        batch_keys: where the inputs are in each batch (see :class:`~dlguard.data.BatchAccessor`).
        value_range: ``(low, high)`` the inputs lie in and the output is clamped to (the pixels before
            the network's normalisation).
        seed: fixes the draws with the inputs' content and the epoch. The global seed
            (``L.seed_everything``) is not read: give each run of a multi-seed study its own ``seed``.

    Example:
        >>> import torch
        >>> noise = GaussianNoise(batch_keys=("image", "label"))
        >>> images = torch.linspace(0.3, 0.7, 4).reshape(4, 1, 1, 1).expand(4, 1, 8, 8)  # four pictures, one grey each
        >>> batch = {"image": images.clone(), "label": torch.zeros(4, dtype=torch.long)}
        >>> noise.on_train_batch_start(None, None, batch, 0)  # a Trainer calls it; outside one, epoch 0
        >>> sigma = (batch["image"] - images).flatten(1).std(dim=1)  # each picture's own sigma, up to 0.3
        >>> out = batch["image"]
        >>> bool((sigma > 0).all() and (sigma < 0.35).all()), bool(out.min() >= 0 and out.max() <= 1)
        (True, True)
    """

    def __init__(
        self,
        max_sigma: float = 0.3,
        batch_keys: BatchKeys = (0, 1),
        value_range: tuple[float, float] = (0.0, 1.0),
        seed: int = 0,
    ) -> None:
        if finite_float("max_sigma", max_sigma) < 0:
            raise ValueError(f"max_sigma: expected a non-negative standard deviation, got {max_sigma!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: expected an integer, got {seed!r}")
        bounds = check_value_range("value_range", value_range)
        if bounds is None:
            raise ValueError("value_range: expected (low, high): the noisy inputs are clamped to it")
        self.max_sigma, self.value_range, self.seed = float(max_sigma), bounds, seed
        self.batch_keys = batch_keys
        self.accessor = BatchAccessor(batch_keys)
        self._checked = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._checked = False
        callbacks = list(trainer.callbacks)
        earlier = [type(c).__name__ for c in callbacks[: callbacks.index(self)] if changes_batches(c)]
        if earlier:
            rank_zero_warn(
                f"GaussianNoise: listed after {', '.join(earlier)}, which change(s) training batches, so it noises "
                "their guided rows and replayed failures too; list it first, as the benchmark does"
            )

    def on_train_batch_start(
        self, trainer: L.Trainer | None, pl_module: L.LightningModule | None, batch: Any, batch_idx: int
    ) -> None:
        inputs = self.accessor.inputs(batch)
        if not self._checked:  # before any row changes: a wrong range or a NaN is named at once
            check_tensor("inputs", inputs, floating=True)
            check_values("inputs", inputs, self.value_range, hint=_RANGE_HINT)
        epoch = 0 if trainer is None else trainer.current_epoch
        keys = content_keys(inputs, self.seed)
        with torch.no_grad():  # the functional gaussian_noise would read sigma's values: a host sync per batch
            sigma = self.max_sigma * keyed_uniform(keys, (1,) * (inputs.ndim - 1), salt=epoch, dtype=inputs.dtype)
            noise = keyed_normal(keys, tuple(inputs.shape[1:]), salt=_NOISE_SALT + epoch, dtype=inputs.dtype)
            noisy = (inputs + sigma * noise).clamp(*self.value_range)
        self._put(batch, inputs, noisy)
        self._checked = True

    def _put(self, batch: Any, inputs: Tensor, noisy: Tensor) -> None:
        """A list or dict batch gets the new tensor, so a loader that hands out views of its dataset keeps it clean."""
        keys = self.accessor.keys
        if self.accessor.takes_new(batch):
            assert keys is not None
            batch[keys[0]] = noisy
        elif keys is not None or isinstance(batch, Tensor):  # a tuple (or a bare tensor) cannot take a new one
            inputs.copy_(noisy)
        else:  # a callable batch_keys: written through it, which checks it returns the batch's own tensors
            self.accessor.write(batch, noisy)
