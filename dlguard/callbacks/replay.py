"""Failure replay: stored failures substituted for rows of training batches (SPEC §6)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from dlguard._own_random import RankGenerator
from dlguard._validation import finite_float, probability
from dlguard.data.batch import BatchAccessor, BatchKeys
from dlguard.data.failure_bank import FailureBank

__all__ = ["FailureReplay"]

_REPEATS = 1.0  # the default dose; another enters the checkpoint key


class FailureReplay(Callback):
    """Substitute failures from a :class:`~dlguard.data.FailureBank` for rows of training batches.

    Callbacks that find failures deposit them in the bank (``RobustnessCallback(bank=...)``); this
    callback mixes them into training in ``on_train_batch_start``, so any LightningModule trains
    on them without code changes (Lightning has no callback hook after the batch transfer, and this
    one receives the batch on the device). Rows of each batch are chosen at random and replaced by
    rows drawn uniformly from the bank, inputs and labels alike, through the batch accessor: tuple,
    list or dict batches, or a callable; only those two are written, so other fields of a replaced row
    (a dict batch's masks or ids) keep the original row's values. A list or dict batch gets new
    tensors, so a loader that hands out views of its dataset keeps the dataset as it was. Nothing
    happens while the bank is empty. Draws come from a generator of the callback's own (seeded, in
    the checkpoint), so the global RNG that dropout and augmentations use is untouched; no host sync
    per batch.

    **The dose.** A failure is one more training input, not one to learn by heart: each stored failure
    is replayed ``repeats`` times per training epoch on average (once by default, as often as any
    other input), spread evenly over the epoch's batches -- ``repeats · len(bank) / batches`` rows per
    batch, the fractions carried from batch to batch -- and never more than ``round(fraction · B)``
    rows of a batch of ``B``. A bank of 120 failures and an epoch of 55 batches of 64 replace 2 or 3
    rows per batch; replacing a quarter of every batch instead would show each of them 7 times an
    epoch, and each of a bank of two HDA examples 440 times. ``repeats=None`` replaces
    ``round(fraction · B)`` rows of every batch whatever the bank holds, as does a call without a
    trainer or an epoch of unknown length (an iterable dataset: ``num_training_batches`` is infinite).
    Feedback starts in the epoch after the first measurement that deposits failures: a callback
    measures at the end of a validation epoch, once the model classifies its probe set
    (``min_accuracy``).

    Logged at the end of every training epoch (summed over processes, and over the replays of one
    ``Trainer``): ``replay/rows``, the training rows this epoch replaced by stored failures, and
    ``replay/failures``, the failures the bank held when the epoch started (what it replayed from; the
    epoch's own validation deposits feed the next; a bank two replays share counted once) -- the dose a
    loop fed back, beside the curves it moved.
    A run resumed from a checkpoint saved inside an epoch logs that epoch's figures as an uninterrupted
    run does (Lightning < 2.5 trains the batch in flight at the checkpoint again, and they count it;
    under DDP the part before the checkpoint is rank zero's on every process).

    The bank is part of this callback's checkpoint state. Under DDP each process keeps and replays
    the failures found on its own shard; a checkpoint holds rank zero's bank and generator, and after
    a restart the other processes reseed theirs so that they keep drawing apart.

    Args:
        bank: the bank to replay from (a new one when ``None``: pass ``replay.bank`` to producers).
        fraction: the most of a batch replaced, in ``[0, 1]`` (with ``repeats=None``: the share of every batch).
        repeats: replays of each stored failure per training epoch, on average (``> 0``), or ``None``.
        batch_keys: ``(inputs key, target key)`` or a callable ``batch -> (inputs, target)``.
        seed: seed of the draws (each process adds its rank); two replays in one ``Trainer`` (one bank each,
            or sharing one) need different seeds, doses or fractions, which their checkpoint keys tell apart.

    Example:
        >>> import torch
        >>> replay = FailureReplay(fraction=0.5)
        >>> replay.bank.add(torch.ones(4, 1, 2, 2), torch.tensor([9, 9, 9, 9]), origin="robustness")
        >>> batch = [torch.zeros(4, 1, 2, 2), torch.tensor([0, 1, 2, 3])]
        >>> replay.on_train_batch_start(None, None, batch, 0)
        >>> int((batch[1] == 9).sum()), int(batch[0].sum() / 4)  # two rows now hold stored failures
        (2, 2)
    """

    def __init__(
        self,
        bank: FailureBank | None = None,
        fraction: float = 0.25,
        repeats: float | None = _REPEATS,
        batch_keys: BatchKeys = (0, 1),
        seed: int = 0,
    ) -> None:
        if bank is not None and not isinstance(bank, FailureBank):
            raise ValueError(f"bank: expected a FailureBank or None, got {type(bank).__name__}")
        self.bank = bank if bank is not None else FailureBank()
        self.fraction = probability("fraction", fraction)
        if repeats is not None and finite_float("repeats", repeats) <= 0:
            raise ValueError(
                f"repeats: expected a positive number of replays per failure and epoch, or None, got {repeats!r}"
            )
        self.repeats = None if repeats is None else float(repeats)
        self._owed = 0.0  # rows the dose owes, carried from batch to batch
        self.batch_keys, self.seed = batch_keys, seed
        self.accessor = BatchAccessor(batch_keys)
        self.replayed = 0
        # the epoch's dose, begun by its first batch (Lightning skips on_train_epoch_start on some resumptions)
        self._dose_epoch: int | None = None
        self._dose_rows = self._dose_held = 0
        self._own = RankGenerator(seed)
        self._checked_version = -1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._own.setup(trainer.global_rank)
        if stage == "fit":  # another fit's epoch 0 starts afresh (a checkpoint, restored after this, resumes)
            self._dose_epoch = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._own.start(trainer.global_rank, self.replayed)  # a checkpoint holds rank zero's generator

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_epoch(trainer)  # no batch began it: resumed from a checkpoint without the dose, after its batches
        sharing = [c for c in trainer.callbacks if isinstance(c, FailureReplay) and c.bank is self.bank]
        held = self._dose_held if not sharing or sharing[0] is self else 0  # a shared bank counts once
        dose = {"replay/rows": self._dose_rows, "replay/failures": held}
        for name, value in dose.items():  # a sum: over the processes' shards, and over two replays' banks
            pl_module.log(name, float(value), on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        inputs, _ = self.accessor.read(batch)  # an unreadable batch fails at once, naming batch_keys
        self._start_epoch(trainer)
        if not len(self.bank):
            return
        count = self._count(trainer, len(inputs))
        if count == 0:
            return
        if self._checked_version != self.bank.version:  # once per change of the bank, not per batch
            if self.bank.sample_shape != tuple(inputs.shape[1:]):
                raise ValueError(
                    f"bank: holds inputs of shape {self.bank.sample_shape}, the training batch's inputs are "
                    f"{tuple(inputs.shape[1:])}"
                )
            self._checked_version = self.bank.version
        generator = self._own.generator
        rows = torch.randperm(len(inputs), generator=generator)[:count].to(inputs.device)
        stored, labels = self.bank.sample(count, generator, device=inputs.device)
        with torch.no_grad():
            self.accessor.write_rows(batch, rows, stored, labels)
        self.replayed += count
        self._dose_rows += count

    def _start_epoch(self, trainer: L.Trainer | None) -> None:
        """Begin the epoch's dose at its first batch: what the bank holds then is what the epoch replays from."""
        epoch = getattr(trainer, "current_epoch", None)  # None: called by hand, outside a Trainer
        if epoch != self._dose_epoch:
            self._dose_epoch, self._dose_rows, self._dose_held = epoch, 0, len(self.bank)

    def _count(self, trainer: L.Trainer | None, batch_size: int) -> int:
        """Rows of this batch to replace: the dose's share, carried over, within ``fraction`` of the batch."""
        most = round(self.fraction * batch_size)
        batches = getattr(trainer, "num_training_batches", None)
        if self.repeats is None or not isinstance(batches, int | float) or not 0 < batches < float("inf"):
            return most
        self._owed += self.repeats * len(self.bank) / batches
        count = min(most, int(self._owed + 1e-9))  # ten carried tenths make one row, not 0.999...
        self._owed = min(self._owed - count, 1.0)  # what the cap held back is not made up later
        return count

    @property
    def state_key(self) -> str:
        # one replay per bank is a setting users have: a seed or dose of its own gives each its own key
        variants: dict[str, Any] = {} if self.repeats == _REPEATS else {"repeats": self.repeats}
        if self.seed:
            variants["seed"] = self.seed
        return self._generate_state_key(fraction=self.fraction, **variants)

    def state_dict(self) -> dict[str, Any]:
        return {
            "bank": self.bank.state_dict(),
            "generator": self._own.state(),
            "replayed": self.replayed,
            "owed": self._owed,
            "epoch_dose": {"epoch": self._dose_epoch, "rows": self._dose_rows, "held": self._dose_held},
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.bank.load_state_dict(state_dict.get("bank", {}))
        self.replayed = int(state_dict.get("replayed", 0))
        self._owed = float(state_dict.get("owed", 0.0))
        dose = state_dict.get("epoch_dose", {})  # a checkpoint saved inside an epoch: the dose so far
        self._dose_epoch = dose.get("epoch")
        self._dose_rows, self._dose_held = int(dose.get("rows", 0)), int(dose.get("held", 0))
        self._own.load(state_dict.get("generator"))


def changes_batches(callback: Callback) -> bool:
    """Whether ``callback`` changes the rows of training batches: a :class:`FailureReplay`, or one with a guide.

    Example:
        >>> from dlguard.callbacks import GaussianNoise, RobustnessCallback
        >>> changes_batches(FailureReplay()), changes_batches(RobustnessCallback()), changes_batches(GaussianNoise())
        (True, False, False)
    """
    return isinstance(callback, FailureReplay) or getattr(callback, "guide", None) is not None
