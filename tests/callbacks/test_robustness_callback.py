from __future__ import annotations

import json
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch

from dlguard.augment import ErrorGuidedAugmentation, Property, default_properties
from dlguard.augment.functional import brightness_scale
from dlguard.callbacks import RobustnessCallback
from dlguard.data import MNISTDataModule
from dlguard.metrics.functional import digit_sum
from dlguard.zoo import ClassifierModule, pretrained
from tests.callbacks.recompute import robustness_logged
from tests.quick import quick_trainer


def short_fit(tmp_path: Path, callbacks: list[L.Callback], epochs: int = 2) -> L.Trainer:
    trainer = quick_trainer(tmp_path, callbacks, epochs=epochs, train_batches=4, val_batches=2)
    trainer.fit(ClassifierModule(pretrained("mnist_a").train()), datamodule=MNISTDataModule(batch_size=64))
    return trainer


def test_fit_logs_curves_and_writes_the_error_summary(tmp_path: Path) -> None:
    guide = ErrorGuidedAugmentation()
    callback = RobustnessCallback(budget=None, per_class=15, pairs=150, guide=guide, combine=digit_sum)
    trainer = short_fit(tmp_path, [callback])
    assert [record["epoch"] for record in callback.history] == [0, 1]
    logged = trainer.callback_metrics
    for prop in default_properties():
        curve = callback.history[-1]["local"][prop.name]["lr_p"]
        assert float(logged[f"robustness/{prop.name}"]) == pytest.approx(sum(curve) / len(curve), abs=1e-6)
        assert float(logged[f"robustness/{prop.name}@{prop.levels[0]:g}"]) == pytest.approx(curve[0], abs=1e-6)
        assert 0 <= float(logged[f"global_robustness/{prop.name}"]) <= 1
    summary = json.loads((tmp_path / "robustness" / "error_summary.json").read_text())
    assert {k: v for k, v in summary.items() if k != "failures"} == callback.error_summary
    assert summary["pairs"] == 150 * 5 * 3  # pairs x levels x properties
    assert "# Error summary" in (tmp_path / "robustness" / "error_summary.md").read_text()
    for figure in ("robustness_curves", "failure_rates", "top_confusions"):
        assert (tmp_path / "robustness" / f"{figure}.png").is_file()
    assert torch.allclose(guide.proposal, torch.tensor(summary["proposal"]))
    # every logged number is the generator's on the callback's probe set, fed to the same metrics
    expected = robustness_logged(callback, trainer.lightning_module)
    got = {k: float(v) for k, v in logged.items() if "robustness/" in k}
    assert got == pytest.approx(expected, abs=1e-6)


def test_a_property_no_input_fails_is_named_once_as_at_the_ceiling(tmp_path: Path) -> None:
    unchanged = Property("unchanged", brightness_scale, (1.0,))  # x 1.0: every probe input stays as it was
    properties = [unchanged, default_properties()[0]]  # beside noise, which fails some inputs at sigma 0.5
    guide = ErrorGuidedAugmentation(properties)
    callback = RobustnessCallback(properties=properties, budget=None, per_class=10, guide=guide)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = short_fit(tmp_path, [callback], epochs=1)
        trainer.validate(trainer.lightning_module, datamodule=MNISTDataModule(batch_size=64), verbose=False)
    said = [str(w.message) for w in caught if "no probe input failed" in str(w.message)]
    assert said == [
        "RobustnessCallback: robustness is 1.0 at every level of ['unchanged'] at epoch 0: no probe input failed, so "
        "it is at the ceiling and cannot show the model growing more robust; the guide never applies it; for a "
        "figure that can move, give harsher levels (properties=[Property(name, op, levels)])"
    ]  # once, though fit and validate both measured it at 1.0
    assert [min(r["local"]["unchanged"]["lr_p"]) for r in callback.history] == [1.0, 1.0]
    assert min(callback.history[0]["local"]["noise"]["lr_p"]) < 1.0
    assert [row[0] for row in callback.proposal] == [0.0] * 10  # the unchanged column: nothing to apply


