"""KeepOriginals: the loops' rows trained beside the loader's, in a user's project as in a hand-made batch."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dlguard.augment import ErrorGuidedAugmentation, ScoreGuidedPadding
from dlguard.callbacks import DScoreCallback, FailureReplay, KeepOriginals, RobustnessCallback
from dlguard.data.failure_bank import FailureBank
from tests.quick import logged_by_epoch, quick_trainer


def loader_rows(count: int, shape: tuple[int, ...] = (1, 2, 2)) -> tuple[torch.Tensor, torch.Tensor]:
    """Row i holds i / 100 in every element and i as its label: a row names itself."""
    labels = torch.arange(count)
    return (labels.float() / 100).reshape(-1, *[1] * len(shape)).expand(-1, *shape).clone(), labels


def bank_of(labels: list[int], shape: tuple[int, ...] = (1, 2, 2)) -> FailureBank:
    """Failures labelled 150 and up, their inputs ones: never a loader row."""
    bank = FailureBank()
    bank.add(torch.ones(len(labels), *shape), torch.tensor(labels), origin="robustness")
    return bank


class Recording(L.LightningModule):
    """Records every training batch it is given; reads list or dict batches of any input shape."""

    def __init__(self, features: int = 4) -> None:
        super().__init__()
        self.layer = nn.Linear(features, 200)
        self.batches: list = []

    def training_step(self, batch, batch_idx):
        x, y = (batch["image"], batch["label"]) if isinstance(batch, dict) else batch
        self.batches.append({k: v for k, v in batch.items()} if isinstance(batch, dict) else list(batch))
        return nn.functional.cross_entropy(self.layer(x.flatten(1).to(self.layer.weight.dtype)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(rows: int = 32, shape: tuple[int, ...] = (1, 2, 2), batch_size: int = 8) -> DataLoader:
    return DataLoader(TensorDataset(*loader_rows(rows, shape)), batch_size=batch_size)


def check_anchored(batch: list[torch.Tensor], size: int, shape: tuple[int, ...] = (1, 2, 2)) -> int:
    """The batch is the loops' ``size`` rows and, after them, the original of each row a failure replaced."""
    inputs, labels = batch
    replaced = (labels[:size] >= 150).nonzero().squeeze(1)
    assert torch.equal(inputs[:size][replaced], torch.ones(len(replaced), *shape, dtype=inputs.dtype))
    originals = labels[size:]
    assert len(originals) == len(replaced) > 0
    assert set(originals.tolist()).isdisjoint(labels[:size].tolist())  # the rows the replay put out, each once
    assert torch.equal(inputs[size:], loader_rows(200, shape)[0][originals].to(inputs.dtype))  # as the loader gave
    return len(originals)


def test_a_fit_trains_on_the_replayed_rows_and_the_originals_they_replaced(tmp_path: Path) -> None:
    replay, keep = FailureReplay(bank_of([150, 151, 152]), fraction=0.25, repeats=None), KeepOriginals()
    model = Recording()
    trainer = quick_trainer(tmp_path, [keep, replay], epochs=1, train_batches=4, val_batches=0)
    given = list(trainer.callbacks)
    trainer.fit(model, loader())
    assert [check_anchored(batch, 8) for batch in model.batches] == [2, 2, 2, 2]
    loader_labels = torch.cat([batch[1][:8][batch[1][:8] < 150] for batch in model.batches])
    assert sorted([*loader_labels.tolist(), *torch.cat([b[1][8:] for b in model.batches]).tolist()]) == list(range(32))
    assert keep.appended == 8 and replay.replayed == 8
    assert logged_by_epoch(tmp_path / "metrics.csv")[0]["originals/rows"] == 8.0
    assert trainer.callbacks == given  # the keeper gone, the order as given


def test_a_row_changed_in_its_input_alone_or_its_label_alone_is_appended_and_no_other() -> None:
    keep = KeepOriginals()
    batch = [torch.rand(6, 3, 4, 4), torch.arange(6)]
    keep.keeper.on_train_batch_start(None, None, batch, 0)
    original = [part.clone() for part in batch]
    batch[0][2] = batch[0][2].flip(-1)  # a guide's row: the input changed, the label kept
    batch[1][4] = 0  # a replayed failure whose input is the original's: the label alone changed
    keep.on_train_batch_start(None, None, batch, 0)
    assert len(batch[0]) == len(batch[1]) == 8 and keep.appended == 2
    assert torch.equal(batch[0][6:], original[0][[2, 4]]) and torch.equal(batch[1][6:], original[1][[2, 4]])
    keep.on_train_batch_start(None, None, batch, 1)  # no keeper's copy of this batch: nothing to compare
    assert len(batch[0]) == 8


