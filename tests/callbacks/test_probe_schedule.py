"""Probe sets that follow training: drawn when the model can be measured, renewed on a schedule.

A from-scratch network that has collapsed onto one class at its first validation must not be
measured (its robustness reads 1.0 on a one-class probe set); the callbacks wait, say why with the
counts, log nothing, and draw once the model has learnt. ``redraw_every_n_epochs`` renews the set.
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor

from dlguard._random import content_keys
from dlguard.augment import ErrorGuidedAugmentation
from dlguard.callbacks import DScoreCallback, RobustnessCallback
from dlguard.data import MNISTDataModule
from dlguard.zoo import ClassifierModule, pretrained
from tests.callbacks.recompute import dscore_logged, robustness_logged
from tests.quick import quick_trainer


class LearnsAtEpoch(ClassifierModule):
    """``mnist_a`` that predicts class ``collapsed_class`` for every input before training epoch ``learns_at``.

    Or, with ``never=c`` (a class or several), a model that is good except that it never predicts
    class ``c`` -- before training epoch ``never_before``, when given.
    """

    def __init__(
        self,
        learns_at: int = 1,
        collapsed_class: int = 0,
        never: int | tuple[int, ...] | None = None,
        never_before: int | None = None,
    ) -> None:
        super().__init__(pretrained("mnist_a"), lr=1e-6)
        self.learns_at, self.collapsed_class = learns_at, collapsed_class
        self.never = (never,) if isinstance(never, int) else never
        self.never_before = never_before

    def forward(self, x: Tensor) -> Tensor:
        logits = self.net(x)
        if self.never is not None:
            learnt = self.never_before is not None and self._trainer is not None
            if learnt and self.trainer.current_epoch >= self.never_before:
                return logits
            return logits.index_fill(1, torch.tensor(self.never, device=logits.device), -1e4)
        if self._trainer is None or self.trainer.current_epoch >= self.learns_at:
            return logits
        collapsed = torch.full_like(logits, -10.0)
        collapsed[:, self.collapsed_class] = 10.0
        return collapsed + 0 * logits


def logged_epochs(path: Path, prefix: str) -> list[int]:
    with path.open() as handle:
        return sorted({int(row["epoch"]) for row in csv.DictReader(handle) if any(
            value and key.startswith(prefix) for key, value in row.items()
        )})  # fmt: skip


def fit(tmp_path: Path, callbacks: list[L.Callback], module: L.LightningModule, epochs: int = 2) -> L.Trainer:
    trainer = quick_trainer(tmp_path, callbacks, epochs=epochs, train_batches=2, val_batches=4)
    trainer.fit(module, datamodule=MNISTDataModule(batch_size=50))
    return trainer


def test_a_collapsed_model_is_not_measured_until_it_has_learnt(tmp_path: Path) -> None:
    robustness = RobustnessCallback(budget=None, per_class=4, pairs=20)
    dscore = DScoreCallback(n=2, budget=None, probe_size=40)
    module = LearnsAtEpoch(learns_at=1)
    with pytest.warns(UserWarning, match=r"RobustnessCallback: no probe set at epoch 0: the validation accuracy 0\.1"):
        trainer = fit(tmp_path, [robustness, dscore], module)
    for callback in (robustness, dscore):
        assert [(s["epoch"], s["kept"]) for s in callback.skipped] == [(0, False)]  # nothing measured at 0
        assert (
            "below min_accuracy='auto' (a third of the way from chance 1/10 to 1): 0.400"
            in callback.skipped[0]["reason"]
        )
        assert [record["epoch"] for record in callback.history] == [1]
    # nothing was logged at epoch 0; at epoch 1 the numbers are the generators' on the set drawn then
    assert logged_epochs(tmp_path / "metrics.csv", "robustness/") == [1]
    assert logged_epochs(tmp_path / "metrics.csv", "dscore/") == [1]
    probe = robustness.probe_set()
    assert probe.class_counts == {c: 4 for c in range(10)}  # every class, not the collapsed one only
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert {k: v for k, v in logged.items() if k.startswith("robustness/")} == pytest.approx(
        robustness_logged(robustness, module), abs=1e-6
    )
    assert {k: v for k, v in logged.items() if k.startswith("dscore/")} == pytest.approx(
        dscore_logged(dscore, module), abs=1e-5
    )


def test_a_refused_draw_does_not_announce_what_it_would_have_measured_on(tmp_path: Path) -> None:
    dscore = DScoreCallback(n=2, budget=None, probe_size=500)  # more than the 200 inputs the loader gives
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fit(tmp_path, [dscore], LearnsAtEpoch(learns_at=1))
    messages = [str(w.message) for w in said]
    shortfall = [m for m in messages if m.startswith("probe set: probe_size=500 requested")]
    # epoch 0's draw is refused (a collapsed model): only epoch 1's, measured on, says it measures on 200
    assert any("no probe set at epoch 0" in m for m in messages)
    assert shortfall == ["probe set: probe_size=500 requested but validation loader 0 gave 200 distinct inputs; "
                         "measuring on 200"]  # fmt: skip


def test_without_an_accuracy_threshold_a_one_class_balanced_set_is_still_refused(tmp_path: Path) -> None:
    robustness = RobustnessCallback(budget=None, per_class=4, pairs=20, min_accuracy=None)
    with pytest.warns(UserWarning, match=r"classes \{1: '0 of 2', 2: '0 of 2'"):
        fit(tmp_path, [robustness], LearnsAtEpoch(learns_at=5, collapsed_class=0), epochs=1)
    assert (
        robustness.history == []
        and "too few correctly predicted inputs for per-class numbers" in robustness.skipped[0]["reason"]
    )


def test_a_class_the_model_never_predicts_is_named_and_the_others_measured(tmp_path: Path) -> None:
    robustness = RobustnessCallback(budget=None, per_class=4, pairs=20)
    module = LearnsAtEpoch(never=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = fit(tmp_path, [robustness], module, epochs=2)
    said = [str(w.message) for w in caught if "without every class" in str(w.message)]
    # 3s among 200 inputs: half of min(4, n) = 2 needed; said once: epoch 1's refill filled nothing more
    assert len(said) == 1 and "measuring at epoch 0 without every class: classes {3: '0 of 2'}" in said[0]
    assert robustness.skipped == [] and [r["epoch"] for r in robustness.history] == [0, 1]  # feedback from epoch 0
    for record in robustness.history:
        assert record["short_classes"] == {3: "0 of 2"} and record["absent_classes"] == [3]
        assert record["class_counts"] == {c: 4 for c in range(10) if c != 3}
        for name, rates in record["class_failure_rates"].items():  # LR_p: the mean over the classes measured
            present = [rate for c, rate in enumerate(rates) if c != 3]
            assert rates[3] is None and record["logged"][f"robustness/{name}"] == pytest.approx(
                1 - sum(present) / len(present), abs=1e-6
            )
    # drawn again at epoch 1 (same seed) to take class 3 in; it filled nothing more, so the set stayed
    assert robustness.state_dict()["probe"]["epoch"] == 0 and robustness.probe_set().seed == 0
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("robustness/")}
    assert logged == pytest.approx(robustness_logged(robustness, module), abs=1e-6)


def test_a_class_absent_from_the_probe_set_is_proposed_at_the_rate_of_all_classes(tmp_path: Path) -> None:
    guide = ErrorGuidedAugmentation()
    robustness = RobustnessCallback(budget=None, per_class=4, guide=guide)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(tmp_path, [robustness], LearnsAtEpoch(never=3), epochs=1)
    record = robustness.history[0]
    assert record["absent_classes"] == [3] and set(record["class_counts"].values()) == {4}
    names = [p.name for p in robustness.properties]
    rates = [[record["class_failure_rates"][name][c] for name in names] for c in range(10)]
    pooled = [sum(row[j] for c, row in enumerate(rates) if c != 3) / 9 for j in range(len(names))]  # equal counts
    rates[3] = pooled  # not 0: the guide is not kept off a class the model does not get yet
    top = max(max(row) for row in rates)
    assert top > 0 and max(pooled) > 0
    expected = [[rate / top for rate in row] for row in rates]
    for row, want in zip(robustness.proposal, expected, strict=True):
        assert row == pytest.approx(want, abs=1e-9)
    assert torch.allclose(guide.proposal.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6)


def test_a_set_short_of_a_class_is_drawn_again_until_every_class_is_filled(tmp_path: Path) -> None:
    robustness = RobustnessCallback(budget=None, per_class=4, pairs=20, redraw_every_n_epochs=3)
    with pytest.warns(UserWarning, match=r"the set is drawn again at the next measured validation"):
        fit(tmp_path, [robustness], LearnsAtEpoch(never=3, never_before=1), epochs=4)
    assert [r.get("short_classes") for r in robustness.history] == [{3: "0 of 2"}, None, None, None]
    sizes = [sum(r["class_counts"].values()) for r in robustness.history]
    assert sizes == [36, 40, 40, 40]  # filled at 1 (seed 0), kept at 2
    # the refill kept the redraw clock: the scheduled redraw came at 3, three epochs after the first draw
    assert robustness.probe_set().seed == 3 and robustness.state_dict()["probe"]["epoch"] == 3


@pytest.mark.parametrize(("never", "measured"), [((0, 1, 2, 3), True), ((0, 1, 2, 3, 4), False)])
def test_a_balanced_set_is_measured_once_more_than_half_the_classes_are_filled(
    tmp_path: Path, never: tuple[int, ...], measured: bool
) -> None:
    robustness = RobustnessCallback(budget=None, per_class=4, pairs=20, min_accuracy=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path, [robustness], LearnsAtEpoch(never=never), epochs=1)
    assert bool(robustness.history) is measured
    if measured:  # six classes filled: measured on them, the four short ones named with their counts
        assert robustness.history[0]["short_classes"] == {c: "0 of 2" for c in never}
        assert sum("without every class" in str(w.message) for w in caught) == 1
    else:
        reason = robustness.skipped[0]["reason"]
        assert "5 of 10 classes are filled, more than half (two at least) are needed" in reason
        assert not any("without every class" in str(w.message) for w in caught)


def test_validate_names_the_short_classes_of_a_model_below_min_accuracy(tmp_path: Path) -> None:
    robustness = RobustnessCallback(budget=None, per_class=4, pairs=20, min_accuracy=0.99)
    trainer = quick_trainer(tmp_path, [robustness], val_batches=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.validate(LearnsAtEpoch(never=3), datamodule=MNISTDataModule(batch_size=50), verbose=False)
    said = [str(w.message) for w in caught]
    assert any("cannot be measured well: the validation accuracy" in m for m in said)
    assert any("without every class: classes {3: '0 of 2'}" in m for m in said)
    assert robustness.history[0]["short_classes"] == {3: "0 of 2"}


def test_a_resumed_run_fills_a_short_set_as_an_uninterrupted_run_does(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(root: Path, ckpt: Path | None = None) -> RobustnessCallback:
        robustness = RobustnessCallback(per_class=3, pairs=20, budget=None)
        saver = ModelCheckpoint(dirpath=root / "checkpoints", save_top_k=-1, every_n_epochs=1)
        trainer = quick_trainer(root, [robustness, saver], epochs=3, train_batches=2, val_batches=4)
        trainer.fit(LearnsAtEpoch(never=3, never_before=2), datamodule=MNISTDataModule(batch_size=50), ckpt_path=ckpt)
        return robustness

    whole = run(tmp_path / "whole")
    assert [bool(r.get("short_classes")) for r in whole.history] == [True, True, False]
    resumed = run(tmp_path / "resumed", next((tmp_path / "whole" / "checkpoints").glob("epoch=0*.ckpt")))
    assert [r["logged"] for r in resumed.history[-2:]] == [r["logged"] for r in whole.history[-2:]]
    short = [[r.get("short_classes") for r in c.history[-2:]] for c in (resumed, whole)]
    assert short[0] == short[1]
    assert torch.equal(resumed.probe_set().all_keys, whole.probe_set().all_keys)


def test_a_fit_that_never_becomes_measurable_says_why_at_the_end(tmp_path: Path) -> None:
    dscore = DScoreCallback(n=2, budget=None, probe_size=20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path, [dscore], LearnsAtEpoch(learns_at=5), epochs=2)
    said = [str(w.message) for w in caught if "measured nothing in this fit" in str(w.message)]
    assert len(said) == 1 and "could not be measured yet" in said[0] and "lower min_accuracy" in said[0]


def test_start_epoch_delays_the_first_measurement_and_costs_nothing_before(tmp_path: Path) -> None:
    def rows_in_epoch_0(callbacks: list[L.Callback]) -> list[int]:
        module = LearnsAtEpoch(learns_at=0)
        rows: list[int] = []
        module.net.register_forward_hook(
            lambda net, args, out: rows.append(len(args[0])) if module.trainer.current_epoch == 0 else None
        )
        fit(tmp_path, callbacks, module)
        return rows

    dscore = DScoreCallback(n=2, budget=None, probe_size=20, start_epoch=1)
    with_callback, without = rows_in_epoch_0([dscore]), rows_in_epoch_0([])
    assert [record["epoch"] for record in dscore.history] == [1] and dscore.skipped == []
    extra = list(with_callback)
    for rows in without:
        extra.remove(rows)
    assert extra and max(extra) <= 2  # epoch 0 paid only the first-batch check, on two inputs


def test_a_start_epoch_after_the_last_epoch_is_named_at_set_up(tmp_path: Path) -> None:
    trainer = quick_trainer(tmp_path, [DScoreCallback(n=2, start_epoch=3)], epochs=2)
    with pytest.warns(UserWarning, match=r"start_epoch=3 never meets a validation epoch"):
        trainer.fit(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start_epoch": -1}, "start_epoch"),
        ({"min_accuracy": 1.5}, "min_accuracy"),
        ({"min_accuracy": "high"}, "min_accuracy"),
        ({"redraw_every_n_epochs": 0}, "redraw_every_n_epochs"),
    ],
)
def test_bad_start_and_redraw_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DScoreCallback(**kwargs)


def test_redraw_renews_the_set_with_the_epoch_in_its_seed(tmp_path: Path) -> None:
    dscore = DScoreCallback(n=2, budget=None, probe_size=30, redraw_every_n_epochs=2)
    module = LearnsAtEpoch(learns_at=0)
    fit(tmp_path, [dscore], module, epochs=3)
    history = dscore.history
    assert [record["epoch"] for record in history] == [0, 1, 2]
    probe = dscore.probe_set()
    assert probe.seed == 0 + 2  # drawn again at epoch 2, two epochs after the first draw
    data = MNISTDataModule(batch_size=50)
    data.setup()
    images = torch.stack([data.val_set[i][0] for i in range(200)])
    first, renewed = content_keys(images, 0).sort().values[:30], content_keys(images, 2).sort().values[:30]
    assert torch.equal(probe.all_keys, renewed) and not torch.equal(first, renewed)
    assert dscore.state_dict()["probe"]["epoch"] == 2


def test_a_resumed_run_redraws_when_an_uninterrupted_run_does(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    def callbacks(root: Path) -> list[L.Callback]:
        return [
            # a budget: the cut sizes and their limits go into the checkpoint too
            DScoreCallback(n=2, probe_size=30, redraw_every_n_epochs=2, budget=2.5),
            RobustnessCallback(per_class=3, pairs=20, redraw_every_n_epochs=2, budget=2.5),
            ModelCheckpoint(dirpath=root / "checkpoints", save_top_k=-1, every_n_epochs=1),
        ]

    def metrics(path: Path) -> dict[int, dict[str, str]]:
        with path.open() as handle:
            rows = [row for row in csv.DictReader(handle) if row.get("dscore/d_score")]
        return {int(row["epoch"]): {k: v for k, v in row.items() if "/" in k and v} for row in rows}

    whole_callbacks = callbacks(tmp_path / "whole")
    whole = quick_trainer(tmp_path / "whole", whole_callbacks, epochs=4, train_batches=2, val_batches=4)
    whole.fit(LearnsAtEpoch(learns_at=1), datamodule=MNISTDataModule(batch_size=50))
    assert [r["epoch"] for r in whole_callbacks[0].history] == [1, 2, 3]  # drawn at 1, redrawn at 3
    checkpoint = next((tmp_path / "whole" / "checkpoints").glob("epoch=1*.ckpt"))
    resumed_callbacks = callbacks(tmp_path / "resumed")
    resumed = quick_trainer(tmp_path / "resumed", resumed_callbacks, epochs=4, train_batches=2, val_batches=4)
    resumed.fit(LearnsAtEpoch(learns_at=1), datamodule=MNISTDataModule(batch_size=50), ckpt_path=checkpoint)
    expected, got = metrics(tmp_path / "whole" / "metrics.csv"), metrics(tmp_path / "resumed" / "metrics.csv")
    assert sorted(got) == [2, 3]
    for epoch in (2, 3):
        assert got[epoch] == expected[epoch], epoch
    for before, after in zip(whole_callbacks[:2], resumed_callbacks[:2], strict=True):
        assert torch.equal(before.probe_set().all_keys, after.probe_set().all_keys)
        assert before.probe_set().seed == after.probe_set().seed == 3
        # epoch 2 measures the checkpoint's set: its limit comes back from the checkpoint
        budgets = [[r["budget"] for r in c.history if r["epoch"] == 2] for c in (before, after)]
        assert budgets[0] == budgets[1] and budgets[0][0]["allowed"] == 500  # 2.5 x 200


class CollapsesAt(LearnsAtEpoch):
    """``mnist_a``, collapsed onto class 0 at the training epochs in ``collapsed`` only."""

    def __init__(self, collapsed: set[int]) -> None:
        super().__init__(learns_at=0)
        self.collapsed = collapsed

    def forward(self, x: Tensor) -> Tensor:
        logits = self.net(x)
        if self._trainer is None or self.trainer.current_epoch not in self.collapsed:
            return logits
        out = torch.full_like(logits, -10.0)
        out[:, 0] = 10.0
        return out + 0 * logits


def test_a_refused_redraw_keeps_the_set_in_use_and_a_resumed_run_does_the_same(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(root: Path, ckpt: Path | None = None) -> DScoreCallback:
        dscore = DScoreCallback(n=2, probe_size=30, redraw_every_n_epochs=2, budget=1.0)  # fits: every epoch measures
        saver = ModelCheckpoint(dirpath=root / "checkpoints", save_top_k=-1, every_n_epochs=1)
        trainer = quick_trainer(root, [dscore, saver], epochs=4, train_batches=2, val_batches=4)
        trainer.fit(CollapsesAt({2}), datamodule=MNISTDataModule(batch_size=50), ckpt_path=ckpt)
        return dscore

    whole = run(tmp_path / "whole")
    # drawn at 0; the redraw due at 2 meets a collapsed model and is refused, so epoch 2 is measured on the
    # epoch-0 set; at 3 the redraw is tried again and kept (seed 0 + 3)
    assert [(s["epoch"], s["kept"]) for s in whole.skipped] == [(2, True)]  # measured on the set in use
    assert [r["epoch"] for r in whole.history] == [0, 1, 2, 3]
    assert whole.history[2]["baseline_acc"] < 0.2 and whole.probe_set().seed == 3
    resumed = run(tmp_path / "resumed", next((tmp_path / "whole" / "checkpoints").glob("epoch=1*.ckpt")))
    assert resumed.skipped == whole.skipped
    assert [r["logged"] for r in resumed.history[-2:]] == [r["logged"] for r in whole.history[-2:]]
    assert torch.equal(resumed.probe_set().all_keys, whole.probe_set().all_keys)


def test_a_checkpoint_from_before_kept_was_recorded_loads_with_kept_unknown() -> None:
    dscore = DScoreCallback(n=2)
    old = {"epoch": 2, "stage": "validation", "reason": "the validation accuracy 0.1 is below min_accuracy"}
    dscore.load_state_dict({**dscore.state_dict(), "skipped": [old]})
    assert dscore.skipped == [{**old, "kept": None}] and "kept" not in old  # the checkpoint's entry is not changed


class NothingRight(ClassifierModule):
    """Eleven logits, the eleventh (no digit's) always the largest: no input is classified correctly."""

    def __init__(self) -> None:
        super().__init__(pretrained("mnist_a"), num_classes=11, lr=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        logits = self.net(x)
        return torch.cat([logits, logits.amax(1, keepdim=True) + 1], dim=1)


def test_a_model_that_gets_nothing_right_is_waited_for_not_crashed_on(tmp_path: Path) -> None:
    robustness = RobustnessCallback(budget=None, per_class=3, min_accuracy=None)
    with pytest.warns(UserWarning, match=r"no probe set at epoch 0: none of the 200 inputs qualified"):
        fit(tmp_path, [robustness], NothingRight(), epochs=1)
    assert robustness.history == []


def test_validate_measures_a_model_that_cannot_be_measured_well_and_says_so(tmp_path: Path) -> None:
    dscore = DScoreCallback(n=2, budget=None, probe_size=20)
    trainer = quick_trainer(tmp_path, [dscore], val_batches=4)
    with pytest.warns(UserWarning, match=r"the validation numbers come from a model that cannot be measured well"):
        trainer.validate(LearnsAtEpoch(learns_at=5), datamodule=MNISTDataModule(batch_size=50), verbose=False)
    assert len(dscore.history) == 1 and dscore.history[0]["baseline_acc"] < 0.2


def test_a_number_without_a_value_is_left_out_with_a_warning(tmp_path: Path) -> None:
    from dlguard.callbacks import ProbeCallback

    class Undefined(ProbeCallback):
        prefix = "undefined"

        def _measure(self, trainer, pl_module, probe, stage):
            return {}, {"undefined/nan": float("nan"), "undefined/one": 1.0}

    callback = Undefined()
    trainer = quick_trainer(tmp_path, [callback], val_batches=1)
    with pytest.warns(UserWarning, match=r"\['undefined/nan'\] have no value at epoch 0 .* not logged"):
        trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50))
    assert callback.history[0]["logged"] == {"undefined/one": 1.0}
    assert "undefined/nan" not in trainer.callback_metrics
