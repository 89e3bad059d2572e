from __future__ import annotations

import csv
import pickle
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dlguard.callbacks.replay import FailureReplay
from dlguard.data.failure_bank import FailureBank
from tests.quick import quick_trainer

SHAPE = (1, 2, 2)
LIGHTNING = tuple(int(part) for part in L.__version__.split(".")[:2])


def batch_of(size: int, label_dtype: torch.dtype = torch.long) -> list[torch.Tensor]:
    """Row i holds i in every element and as its label."""
    labels = torch.arange(size)
    return [labels.float().reshape(-1, 1, 1, 1).expand(-1, *SHAPE).clone(), labels.to(label_dtype)]


def bank_of(labels: list[int], capacity: int = 64) -> FailureBank:
    bank = FailureBank(capacity=capacity)
    lab = torch.tensor(labels)
    bank.add(lab.float().reshape(-1, 1, 1, 1).expand(-1, *SHAPE).clone(), lab, origin="robustness")
    return bank


def replaced_rows(inputs: torch.Tensor, labels: torch.Tensor) -> list[int]:
    """Rows that now hold a bank row; checks every row is either untouched or a consistent bank row."""
    replaced = []
    for i in range(len(labels)):
        label = int(labels[i])
        assert torch.equal(inputs[i], torch.full(SHAPE, float(label))), f"row {i}: inputs and label disagree"
        if label != i:
            assert label >= 100, f"row {i}: holds {label}, neither itself nor a bank row"
            replaced.append(i)
    return replaced


@pytest.mark.parametrize(
    "size, fraction, expected",
    [(8, 0.25, 2), (10, 0.3, 3), (7, 0.5, 4), (9, 0.5, 4), (5, 0.1, 0), (6, 1.0, 6), (6, 0.0, 0)],
)
def test_replaces_round_fraction_times_batch_rows(size: int, fraction: float, expected: int) -> None:
    replay = FailureReplay(bank_of([100, 101, 102]), fraction=fraction)
    for step in range(5):
        batch = batch_of(size)
        replay.on_train_batch_start(None, None, batch, step)
        assert len(replaced_rows(*batch)) == expected
    assert replay.replayed == 5 * expected


def test_rows_and_bank_samples_are_spread_uniformly() -> None:
    replay = FailureReplay(bank_of([100, 101, 102, 103]), fraction=0.25)
    position_counts = torch.zeros(8)
    bank_counts = torch.zeros(4)
    for step in range(400):
        batch = batch_of(8)
        replay.on_train_batch_start(None, None, batch, step)
        rows = replaced_rows(*batch)
        position_counts[rows] += 1
        bank_counts += torch.bincount(batch[1][rows] - 100, minlength=4)
    # 800 replacements: 100 per position (sd ~9.4), 200 per bank row (sd ~12)
    assert float(position_counts.sum()) == 800 and float(bank_counts.sum()) == 800
    assert float(position_counts.min()) > 65 and float(position_counts.max()) < 135
    assert float(bank_counts.min()) > 150 and float(bank_counts.max()) < 250


def test_leaves_the_global_rng_untouched() -> None:
    replay = FailureReplay(bank_of([100, 101]), fraction=0.5)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    for step in range(3):
        replay.on_train_batch_start(None, None, batch_of(6), step)
    assert torch.equal(torch.get_rng_state(), before)


def test_empty_bank_does_nothing() -> None:
    replay = FailureReplay(FailureBank(), fraction=0.5)
    batch = batch_of(6)
    replay.on_train_batch_start(None, None, batch, 0)
    assert torch.equal(batch[1], torch.arange(6)) and replaced_rows(*batch) == []
    assert replay.replayed == 0


def test_dict_batches_and_label_dtype() -> None:
    inputs, labels = batch_of(8, torch.int32)
    batch = {"image": inputs, "label": labels, "id": "x"}
    replay = FailureReplay(bank_of([100, 101]), fraction=0.5, batch_keys=("image", "label"))
    replay.on_train_batch_start(None, None, batch, 0)
    assert batch["image"] is not inputs and batch["label"] is not labels  # new tensors: the loader's stay as given
    assert torch.equal(inputs, batch_of(8, torch.int32)[0]) and torch.equal(labels, batch_of(8, torch.int32)[1])
    assert batch["label"].dtype == torch.int32
    assert len(replaced_rows(batch["image"], batch["label"])) == 4