def test_negative_keys_and_a_nan_kept_as_it_was() -> None:
    keep = KeepOriginals(batch_keys=(-2, -1))
    batch = [torch.rand(5, 2), torch.arange(5)]
    batch[0][1, 0] = float("nan")  # a NaN the loops leave be is no change
    keep.keeper.on_train_batch_start(None, None, batch, 0)
    original = [part.clone() for part in batch]
    batch[0][3] += 1.0
    keep.on_train_batch_start(None, None, batch, 0)
    assert keep.appended == 1 and torch.equal(batch[0][5:], original[0][[3]]) and batch[1][5:].tolist() == [3]


def test_the_keeper_goes_before_the_first_callback_that_changes_batches_and_keep_originals_last() -> None:
    class Watch(L.Callback):  # a user's own callback that changes nothing
        pass

    watch, replay = Watch(), FailureReplay()
    keep = KeepOriginals()
    padded = DScoreCallback(guide=ScoreGuidedPadding())
    measuring = RobustnessCallback()  # without a guide: it changes no training row
    trainer = L.Trainer(callbacks=[keep, watch, measuring, padded, replay], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False)  # fmt: skip
    given = list(trainer.callbacks)
    keep.setup(trainer, None, "fit")
    at = trainer.callbacks.index(keep.keeper)
    assert trainer.callbacks[at + 1] is padded and trainer.callbacks[-1] is keep
    assert [c for c in trainer.callbacks if c is not keep.keeper] == [*given[1:], keep]
    keep.teardown(trainer, None, "fit")
    assert trainer.callbacks == given
    keep.setup(trainer, None, "validate")  # validate and test train nothing: the order stays
    assert trainer.callbacks == given
    guided = RobustnessCallback(guide=ErrorGuidedAugmentation())
    trainer = L.Trainer(callbacks=[guided, keep], logger=False, enable_checkpointing=False, enable_progress_bar=False)
    keep.setup(trainer, None, "fit")
    assert trainer.callbacks[:2] == [keep.keeper, guided]


def test_a_second_fit_places_the_keeper_once_and_checkpoints_stay_last(tmp_path: Path) -> None:
    replay, keep = FailureReplay(bank_of([150, 151]), fraction=0.25, repeats=None), KeepOriginals()
    saving = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpt", monitor="originals/rows", mode="max")
    trainer = quick_trainer(tmp_path, [keep, replay, saving], epochs=1, train_batches=2, val_batches=0)
    given = list(trainer.callbacks)
    keep.setup(trainer, None, "fit")
    assert trainer.callbacks.index(keep) == trainer.callbacks.index(saving) - 1  # before the checkpoint
    keep.teardown(trainer, None, "fit")
    for epochs in (1, 2):  # the same trainer fits on: one keeper, the order put back each time
        trainer.fit_loop.max_epochs = epochs
        model = Recording()
        trainer.fit(model, loader(rows=16))
        assert [len(batch[1]) for batch in model.batches] == [10, 10] and trainer.callbacks == given
    assert saving.best_model_score == 4.0  # it monitored originals/rows: 2 batches x 2 originals
    with pytest.raises(RuntimeError, match="more than one stateful callback of type `KeepOriginals`"):
        quick_trainer(tmp_path / "twice", [KeepOriginals(), replay, KeepOriginals()])  # Lightning's own refusal


def test_without_a_loop_that_changes_batches_it_warns_and_leaves_the_batches_be(tmp_path: Path) -> None:
    keep, model = KeepOriginals(), Recording()
    trainer = quick_trainer(tmp_path, [keep, RobustnessCallback()], epochs=1, train_batches=2, val_batches=0)
    with pytest.warns(UserWarning, match="no callback changes the training batches"):
        trainer.fit(model, loader())
    assert [len(batch[1]) for batch in model.batches] == [8, 8] and keep.appended == 0


