"""Keeping the originals: the rows dlguard's loops changed train beside the loader's rows, not instead of them."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from dlguard.callbacks.replay import changes_batches
from dlguard.data.batch import BatchAccessor, describe_batch

__all__ = ["KeepOriginals"]


class _Keeper(Callback):
    """Placed by :class:`KeepOriginals` before the first callback that changes batches: copies the batch's rows."""

    def __init__(self, accessor: BatchAccessor) -> None:
        self.accessor = accessor
        self.kept: tuple[Tensor, Tensor] | None = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, list | MutableMapping):  # before any loop changed a row
            raise ValueError(
                f"batch: KeepOriginals appends rows to the training batch, so it must be a list or a dict, got "
                f"{describe_batch(batch)} (a collate_fn that returns a list or a dict gives one)"
            )
        inputs, target = self.accessor.read(batch)
        self.kept = (inputs.detach().clone(), target.detach().clone())


class KeepOriginals(Callback):
    """Appends to each training batch the original of every row dlguard's loops changed in it.

    dlguard's loops substitute training rows: a guide (``ScoreGuidedPadding``,
    ``ErrorGuidedAugmentation``) transforms them and :class:`FailureReplay` puts stored failures in
    their stead, so a row a loop changes is not trained on as the loader gave it in that epoch. The
    papers' retraining instead *adds* the test cases it found to the training set; so does batch
    augmentation (Hoffer et al., "Augment your batch", arXiv 1901.09335). With this callback every
    loader row is trained on once an epoch as the loader (and its transforms) gave it, and the loops'
    rows come on top: a batch of ``B`` rows grows by the rows the loops changed, and the loops draw as
    they would without it (``benchmarks/anchor.py`` measures it: README, "Against the goal").

    In ``setup`` of a fit the callback puts a keeper of its own before the first of the trainer's
    callbacks that changes batches (a :class:`FailureReplay`, or a callback with a ``guide``) and
    moves itself last (before the checkpoints, which Lightning keeps last), so the keeper copies the
    rows as the loader gave them and this callback compares them with what the loops made. Rows whose
    inputs or target differ are appended, their originals from the copy (a NaN kept is no change);
    every other tensor or list field of a list or dict batch whose length is the batch's (a mask, a
    list of ids) is extended by the same rows, so the batch stays one batch; tuples and nested dicts
    are not (a warning names them). A callback of the user's that changes rows and is listed after
    the first loop (a mixup) counts as one of the loops; list it first to have its rows kept as
    originals. The callbacks' order is put back when the fit ends or fails; ``validate`` and
    ``test`` leave it be. Every training batch is copied and compared, also while the loops change
    nothing yet, and the count of changed rows is read on the host once a batch (the batch's length
    depends on it). One per ``Trainer``: a second would append the originals again, and Lightning
    refuses it when the ``Trainer`` is made ("more than one stateful callback of type ``KeepOriginals``").

    Logged at the end of every training epoch (summed over processes): ``originals/rows``, the
    originals appended this epoch. Under DDP each process appends to its own batches (under
    ``ddp_spawn`` the main process's ``appended`` stays 0; the log sums them).

    The training step gets the larger batch, so its cost grows with the rows appended
    (``benchmarks/keep_originals.py``: the copy and comparison cost a millisecond or two a batch, the
    step on ``B + n`` rows about ``(B + n) / B`` times the step on ``B``), and ``self.log`` in the
    step infers the larger batch size unless it is given ``batch_size``.

    Args:
        batch_keys: ``(inputs key, target key)`` of a list or dict batch (a callable cannot grow a batch).

    Attributes:
        appended: the originals appended in this process since the callback was made, over every fit (a
            resumed run counts on from its checkpoint's).

    Example:
        >>> import torch
        >>> from dlguard.callbacks import FailureReplay
        >>> replay = FailureReplay(fraction=0.5, repeats=None)
        >>> replay.bank.add(torch.ones(2, 1, 2, 2), torch.tensor([9, 9]), origin="robustness")
        >>> keep = KeepOriginals()
        >>> batch = [torch.zeros(4, 1, 2, 2), torch.tensor([0, 1, 2, 3])]
        >>> keep.keeper.on_train_batch_start(None, None, batch, 0)  # in a fit: before the replay
        >>> replay.on_train_batch_start(None, None, batch, 0)
        >>> keep.on_train_batch_start(None, None, batch, 0)  # in a fit: last
        >>> len(batch[1]), int((batch[1] == 9).sum()), sorted(batch[1][4:].tolist()) == sorted(
        ...     set(range(4)) - set(batch[1][:4].tolist()))
        (6, 2, True)
    """

    def __init__(self, batch_keys: tuple[Any, Any] = (0, 1)) -> None:
        if callable(batch_keys):
            raise ValueError(
                "batch_keys: KeepOriginals appends rows to the batch, so it needs (inputs key, target key) of a "
                "list or dict batch, not a callable"
            )
        self.batch_keys = batch_keys
        self.accessor = BatchAccessor(batch_keys, allow_callable=False)
        self.keeper = _Keeper(self.accessor)
        self.appended = 0
        self._epoch: int | None = None
        self._epoch_rows = 0
        self._given: list[Callback] | None = None  # the trainer's callbacks as given, while a fit runs
        self._not_grown: set[Any] = set()  # the tuple and dict fields a warning named, in this fit

    # ---- placing the keeper -----------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._put_back(trainer)  # a fit that did not end (an interrupted run) left them placed
        self._epoch, self._not_grown = None, set()
        callbacks = trainer.callbacks
        changers = [at for at, callback in enumerate(callbacks) if callback is not self and changes_batches(callback)]
        if not changers:
            rank_zero_warn(
                "KeepOriginals: no callback changes the training batches (a FailureReplay or a callback with a "
                "guide), so there are no originals to keep"
            )
            return
        self._given = list(callbacks)
        placed = [c for c in [*callbacks[: changers[0]], self.keeper, *callbacks[changers[0] :]] if c is not self]
        # last but for the checkpoints (Lightning's order), so a ModelCheckpoint can monitor originals/rows
        last = max(i for i, c in enumerate(placed) if changes_batches(c))
        at = next((i for i, c in enumerate(placed) if i > last and isinstance(c, Checkpoint)), len(placed))
        # a new list, as Lightning's tuner binds one: the hook being called goes on over the old
        trainer.callbacks = [*placed[:at], self, *placed[at:]]

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._put_back(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._put_back(trainer)

    def _put_back(self, trainer: L.Trainer) -> None:
        """The trainer's callbacks in the order given (and any Lightning added since, after them), no keeper."""
        if self._given is not None:
            now = [c for c in trainer.callbacks if c is not self.keeper]
            trainer.callbacks = [c for c in self._given if c in now] + [c for c in now if c not in self._given]
            self._given = None
        self.keeper.kept = None

    # ---- appending the originals ------------------------------------------------------------

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._start_epoch(trainer)
        if self.keeper.kept is None:
            return
        kept_inputs, kept_target = self.keeper.kept
        self.keeper.kept = None
        inputs, target = self.accessor.read(batch)
        if len(inputs) != len(kept_inputs):
            raise ValueError(
                f"batch: a callback after the first loop changed the batch's length from {len(kept_inputs)} to "
                f"{len(inputs)} rows; list that callback before the first FailureReplay or guided callback"
            )
        rows = self.rows(self.changed(inputs, target, kept_inputs, kept_target))
        if not len(rows):
            return
        with torch.no_grad():
            self._append(batch, rows, (inputs, target), (kept_inputs[rows], kept_target[rows]))
        self.appended += len(rows)
        self._epoch_rows += len(rows)

    @staticmethod
    def changed(inputs: Tensor, target: Tensor, kept_inputs: Tensor, kept_target: Tensor) -> Tensor:
        """``(B,)``: whether each row's inputs or target differ from the kept original's (a NaN kept is no change)."""

        def differ(now: Tensor, then: Tensor) -> Tensor:
            same = now == then
            if now.is_floating_point():
                same |= now.isnan() & then.isnan()
            return ~same.reshape(len(now), -1).all(1)

        return differ(inputs, kept_inputs) | differ(target, kept_target)

    def rows(self, changed: Tensor) -> Tensor:
        """The rows whose originals go in: the changed ones (one host sync: the batch's new length)."""
        return changed.nonzero().squeeze(1)

    def _append(self, batch: Any, rows: Tensor, read: tuple[Tensor, Tensor], originals: tuple[Tensor, Tensor]) -> None:
        """Grows every field of the batch's length by ``rows``: the inputs and target (``read``) by ``originals``.

        A tuple or dict field is not grown; the first time one is met in a fit, a warning names it.
        """
        size = len(read[0])
        for key in list(batch) if isinstance(batch, Mapping) else range(len(batch)):
            field = batch[key]
            if field is read[0] or field is read[1]:  # found by identity: any key form the accessor reads
                batch[key] = torch.cat([field, originals[0] if field is read[0] else originals[1]])
            elif isinstance(field, Tensor) and field.ndim and len(field) == size:
                batch[key] = torch.cat([field, field[rows.to(field.device)]])
            elif isinstance(field, list) and len(field) == size:
                batch[key] = field + [field[at] for at in rows.tolist()]
            elif isinstance(field, tuple | Mapping) and key not in self._not_grown:
                self._not_grown.add(key)
                rank_zero_warn(
                    f"KeepOriginals: the batch's field {key!r} is a {type(field).__name__}, which it does not "
                    f"extend by the {len(rows)} appended rows; make it a tensor or a list of the batch's length "
                    "(one field per entry of a nested dict) to have it grow with the batch"
                )

    # ---- the epoch's count, and the checkpoint ----------------------------------------------

    def _start_epoch(self, trainer: L.Trainer | None) -> None:
        epoch = getattr(trainer, "current_epoch", None)  # Lightning skips on_train_epoch_start on some resumptions
        if epoch != self._epoch:
            self._epoch, self._epoch_rows = epoch, 0

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_epoch(trainer)  # no batch began it
        pl_module.log("originals/rows", float(self._epoch_rows), on_step=False, on_epoch=True, reduce_fx="sum",
                      sync_dist=True)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"appended": self.appended, "epoch": self._epoch, "epoch_rows": self._epoch_rows}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.appended = int(state_dict.get("appended", 0))
        self._epoch, self._epoch_rows = state_dict.get("epoch"), int(state_dict.get("epoch_rows", 0))
