"""The cost budget: one argument, the probe set and the GA sized to it, and what a measurement spent, counted."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from dlguard.callbacks import (
    DScoreCallback,
    HDACallback,
    MetamorphicCallback,
    NeuronCoverageCallback,
    ObjectRelevancyCallback,
    RobustnessCallback,
)
from dlguard.callbacks.base import DEFAULT_BUDGET
from dlguard.data import MNISTDataModule
from dlguard.zoo import ClassifierModule, pretrained
from tests.quick import quick_trainer

CALLBACKS = [
    RobustnessCallback,
    DScoreCallback,
    MetamorphicCallback,
    HDACallback,
    ObjectRelevancyCallback,
    NeuronCoverageCallback,
]


class CountingModule(ClassifierModule):
    """``mnist_a`` counting, in its own ``forward``, every input it is run on (a reference the hooks do not share)."""

    def __init__(self, through_net: bool = False) -> None:
        super().__init__(pretrained("mnist_a"))
        self.inputs_run = 0
        self.through_net = through_net

    def forward(self, x: Tensor) -> Tensor:
        self.inputs_run += len(x)
        return super().forward(x)

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        if not self.through_net:
            return super().validation_step(batch, batch_idx)
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))  # the network, not self
        return None


def _validate(tmp_path: Path, callback: Any, module: CountingModule, batches: int = 3) -> dict[str, Any]:
    trainer = quick_trainer(tmp_path, [callback], val_batches=batches)
    trainer.validate(module, datamodule=MNISTDataModule(batch_size=100), verbose=False)
    return callback.latest


@pytest.mark.parametrize("callback", CALLBACKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("budget", [0, -5, 0.0, -0.5, float("nan"), float("inf"), True, "100", [100]])
def test_a_budget_that_is_not_positive_is_refused_before_any_work(callback: type, budget: object) -> None:
    with pytest.raises(ValueError, match=r"^budget: expected a positive int .* or None, got"):
        callback(budget=budget)


def test_the_default_budget_is_documented_once_in_the_base() -> None:
    assert RobustnessCallback().budget == DEFAULT_BUDGET == 0.15
    assert RobustnessCallback(budget=300).budget == 300 and RobustnessCallback(budget=None).budget is None


@pytest.mark.parametrize(
    ("make", "passes_per_input", "fixed"),
    [
        (lambda b: RobustnessCallback(budget=b), 15, 2),  # 3 properties x 5 levels; width and pass size
        (lambda b: DScoreCallback(budget=b), 1 + 2 * 9, 2),  # the model, n² mutants, n² translations (n = 3)
        (lambda b: MetamorphicCallback(budget=b), 37, 1),  # sources + 36 property levels; one input sizes the passes
    ],
    ids=["robustness", "dscore", "metamorphic"],
)
def test_an_int_budget_sizes_the_probe_set_and_bounds_the_passes_counted_on_the_model(
    tmp_path: Path, make: Any, passes_per_input: int, fixed: int
) -> None:
    budget = 1500
    module = CountingModule()
    record = _validate(tmp_path, make(budget), module)
    spent = record["budget"]
    loop = 300 + 3  # the validation loop's own inputs; the first-batch check runs two and one for the width
    assert spent["forward_passes"] == module.inputs_run - loop  # the draw reused the loop's own outputs
    assert spent["forward_passes"] <= budget == spent["allowed"]
    most = (budget - fixed) // passes_per_input
    if isinstance(make(None), RobustnessCallback):
        most = most // 10 * 10  # a balanced set: the same count in each of the 10 classes
    assert spent["probe_inputs"] == most
    assert spent["forward_passes"] == most * passes_per_input + fixed


def test_a_float_budget_is_that_multiple_of_the_probe_loaders_distinct_inputs(tmp_path: Path) -> None:
    record = _validate(tmp_path, DScoreCallback(budget=2.5), CountingModule(), batches=2)
    assert record["budget"]["allowed"] == math.ceil(2.5 * 200)
    assert record["budget"]["probe_inputs"] == (500 - 2) // 19


def test_no_budget_measures_at_the_callbacks_own_sizes(tmp_path: Path) -> None:
    record = _validate(tmp_path, DScoreCallback(budget=None, probe_size=40), CountingModule())
    spent = {"budget": None, "allowed": None, "probe_inputs": 40, "forward_passes": 40 * 19 + 2, "draw_passes": 0}
    assert record["budget"] == spent


def test_a_budget_below_what_a_number_needs_measures_the_smallest_set_and_says_so(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"spent 306 forward passes, over budget=10 \(10\)"):
        record = _validate(tmp_path, DScoreCallback(budget=10), CountingModule())
    assert record["budget"]["probe_inputs"] == 16  # the smallest uniform set
    with pytest.warns(UserWarning, match="over budget"):
        record = _validate(tmp_path / "balanced", RobustnessCallback(budget=10), CountingModule(), batches=10)
    assert set(record["class_counts"].values()) == {5}  # five per class


def test_the_draw_runs_the_model_itself_when_the_loop_did_not(tmp_path: Path) -> None:
    module = CountingModule(through_net=True)  # validation_step calls the network, so no output is reused
    record = _validate(tmp_path, DScoreCallback(budget=None, probe_size=40), module)
    assert record["budget"]["forward_passes"] == 300 + 40 * 19 + 2  # the draw's pass over the loader counts
    assert record["budget"]["draw_passes"] == 300
    assert module.inputs_run == record["budget"]["forward_passes"] + 3  # + the first-batch check


def test_hda_sizes_seeds_population_and_iterations_to_the_budget(tmp_path: Path) -> None:
    population, iterations = 40, 30
    # three quarters of 3000 pay 10 seeds of 40 x (4 + 1) passes; the rest pays for the candidates
    callback = HDACallback(budget=3000, k=10, population=population, iterations=iterations)
    record = _validate(tmp_path, callback, CountingModule(), batches=10)
    assert (record["seeds"], record["population"], record["iterations"]) == (10, 40, 2250 // 400 - 1)
    search = 10 * (40 * 5 + 2 + 1) + 3  # each seed's population, logits, held-out check and gradient start; sizing
    assert record["budget"]["probe_inputs"] == (3000 - search) // 2 == 483
    assert record["budget"]["forward_passes"] <= 3000
    rich = HDACallback(budget=100_000, k=4, population=population, iterations=iterations)
    record = _validate(tmp_path / "rich", rich, CountingModule(), batches=5)
    assert (record["seeds"], record["population"], record["iterations"]) == (4, 40, 30)  # all it asked for
    small = HDACallback(budget=200, k=10, population=40, iterations=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record = _validate(tmp_path / "small", small, CountingModule())
    # 150 passes cannot pay 10 populations of 40: no iteration, so no elite to keep, and every seed gets the
    # population that fits beside its logits, held-out check and gradient start (150 // 10 - 3 = 12 individuals);
    # the 16 candidates' 32 passes and 3 sizing passes fit beside them
    assert (record["seeds"], record["population"], record["iterations"]) == (10, 12, 0)
    assert record["budget"]["forward_passes"] <= 200 and record["budget"]["probe_inputs"] >= 16
    keeps = HDACallback(budget=200, k=10, population=40, iterations=30, num_best=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record = _validate(tmp_path / "num_best", keeps, CountingModule())
    assert record["population"] == 30 and record["seeds"] == 150 // 33  # never fewer individuals than num_best


def test_what_a_measurement_spent_is_logged(tmp_path: Path) -> None:
    import csv

    callback = MetamorphicCallback(budget=800)
    _validate(tmp_path, callback, CountingModule())
    with (tmp_path / "metrics.csv").open() as handle:
        row = next(csv.DictReader(handle))
    assert float(row["metamorphic/forward_passes"]) == callback.latest["budget"]["forward_passes"]


def test_coverage_reads_the_loops_own_passes_and_spends_none(tmp_path: Path) -> None:
    module = CountingModule()
    record = _validate(tmp_path, NeuronCoverageCallback(ranges=None, criteria=("nc",)), module)
    assert record["budget"]["forward_passes"] == 0


def test_a_float_budget_is_rounded_as_written_not_as_stored() -> None:
    assert DScoreCallback(budget=1.1)._allowed_passes(100) == 110  # 1.1 * 100 is 110.00000000000001 in floats
    assert DScoreCallback(budget=0.2)._allowed_passes(999) == 200


def test_hda_with_the_separation_indicator_stays_within_its_budget(tmp_path: Path) -> None:
    callback = HDACallback(budget=1000, k=10, population=40, iterations=4, indicator="sep")
    record = _validate(tmp_path, callback, CountingModule(), batches=5)
    assert record["budget"]["forward_passes"] <= 1000
    assert (record["seeds"], record["iterations"]) == (10, 0)  # 750 pay 10 populations of 40, not one iteration
    search = 10 * (40 + 2 + 1) + 3
    assert record["budget"]["probe_inputs"] == (1000 - search) // 3  # logits, separation, selection


def _spaced_fit(root: Path, epochs: int, ckpt: Path | None = None, budget: int | None = 100) -> DScoreCallback:
    from lightning.pytorch.callbacks import ModelCheckpoint

    dscore = DScoreCallback(budget=budget)  # the smallest set (16 inputs) costs 16 x 19 + 2 = 306 passes
    saver = ModelCheckpoint(dirpath=root / "checkpoints", save_top_k=-1, every_n_epochs=1)
    trainer = quick_trainer(root, [dscore, saver], epochs=epochs, train_batches=1, val_batches=2)
    module = ClassifierModule(pretrained("mnist_a"), lr=1e-6)
    trainer.fit(module, datamodule=MNISTDataModule(batch_size=50), ckpt_path=ckpt)
    return dscore


def test_a_measurement_dearer_than_the_budget_is_spaced_so_that_fit_averages_within_it(tmp_path: Path) -> None:
    with pytest.warns(
        UserWarning, match=r"costs 306 forward passes, 3\.1x budget=100 \(100\).* one scheduled validation in 3\.1"
    ):
        dscore = _spaced_fit(tmp_path, epochs=7)
    measured = [r["epoch"] for r in dscore.history]
    # by hand: 306 spent at 0; 306 > 200, 300 saved by epochs 1, 2; 306 <= 400 at 3; 612 > 500, 600; 612 <= 700 at 6
    assert measured == [0, 3, 6]
    spent = 0
    for record in dscore.history:  # a measurement starts only while what was spent is within the epochs' budget
        assert spent <= 100 * (record["epoch"] + 1)
        spent += record["budget"]["forward_passes"]
    assert all(r["budget"]["forward_passes"] == 306 for r in dscore.history)
    spacing = dict(dscore._spacing)
    trainer = quick_trainer(tmp_path / "validate", [dscore], val_batches=2)
    trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50), verbose=False)
    assert dscore.history[-1]["fn"] == "validate"  # asked for numbers now: measured at once
    assert dscore._spacing == spacing  # and fit's credit untouched


def test_a_resumed_run_saves_up_and_measures_at_the_epochs_an_uninterrupted_run_does(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = _spaced_fit(tmp_path / "whole", epochs=7)
        resumed = _spaced_fit(tmp_path / "resumed", 7, next((tmp_path / "whole" / "checkpoints").glob("epoch=1-*")))
    assert [r["epoch"] for r in resumed.history] == [0, 3, 6]  # epoch 0 from the checkpoint's history
    assert [r["logged"] for r in resumed.history] == [r["logged"] for r in whole.history]
    resting = next((tmp_path / "whole" / "checkpoints").glob("epoch=3-*"))
    with pytest.warns(UserWarning, match=r"measured nothing in this fit: its 2 scheduled validation epoch\(s\) saved"):
        only_rests = _spaced_fit(tmp_path / "rests", 6, resting)  # epochs 4 and 5 save up for epoch 6
    assert [r["epoch"] for r in only_rests.history] == [0, 3]


def test_resumed_without_a_budget_it_measures_at_every_epoch(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _spaced_fit(tmp_path / "whole", epochs=2)
        checkpoint = next((tmp_path / "whole" / "checkpoints").glob("epoch=1-*"))  # saving up after epoch 0
        resumed = _spaced_fit(tmp_path / "resumed", 5, checkpoint, budget=None)
    assert [r["epoch"] for r in resumed.history] == [0, 2, 3, 4]


def test_hda_is_spaced_by_what_its_plan_costs(tmp_path: Path) -> None:
    # 30 passes plan 1 seed of 2 individuals (the fewest), no iteration (2 + 2 + 1 for its gradient start),
    # 3 sizing passes and 16 candidates x 2: 40 passes. By hand (a measurement starts while what was spent is
    # within 30 per epoch so far): 0 at epoch 0, 40 <= 60 at 1, 80 <= 90 at 2, 120 <= 120 at 3, 160 > 150 at 4
    hda = HDACallback(budget=30)
    with pytest.warns(UserWarning, match=r"costs 40 forward passes, 1\.3x budget=30 \(30\)"):
        trainer = quick_trainer(tmp_path, [hda], epochs=5, train_batches=1, val_batches=2)
        trainer.fit(ClassifierModule(pretrained("mnist_a"), lr=1e-6), datamodule=MNISTDataModule(batch_size=50))
    assert [r["epoch"] for r in hda.history] == [0, 1, 2, 3]
    assert {(r["seeds"], r["population"], r["iterations"]) for r in hda.history} == {(1, 2, 0)}
    assert {r["budget"]["forward_passes"] for r in hda.history} == {40}  # the plan's cost is what it spent