def test_a_second_keep_originals_is_refused_when_the_trainer_is_made() -> None:
    # one set of originals per batch (the docstring says so): Lightning refuses the second, naming the class
    with pytest.raises(RuntimeError, match="more than one stateful callback of type `KeepOriginals`"):
        L.Trainer(callbacks=[KeepOriginals(), FailureReplay(), KeepOriginals()], logger=False)


def test_dict_batches_extend_their_other_fields_by_the_same_rows(tmp_path: Path) -> None:
    class Dicts(Dataset):
        def __len__(self) -> int:
            return 16

        def __getitem__(self, i: int) -> dict:
            inputs, labels = loader_rows(16)
            return {"image": inputs[i], "label": labels[i], "mask": torch.full((2, 2), i), "name": f"row{i}"}

    replay = FailureReplay(bank_of([150, 151]), fraction=0.5, repeats=None, batch_keys=("image", "label"))
    keep, model = KeepOriginals(batch_keys=("image", "label")), Recording()
    trainer = quick_trainer(tmp_path, [replay, keep], epochs=1, train_batches=2, val_batches=0)
    trainer.fit(model, DataLoader(Dicts(), batch_size=8))
    for batch in model.batches:
        assert check_anchored([batch["image"], batch["label"]], 8) == 4
        own = batch["label"][8:]  # the originals' other fields are theirs, the replaced rows' keep the loader's
        assert torch.equal(batch["mask"][8:], own.reshape(-1, 1, 1).expand(-1, 2, 2))
        assert batch["name"][8:] == [f"row{int(i)}" for i in own] and len(batch["name"]) == 12


def test_tuple_and_dict_fields_are_named_once_a_fit_and_keys_are_the_only_hint() -> None:
    keep = KeepOriginals(batch_keys=("image", "label"))
    images, labels = torch.rand(4, 1, 2, 2), torch.arange(4)
    batch = {"image": images, "label": labels, "pair": (labels, labels), "cfg": {"w": labels}}
    for step in range(2):
        keep.keeper.on_train_batch_start(None, None, batch, step)
        batch["image"][0] += 1.0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            keep.on_train_batch_start(None, None, batch, step)
        found = (re.search(r"field '(\w+)' is a \w+, which it does not", str(w.message)) for w in caught)
        named = sorted(match[1] for match in found if match)
        assert named == (["cfg", "pair"] if step == 0 else [])  # once each, then quiet
        assert len(batch["image"]) == 5 + step and len(batch["pair"][0]) == 4  # the tuple left as it was
    with pytest.raises(ValueError, match="at key 0 from a dict batch") as error:
        KeepOriginals().keeper.on_train_batch_start(None, None, batch, 0)  # forgot batch_keys
    assert "callable" not in str(error.value)  # KeepOriginals refuses one, so the hint offers none


def test_one_dimensional_signals(tmp_path: Path) -> None:
    shape = (1, 16)
    replay, keep = FailureReplay(bank_of([150, 151], shape), fraction=0.25, repeats=None), KeepOriginals()
    model = Recording(features=16)
    quick_trainer(tmp_path, [replay, keep], epochs=1, train_batches=2, val_batches=0).fit(model, loader(shape=shape))
    assert [check_anchored(batch, 8, shape) for batch in model.batches] == [2, 2]


@pytest.mark.parametrize("precision", ["64-true", "bf16-mixed"])
def test_precisions(tmp_path: Path, precision: str) -> None:
    replay, keep = FailureReplay(bank_of([150, 151]), fraction=0.25, repeats=None), KeepOriginals()
    model = Recording()
    trainer = quick_trainer(tmp_path, [replay, keep], epochs=1, train_batches=2, val_batches=0, precision=precision)
    trainer.fit(model.double() if precision == "64-true" else model, loader())
    assert [check_anchored(batch, 8) for batch in model.batches] == [2, 2]