def test_callable_batch_keys() -> None:
    class Batch:
        def __init__(self) -> None:
            self.x, self.y = batch_of(8)

    batch = Batch()
    replay = FailureReplay(bank_of([100]), fraction=0.25, batch_keys=lambda b: (b.x, b.y))
    replay.on_train_batch_start(None, None, batch, 0)
    assert len(replaced_rows(batch.x, batch.y)) == 2


def test_shape_mismatch_names_bank_also_after_the_bank_changes() -> None:
    bank = bank_of([100])
    replay = FailureReplay(bank, fraction=0.5)
    replay.on_train_batch_start(None, None, batch_of(4), 0)
    bank.clear()
    bank.add(torch.zeros(2, 3, 5, 5), torch.tensor([1, 2]), origin="hda")
    with pytest.raises(ValueError, match=r"bank: holds inputs of shape \(3, 5, 5\).* \(1, 2, 2\)"):
        replay.on_train_batch_start(None, None, batch_of(4), 1)


def test_unreadable_batch_names_batch_keys() -> None:
    replay = FailureReplay(bank_of([100]), fraction=0.5, batch_keys=("image", "label"))
    with pytest.raises(ValueError, match="batch_keys"):
        replay.on_train_batch_start(None, None, batch_of(4), 0)


def test_argument_validation() -> None:
    with pytest.raises(ValueError, match="fraction"):
        FailureReplay(fraction=1.5)
    with pytest.raises(ValueError, match="bank"):
        FailureReplay(bank={"a": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_keys"):
        FailureReplay(batch_keys=(0,))  # type: ignore[arg-type]
    for repeats in (0, -1.0, True, "1", float("nan"), float("inf")):
        with pytest.raises(ValueError, match="repeats"):
            FailureReplay(repeats=repeats)  # type: ignore[arg-type]


def run_batches(replay: FailureReplay, steps: int) -> list[torch.Tensor]:
    labels = []
    for step in range(steps):
        batch = batch_of(10)
        replay.on_train_batch_start(None, None, batch, step)
        labels.append(batch[1])
    return labels


def test_state_round_trip_continues_the_same_draws() -> None:
    original = FailureReplay(bank_of(list(range(100, 120)), capacity=32), fraction=0.3, seed=4)
    run_batches(original, 3)
    state = original.state_dict()
    restored = FailureReplay(FailureBank(capacity=32), fraction=0.3, seed=999)
    restored.load_state_dict(state)
    assert restored.replayed == original.replayed == 9
    assert torch.equal(restored.bank.labels("robustness"), original.bank.labels("robustness"))
    expected = run_batches(original, 4)
    got = run_batches(restored, 4)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    # and the draws do depend on the generator: a fresh callback draws otherwise
    fresh = FailureReplay(bank_of(list(range(100, 120)), capacity=32), fraction=0.3, seed=4)
    assert not all(torch.equal(a, b) for a, b in zip(run_batches(fresh, 4), expected, strict=True))


def test_pickled_callback_continues_the_same_draws() -> None:
    original = FailureReplay(bank_of(list(range(100, 120))), fraction=0.5, seed=1)
    run_batches(original, 2)
    copy = pickle.loads(pickle.dumps(original))
    expected, got = run_batches(original, 3), run_batches(copy, 3)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_state_before_any_batch_loads() -> None:
    state = FailureReplay(bank_of([100])).state_dict()
    assert state["generator"] is None
    restored = FailureReplay()
    restored.load_state_dict(state)
    assert restored.bank.labels("robustness").tolist() == [100]
    restored.load_state_dict({})  # an old checkpoint without this callback's state
    assert len(restored.bank) == 0 and restored.replayed == 0


class Recording(L.LightningModule):
    """Records each training batch's labels and a draw of the global RNG per step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 200)
        self.labels: list[torch.Tensor] = []
        self.draws: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.labels.append(y.clone())
        self.draws.append(float(torch.rand(1)))
        return nn.functional.cross_entropy(self.layer(x.flatten(1)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        images, labels = batch_of(32)
        return DataLoader(TensorDataset(images, labels), batch_size=8, shuffle=True)


def fit(tmp_path: Path, callbacks: list[L.Callback]) -> Recording:
    model = Recording()
    trainer = quick_trainer(tmp_path, callbacks, epochs=1, train_batches=4, val_batches=0, accelerator="cpu")
    trainer.fit(model)
    return model


def test_training_steps_see_the_replayed_rows(tmp_path: Path) -> None:
    replay = FailureReplay(bank_of([150, 151, 152]), fraction=0.25, repeats=None)
    plain = fit(tmp_path / "plain", [])
    replayed = fit(tmp_path / "replay", [replay])
    assert len(replayed.labels) == 4 and replay.replayed == 8
    for seen, original in zip(replayed.labels, plain.labels, strict=True):
        from_bank = seen >= 150
        assert int(from_bank.sum()) == 2
        assert torch.equal(seen[~from_bank], original[~from_bank])  # same shuffled batches otherwise
    assert replayed.draws == plain.draws  # the global RNG goes on as without replay


class EpochOf:
    """What the dose reads of a trainer: the number of training batches in an epoch."""

    def __init__(self, batches: float) -> None:
        self.num_training_batches = batches


@pytest.mark.parametrize(
    "stored, batches, repeats, fraction, per_batch",
    [
        # 12 failures, 4 batches: 3 rows each; twice: 6; a quarter of 8 rows caps at 2
        (12, 4, 1.0, 1.0, [3, 3, 3, 3]),
        (12, 4, 2.0, 1.0, [6, 6, 6, 6]),
        (12, 4, 1.0, 0.25, [2, 2, 2, 2]),
        # 3 failures over 4 batches: 0.75 a batch, the fractions carried -> 0, 1, 1, 1
        (3, 4, 1.0, 1.0, [0, 1, 1, 1]),
        # 2 failures over 5 batches, half a replay each: 0.2 a batch -> one row in the fifth
        (2, 5, 0.5, 1.0, [0, 0, 0, 0, 1]),
        # 1 failure over 10 batches: ten carried tenths make the tenth batch's row
        (1, 10, 1.0, 1.0, [0] * 9 + [1]),
    ],
)
def test_each_failure_is_replayed_repeats_times_an_epoch(
    stored: int, batches: int, repeats: float, fraction: float, per_batch: list[int]
) -> None:
    replay = FailureReplay(bank_of(list(range(100, 100 + stored))), fraction=fraction, repeats=repeats)
    seen = []
    for step in range(batches):
        batch = batch_of(8)
        replay.on_train_batch_start(EpochOf(batches), None, batch, step)
        seen.append(len(replaced_rows(*batch)))
    assert seen == per_batch and replay.replayed == sum(per_batch)


def test_the_dose_follows_the_bank_and_an_epoch_of_unknown_length_replays_the_fraction() -> None:
    bank = bank_of([100, 101])
    replay = FailureReplay(bank, fraction=0.5)
    counts = []
    for step in range(8):
        if step == 4:  # a measurement deposits six more: 8 failures over 4 batches, 2 a batch
            bank.add(torch.full((6, *SHAPE), 106.0), torch.full((6,), 106), origin="hda")
        batch = batch_of(8)
        replay.on_train_batch_start(EpochOf(4), None, batch, step)
        counts.append(len(replaced_rows(*batch)))
    assert counts == [0, 1, 0, 1, 2, 2, 2, 2]
    batch = batch_of(8)
    replay.on_train_batch_start(EpochOf(float("inf")), None, batch, 0)  # an iterable dataset: no epoch length
    assert len(replaced_rows(*batch)) == 4


def test_the_dose_s_carry_is_checkpointed() -> None:
    original = FailureReplay(bank_of([100, 101, 102]), fraction=1.0, seed=3)
    for step in range(2):  # 0.75 a batch over 4 batches: 0, then 1 with 0.5 carried
        original.on_train_batch_start(EpochOf(4), None, batch_of(8), step)
    restored = FailureReplay(FailureBank(), fraction=1.0, seed=3)
    restored.load_state_dict(original.state_dict())
    counts = []
    for replay in (original, restored):
        batch = batch_of(8)
        replay.on_train_batch_start(EpochOf(4), None, batch, 2)
        counts.append(len(replaced_rows(*batch)))
    assert counts == [1, 1] and restored.replayed == original.replayed == 2


def logged_doses(path: Path) -> list[tuple[int, float, float]]:
    """``(epoch, replay/rows, replay/failures)`` of each epoch the CSV logger in ``path`` wrote."""
    with (path / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("replay/rows")]
    return [(int(row["epoch"]), float(row["replay/rows"]), float(row["replay/failures"])) for row in rows]


def test_training_replays_each_failure_once_an_epoch_by_default(tmp_path: Path) -> None:
    replay = FailureReplay(bank_of([150, 151, 152, 153, 154, 155, 156, 157]))  # 8 failures, 4 batches of 8
    replayed = fit(tmp_path / "replay", [replay])
    assert [int((seen >= 150).sum()) for seen in replayed.labels] == [2, 2, 2, 2]
    assert replay.replayed == 8


def test_each_epoch_logs_the_rows_replayed_and_the_failures_held_summed_over_replays(tmp_path: Path) -> None:
    first = FailureReplay(bank_of(list(range(150, 158))))  # 8 failures, 4 batches of 8: 2 rows a batch
    second = FailureReplay(bank_of([190, 191, 192, 193]), fraction=0.5, seed=1)  # 4 failures: 1 row a batch

    class Deposit(L.Callback):  # as a measurement at the epoch's end: the next epoch replays from 16 of them
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            first.bank.add(torch.full((4, *SHAPE), 170.0), torch.full((4,), 170), origin="hda")

    trainer = quick_trainer(tmp_path, [Deposit(), first, second], epochs=2, train_batches=4, val_batches=0)
    trainer.fit(Recording())
    # by hand: epoch 0, 4 batches x (2 + 1) rows from 8 + 4 failures; epoch 1, 12 failures in the first bank,
    # 3 rows a batch (capped at a quarter of 8: 2) plus 1 -> 12 rows from 16 failures; the counters agree
    assert logged_doses(tmp_path) == [
        (0, 12.0, 12.0),
        (1, 12.0, 16.0),
    ]
    assert first.replayed + second.replayed == 24


def test_a_bank_two_replays_share_is_counted_once(tmp_path: Path) -> None:
    shared = bank_of(list(range(150, 158)))  # 8 failures, 4 batches of 8: 2 rows a batch from each replay
    replays = [FailureReplay(shared), FailureReplay(shared, seed=1)]
    quick_trainer(tmp_path, replays, epochs=1, train_batches=4, val_batches=0).fit(Recording())
    assert logged_doses(tmp_path) == [(0, 16.0, 8.0)]  # rows from both, bank once


@pytest.mark.parametrize("step", [6, 4], ids=["inside an epoch", "after an epoch's last batch"])
def test_a_resumed_run_logs_each_epoch_s_dose_as_an_uninterrupted_run(tmp_path: Path, step: int) -> None:
    class Batches(L.Callback):  # the training batches the resumed run itself runs, per epoch
        def __init__(self) -> None:
            self.per_epoch: dict[int, int] = {}

        def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
            self.per_epoch[trainer.current_epoch] = self.per_epoch.get(trainer.current_epoch, 0) + 1

    def trainer(path: Path, extra: list[L.Callback]) -> tuple[L.Trainer, FailureReplay]:
        replay = FailureReplay(bank_of(list(range(150, 158))))  # 8 failures, 4 batches of 8: 2 rows a batch
        return quick_trainer(path, [replay, *extra], epochs=2, train_batches=4, val_batches=0), replay

    whole, _ = trainer(tmp_path / "whole", [])
    whole.fit(Recording())
    saving = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=step, save_top_k=-1)
    first, _ = trainer(tmp_path / "first", [saving])
    first.fit(Recording())
    (checkpoint,) = (tmp_path / "ckpt").glob(f"*epoch=?-step={step}.ckpt")
    batches = Batches()
    resumed, replay = trainer(tmp_path / "resumed", [batches])
    resumed.fit(Recording(), ckpt_path=checkpoint)
    assert logged_doses(tmp_path / "whole") == [(0, 8.0, 8.0), (1, 8.0, 8.0)]  # by hand: 4 batches x 2 rows from 8
    # before the checkpoint: step 6 is two batches into epoch 1, step 4 all of epoch 0's; each epoch's
    # figure counts 2 rows for every batch it trained, before and after the resumption
    before = {0: 0, 1: 2} if step == 6 else {0: 4, 1: 0}
    expected = [(epoch, 2.0 * (before[epoch] + count), 8.0) for epoch, count in sorted(batches.per_epoch.items())]
    assert logged_doses(tmp_path / "resumed") == expected
    if LIGHTNING >= (2, 5):  # it resumes where it stopped; older versions rerun the batch in flight
        assert expected == [(1, 8.0, 8.0)] and replay.replayed == 16


@pytest.mark.parametrize("first_ends", ["finished", "interrupted"])
def test_a_second_fit_with_the_same_replay_logs_its_own_epoch(tmp_path: Path, first_ends: str) -> None:
    class Interrupt(L.Callback):  # the first fit stops with an exception after two batches
        def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch, index: int) -> None:
            if index == 2:
                raise RuntimeError("stopped")

    replay = FailureReplay(bank_of(list(range(150, 158))))  # 8 failures, 4 batches of 8: 2 rows a batch
    if first_ends == "interrupted":
        with pytest.raises(RuntimeError, match="stopped"):
            quick_trainer(tmp_path / "first", [replay, Interrupt()], epochs=1, train_batches=4, val_batches=0).fit(
                Recording()
            )
    else:
        quick_trainer(tmp_path / "first", [replay], epochs=1, train_batches=4, val_batches=0).fit(Recording())
    quick_trainer(tmp_path / "second", [replay], epochs=1, train_batches=4, val_batches=0).fit(Recording())
    assert logged_doses(tmp_path / "second") == [(0, 8.0, 8.0)]  # a fresh Trainer's epoch 0
    # interrupted: the replay, first in the list, wrote 2 rows into each of batches 0-2 before the stop
    assert replay.replayed == (14 if first_ends == "interrupted" else 16)


@pytest.mark.skipif(LIGHTNING < (2, 5), reason="Lightning < 2.5 trains the batch in flight at the checkpoint again")
def test_a_run_resumed_inside_an_epoch_counts_the_failures_held_at_its_start(tmp_path: Path) -> None:
    class Deposit(L.Callback):  # 4 failures after every epoch's second batch, as a validation inside the epoch
        def __init__(self, bank: FailureBank) -> None:
            self.bank = bank

        def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, *args: object) -> None:
            if args[-1] == 1:
                self.bank.add(torch.full((4, *SHAPE), 170.0), torch.full((4,), 170), origin="hda")

    def run(path: Path, extra: list[L.Callback], ckpt_path: Path | None = None) -> list[tuple[int, float, float]]:
        replay = FailureReplay(bank_of(list(range(150, 158))))
        callbacks = [Deposit(replay.bank), replay, *extra]
        quick_trainer(path, callbacks, epochs=2, train_batches=4, val_batches=0).fit(Recording(), ckpt_path=ckpt_path)
        return logged_doses(path)

    whole = run(tmp_path / "whole", [])
    run(tmp_path / "first", [L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=6)])
    (checkpoint,) = (tmp_path / "ckpt").glob("*step=6.ckpt")  # two batches into epoch 1, after its deposit
    # by hand: 2 rows a batch throughout (the bank's 8 to 16 failures over 4 batches, capped at a quarter
    # of 8); epoch 0 starts from 8 failures, epoch 1 from 12; the checkpoint's bank holds 16
    assert whole == [(0, 8.0, 8.0), (1, 8.0, 12.0)]
    assert run(tmp_path / "resumed", [], ckpt_path=checkpoint) == whole[1:]