def test_without_an_adder_the_guide_follows_local_robustness(tmp_path: Path) -> None:
    properties = [Property("bright", brightness_scale, (1.5, 3.0)), default_properties()[1]]
    guide = ErrorGuidedAugmentation(properties)
    callback = RobustnessCallback(properties=properties, budget=None, per_class=10, guide=guide)
    trainer = short_fit(tmp_path, [callback], epochs=1)
    probe = callback.probe_set()
    with torch.no_grad():  # an independent reference: the failure rate of each class under each property
        model = trainer.lightning_module.eval()
        rates = torch.zeros(10, 2)
        for column, prop in enumerate(properties):
            for level in prop.levels:
                wrong = (model(prop(probe.inputs, level)).argmax(1) != probe.target).float()
                rates[:, column] += torch.zeros(10).index_add_(0, probe.target, wrong) / torch.bincount(probe.target)
        rates /= torch.tensor([len(p.levels) for p in properties])
    counts = torch.bincount(probe.target, minlength=10).tolist()
    assert min(counts) < max(counts)  # a class short of per_class: the inputs it lacks count at the pooled rate
    for column in range(2):
        pooled = sum(n * float(rates[c, column]) for c, n in enumerate(counts)) / sum(counts)
        for c, n in enumerate(counts):
            rates[c, column] = (n * rates[c, column] + (max(counts) - n) * pooled) / max(counts)
    assert callback.error_summary is None and rates.max() > 0
    torch.testing.assert_close(guide.proposal, rates / rates.max())
    # what the guide now applies, logged: half strength times the reference table's mean
    guide_p = float(trainer.callback_metrics["robustness/guide_p"])
    assert guide_p == pytest.approx(0.5 * float((rates / rates.max()).mean()), abs=1e-6)


def test_probe_set_is_balanced_correct_and_fixed(tmp_path: Path) -> None:
    callback = RobustnessCallback(
        properties=[Property("bright", brightness_scale, (1.5,))], budget=None, per_class=10, pairs=20
    )
    trainer = short_fit(tmp_path, [callback], epochs=1)  # drawn at the end of the only epoch
    probe = callback.probe_set()
    images, labels = probe.inputs, probe.target
    # 10 per class from the 128 digits validation loaded, or all the correctly predicted ones of a class with fewer
    assert probe.found_per_class is not None and sum(probe.found_per_class.values()) > 100
    expected = [min(10, probe.found_per_class[c]) for c in range(10)]
    assert torch.bincount(labels, minlength=10).tolist() == expected and min(expected) < 10
    with torch.no_grad():  # only inputs the model (as trained then) predicts correctly
        assert torch.equal(trainer.lightning_module.eval()(images).argmax(1), labels)


def test_too_few_inputs_warn_with_counts_and_the_run_goes_on(tmp_path: Path) -> None:
    callback = RobustnessCallback(
        properties=[Property("bright", brightness_scale, (1.5,))], budget=None, per_class=150, pairs=20
    )
    with pytest.warns(UserWarning, match="fewer than per_class=150"):
        short_fit(tmp_path, [callback], epochs=1)
    assert len(callback.history) == 1


def test_sweeping_leaves_training_untouched(tmp_path: Path) -> None:
    """Same batches and the same global RNG at every training step, with and without the sweep."""

    class Recorder(L.Callback):
        def __init__(self) -> None:
            self.seen: list[torch.Tensor] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.seen.append(torch.cat([batch[1].float(), torch.random.get_rng_state()[:64].float()]))

    runs = []
    for extra in ([], [RobustnessCallback(budget=None, per_class=5, pairs=20)]):
        recorder = Recorder()
        short_fit(tmp_path, [recorder, *extra])
        runs.append(torch.stack(recorder.seen))
    assert torch.equal(runs[0], runs[1])