def test_a_tuple_batch_or_a_callable_is_refused_before_any_row_changes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batch_keys: KeepOriginals appends rows"):
        KeepOriginals(batch_keys=lambda batch: (batch[0], batch[1]))
    bank = bank_of([150, 151])
    replay, keep, model = FailureReplay(bank, fraction=0.25, repeats=None), KeepOriginals(), Recording()
    tuples = DataLoader(TensorDataset(*loader_rows(16)), batch_size=8, collate_fn=lambda rows: tuple(
        torch.stack(part) for part in zip(*rows, strict=True)))  # fmt: skip
    trainer = quick_trainer(tmp_path, [keep, replay], epochs=1, train_batches=2, val_batches=0)
    given = list(trainer.callbacks)
    with pytest.raises(
        ValueError, match="batch: KeepOriginals appends rows to the training batch, so it must be a list"
    ):
        trainer.fit(model, tuples)
    assert replay.replayed == 0 and not model.batches  # refused before the replay wrote a row
    assert trainer.callbacks == given  # put back after the failure too


def test_validate_and_test_leave_the_callbacks_as_given(tmp_path: Path) -> None:
    class Evaluated(Recording):
        def validation_step(self, batch, batch_idx):
            return None

        def test_step(self, batch, batch_idx):
            return None

    keep, replay = KeepOriginals(), FailureReplay()
    trainer = quick_trainer(tmp_path, [keep, replay], epochs=1, train_batches=2, val_batches=2)
    given = list(trainer.callbacks)
    trainer.validate(Evaluated(), loader(), verbose=False)
    trainer.test(Evaluated(), loader(), verbose=False)
    assert trainer.callbacks == given and keep.keeper not in trainer.callbacks


def test_a_resumed_run_appends_and_logs_what_an_uninterrupted_run_does(tmp_path: Path) -> None:
    def trainer(path: Path, extra: list[L.Callback]) -> tuple[L.Trainer, KeepOriginals]:
        keep = KeepOriginals()
        replay = FailureReplay(bank_of(list(range(150, 158))))  # 8 failures, 4 batches of 8: 2 rows a batch
        return quick_trainer(path, [keep, replay, *extra], epochs=2, train_batches=4, val_batches=0), keep

    whole, kept = trainer(tmp_path / "whole", [])
    uninterrupted = Recording()
    whole.fit(uninterrupted, loader())
    saving = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpt", every_n_epochs=1, save_top_k=-1)
    first, _ = trainer(tmp_path / "first", [saving])
    first.fit(Recording(), loader())
    (checkpoint,) = (tmp_path / "ckpt").glob("*epoch=0-step=4.ckpt")  # after epoch 0's last batch
    resumed, keep = trainer(tmp_path / "resumed", [])
    resumed_model = Recording()
    resumed.fit(resumed_model, loader(), ckpt_path=checkpoint)
    whole_rows = {e: row["originals/rows"] for e, row in logged_by_epoch(tmp_path / "whole" / "metrics.csv").items()}
    resumed_rows = logged_by_epoch(tmp_path / "resumed" / "metrics.csv")
    assert whole_rows == {0: 8.0, 1: 8.0} and kept.appended == 16
    assert {e: row["originals/rows"] for e, row in resumed_rows.items()} == {1: 8.0} and keep.appended == 16
    for seen, then in zip(resumed_model.batches, uninterrupted.batches[-len(resumed_model.batches) :], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(seen, then, strict=True))  # the same rows, the same originals


class Counting(Recording):
    """Logs the rows it trains on, summed over the epoch and the processes."""

    def training_step(self, batch, batch_idx):
        self.log("trained/rows", float(len(batch[1])), on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True)
        return super().training_step(batch, batch_idx)


def _anchored_on(tmp_path: Path, devices: int) -> dict[str, float]:
    """16 rows, 8 a batch: two batches on one process, one on each of two; half of each replaced, then appended."""
    replay = FailureReplay(bank_of([150, 151, 152, 153]), fraction=0.5, repeats=None)
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    trainer = quick_trainer(tmp_path, [KeepOriginals(), replay], epochs=1, train_batches=1.0, val_batches=0,
                            accelerator="cpu", devices=devices, **extra)  # fmt: skip
    trainer.fit(Counting(), loader(rows=16))
    logged = logged_by_epoch(tmp_path / "metrics.csv")[0]
    return {key: value for key, value in logged.items() if key.split("/")[0] in ("originals", "trained")}


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_append_what_one_process_appends(tmp_path: Path) -> None:
    one, two = _anchored_on(tmp_path / "one", 1), _anchored_on(tmp_path / "two", 2)
    assert one == two == {"originals/rows": 8.0, "trained/rows": 24.0}  # by hand: 2 x (8 rows + 4 originals)