def test_guide_replaces_training_images() -> None:
    guide = ErrorGuidedAugmentation([Property("bright", brightness_scale, (2.0,))], strength=1.0)
    callback = RobustnessCallback(properties=guide.properties, guide=guide)
    images = torch.full((4, 1, 2, 2), 0.25)
    batch = [images, torch.tensor([0, 1, 0, 1])]
    callback.on_train_batch_start(None, None, batch, 0)
    assert torch.equal(images, torch.full((4, 1, 2, 2), 0.25))  # no summary yet
    callback.load_state_dict({"summary": {"proposal": [[0.0], [1.0]]}, "history": []})
    callback.on_train_batch_start(None, None, batch, 0)
    assert batch[0][:, 0, 0, 0].tolist() == [0.25, 0.5, 0.25, 0.5]
    assert torch.equal(images, torch.full((4, 1, 2, 2), 0.25))  # a new tensor in the list: the loader's as given
    rows = (images.clone(), torch.tensor([0, 1, 0, 1]))
    callback.on_train_batch_start(None, None, rows, 0)  # a tuple cannot take a new tensor: written into
    assert rows[0][:, 0, 0, 0].tolist() == [0.25, 0.5, 0.25, 0.5]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"per_class": 0}, "per_class: expected an integer of at least 1"),
        ({"pairs": -1}, "pairs"),
        ({"properties": []}, "properties: expected a non-empty list of dlguard.augment.Property"),
        ({"properties": default_properties() * 2}, "properties: expected distinct property names"),
        ({"guide": torch.nn.Identity()}, "guide: expected an ErrorGuidedAugmentation"),
        ({"combine": 3}, "combine: expected a callable"),
        ({"bank": []}, "bank: expected a FailureBank"),
        ({"guide": ErrorGuidedAugmentation([Property("x", brightness_scale, (2.0,))])}, "guide: its properties"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RobustnessCallback(**kwargs)


@pytest.mark.ddp
@pytest.mark.slow
def test_under_ddp_spawn_the_summary_covers_every_rank(tmp_path: Path) -> None:
    import csv

    callback = RobustnessCallback(
        properties=[Property("bright", brightness_scale, (1.5, 3.0))], per_class=8, pairs=40, combine=digit_sum
    )
    trainer = quick_trainer(
        tmp_path, [callback], train_batches=2, val_batches=2, accelerator="cpu", devices=2, strategy="ddp_spawn"
    )
    trainer.fit(ClassifierModule(pretrained("mnist_a").train()), datamodule=MNISTDataModule(batch_size=64))
    summary = json.loads((tmp_path / "robustness" / "error_summary.json").read_text())
    assert summary["pairs"] == 40 * 2  # 20 pairs per rank per level, gathered from both ranks
    with (tmp_path / "metrics.csv").open() as handle:
        row = next(r for r in csv.DictReader(handle) if r.get("robustness/bright"))
    assert 0.5 < float(row["robustness/bright"]) <= 1.0


def test_wandb_gets_robustness_over_training_and_class_failure_rates_without_combine(tmp_path: Path) -> None:
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    callback = RobustnessCallback(budget=None, per_class=6)  # no combine: no adder, no error summary file
    logger = WandbLogger(project="dlguard-test", save_dir=str(tmp_path), offline=True)
    trainer = L.Trainer(
        max_epochs=3, limit_train_batches=2, limit_val_batches=2, callbacks=[callback], logger=logger,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(ClassifierModule(pretrained("mnist_a").train()), datamodule=MNISTDataModule(batch_size=64))
    wandb.finish()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")

    def latest_table(pattern: str) -> dict:
        tables = sorted(run.rglob(pattern), key=lambda path: path.stat().st_mtime_ns)
        assert tables, pattern
        return json.loads(tables[-1].read_text())

    # one chart per property, one line per measured epoch, each the LR_p curve that epoch logged
    over_training = latest_table("robustness/over_training/rotation*table.json")
    lines = {}
    assert over_training["columns"] == ["step", "lineKey", "lineVal"]  # W&B's line series: x, line, y
    for level, line, value in over_training["data"]:
        lines.setdefault(line, []).append((level, value))
    assert sorted(lines) == ["epoch 0", "epoch 1", "epoch 2"]
    for record in callback.history:
        expected = record["local"]["rotation"]["lr_p"]
        assert [v for _, v in sorted(lines[f"epoch {record['epoch']}"])] == pytest.approx(expected, abs=1e-6)
    # the per class x property failure rates, 1 - LR_c,p over the levels, although combine is None
    rates = latest_table("robustness/class_failure_rates*table.json")
    assert rates["columns"] == ["class", "property", "failure rate"] and len(rates["data"]) == 10 * 3
    last = callback.history[-1]["class_failure_rates"]
    for cls, name, rate in rates["data"]:
        assert rate == pytest.approx(last[name][cls], abs=1e-6)
    assert not (tmp_path / "robustness" / "error_summary.json").exists()
