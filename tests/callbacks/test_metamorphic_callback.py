"""MetamorphicCallback in a fit and in users' projects: numbers against an independent loop, the bank with the
source's labels, normalised input, dict batches and outputs, several loaders, precisions, validate/test, resume,
steering (regression) and 1-D signals, bad input before any work."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dlguard._random import content_keys
from dlguard.augment import Property, deeptest_properties, default_properties
from dlguard.callbacks import FailureReplay, MetamorphicCallback
from dlguard.data import MNISTDataModule
from dlguard.zoo import ClassifierModule, pretrained
from tests.callbacks.projects import DigitDicts, NormalizedDigits, normalize
from tests.callbacks.recompute import metamorphic_logged
from tests.callbacks.test_projects import SignalClassifier, Signals
from tests.probes.fingerprint import assert_unchanged, fingerprint
from tests.quick import quick_trainer

KEYS = ("image", "label")
NAMES = ("brightness", "contrast", "rotation", "fog")


def chosen(names: tuple[str, ...] = NAMES) -> list[Property]:
    return [p for p in deeptest_properties() if p.name in names]


def logits_of(out: dict[str, Tensor]) -> Tensor:
    return out["logits"]


def logged_of(trainer: L.Trainer) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("metamorphic/")}


# ---- a user's steering project: ramps whose slope is the target -------------------------------------------


def ramps(count: int, seed: int) -> tuple[Tensor, Tensor]:
    """Gray ramps (B, 1, 16, 16) whose horizontal slope in [-0.8, 0.8] is the regression target."""
    gen = torch.Generator().manual_seed(seed)
    slope = torch.rand(count, generator=gen) * 1.6 - 0.8
    x = torch.linspace(-0.5, 0.5, 16)
    images = 0.5 + slope[:, None, None, None] * x + 0.05 * torch.randn(count, 1, 16, 16, generator=gen)
    return images.clamp(0, 1), slope


class Ramps(L.LightningDataModule):
    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(*ramps(256, 0)), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(*ramps(128, 1)), batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(*ramps(64, 2)), batch_size=self.batch_size)


class RampRegressor(L.LightningModule):
    """Outputs (B, 1), as Keras-era steering models do."""

    def __init__(self, lr: float = 1e-2) -> None:
        super().__init__()
        self.lr = lr
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(64, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        return F.mse_loss(self(batch[0]).squeeze(1), batch[1])

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self.log("val_mse", F.mse_loss(self(batch[0]).squeeze(1), batch[1]))

    def test_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self.log("test_mse", F.mse_loss(self(batch[0]).squeeze(1), batch[1]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def reference_regression(
    net: nn.Module, inputs: Tensor, target: Tensor, keys: Tensor, properties: list[Property], lam: float, eps: float
) -> tuple[dict[str, tuple[int, int]], list[Tensor]]:
    """DeepTest eq. 2 and eq. 3 written out one transformation and parameter at a time."""
    with torch.no_grad():
        source = net(inputs).flatten()
    mse_orig = float(((source - target) ** 2).mean())
    counts, violating = {}, []
    for prop in properties:
        found, counted = 0, 0
        for level in prop.levels:
            moved = prop(inputs, level, keys)
            with torch.no_grad():
                errors = (net(moved).flatten() - target) ** 2
            keep = prop.name in ("fog", "rain") or abs(float(errors.mean()) - mse_orig) <= eps
            if keep:
                found += int((errors > lam * mse_orig).sum())
                counted += len(inputs)
                violating.append(moved[errors > lam * mse_orig])
        counts[prop.name] = (found, counted)
    return counts, violating


def test_steering_numbers_equal_an_independent_loop_and_violations_go_to_the_bank(tmp_path: Path) -> None:
    replay = FailureReplay(fraction=0.25)
    properties = chosen()
    callback = MetamorphicCallback(
        properties=properties, task="regression", lam=2.0, epsilon=0.01, budget=None, probe_size=64, bank=replay.bank
    )
    trainer = quick_trainer(tmp_path, [callback, replay], epochs=1, train_batches=8, val_batches=4)
    module = RampRegressor()
    trainer.fit(module, datamodule=Ramps())
    logged = logged_of(trainer)
    assert set(logged) == {
        "metamorphic/violation_rate",
        "metamorphic/mse_orig",
        "metamorphic/forward_passes",
        *(f"metamorphic/{n}" for n in NAMES),
    }

    probe = callback.probe_set()
    assert probe.size == 64 and probe.target.is_floating_point()
    images, slopes = ramps(128, 1)
    rows = torch.stack([(content_keys(images, 0) == k).nonzero()[0, 0] for k in probe.keys])
    torch.testing.assert_close(probe.target, slopes[rows])  # angles ride along with their inputs
    module.eval()
    counts, violating = reference_regression(module, probe.inputs, probe.target, probe.keys, properties, 2.0, 0.01)
    with torch.no_grad():
        mse_orig = float(((module(probe.inputs).flatten() - probe.target) ** 2).mean())
    assert logged["metamorphic/mse_orig"] == pytest.approx(mse_orig, rel=1e-5)
    for name, (found, counted) in counts.items():
        assert logged[f"metamorphic/{name}"] == pytest.approx(found / max(counted, 1), abs=1e-6), name
    total = sum(found for found, _ in counts.values()) / sum(counted for _, counted in counts.values())
    assert logged["metamorphic/violation_rate"] == pytest.approx(total, abs=1e-6)
    assert 0 < total < 1 and counts["fog"][1] == 5 * 64  # fog is never filtered by eq. 3
    assert any(counted < 10 * 64 for name, (_, counted) in counts.items() if name != "fog")  # eq. 3 dropped some
    assert logged == pytest.approx(metamorphic_logged(callback, module), abs=1e-6)  # the generator, the metric

    stored, labels = replay.bank.inputs("metamorphic"), replay.bank.labels("metamorphic")
    expected = torch.cat(violating)
    assert len(stored) == len(expected) == sum(found for found, _ in counts.values())
    torch.testing.assert_close(stored.sort(dim=0).values, expected.sort(dim=0).values, atol=1e-6, rtol=0)
    assert labels.is_floating_point() and set(labels.tolist()) <= set(probe.target.tolist())  # the source's angle
    assert (tmp_path / "metamorphic" / "metamorphic_gallery.png").is_file()


def test_classification_numbers_equal_an_independent_loop(tmp_path: Path) -> None:
    properties = chosen(("rotation", "rain"))
    callback = MetamorphicCallback(properties=properties, budget=None, probe_size=50)
    trainer = quick_trainer(tmp_path, [callback], val_batches=2)
    module = ClassifierModule(pretrained("mnist_a"))
    trainer.validate(module, datamodule=MNISTDataModule(batch_size=50), verbose=False)
    logged = logged_of(trainer)
    probe = callback.probe_set()
    with torch.no_grad():
        source = module.net(probe.inputs).argmax(1)
        for prop in properties:
            changed = [int((module.net(prop(probe.inputs, level, probe.keys)).argmax(1) != source).sum())
                       for level in prop.levels]  # fmt: skip
            rate = sum(changed) / (len(prop.levels) * 50)
            assert logged[f"metamorphic/{prop.name}"] == pytest.approx(rate, abs=1e-6), prop.name
    assert 0 < logged["metamorphic/rotation"] < logged["metamorphic/rain"] + 1
    record = callback.latest["per_property"]["rotation"]
    assert record["inputs"] == [50] * 10 and record["violations"][0] <= record["violations"][-1]  # 3° < 30°
    assert logged == pytest.approx(metamorphic_logged(callback, module.net), abs=1e-6)  # the generator, the metric


def test_the_model_is_left_as_found_and_bad_input_fails_before_any_work(tmp_path: Path) -> None:
    module = ClassifierModule(pretrained("mnist_a")).train()
    module.net.fc3.weight.requires_grad_(False)
    before = fingerprint(module)
    trainer = quick_trainer(
        tmp_path, [MetamorphicCallback(properties=chosen(("brightness",)), probe_size=20)], val_batches=1
    )
    trainer.validate(module, datamodule=MNISTDataModule(batch_size=50), verbose=False)
    module.train()
    assert_unchanged(module, before)

    for kwargs, message in (
        ({"lam": 0.0}, "lam: expected λ > 0"),
        ({"lam": -1.0}, "lam"),
        ({"epsilon": -0.01}, "epsilon: expected ε >= 0"),
        ({"properties": []}, "properties: expected a non-empty list of dlguard.augment.Property"),
        ({"properties": ["fog"]}, "properties: expected dlguard.augment.Property items"),
        ({"task": "steering"}, "task: expected one of"),
        ({"probe_size": 0}, "probe_size"),
        ({"properties": "deeptest"}, r"properties: no preset named 'deeptest'; choose from \['label_preserving'"),
    ):
        with pytest.raises(ValueError, match=message):
            MetamorphicCallback(**{"properties": chosen(("brightness",)), **kwargs})

    with pytest.raises(TypeError, match=r"MetamorphicCallback\(\) got unexpected keyword arguments \['size'\]"):
        MetamorphicCallback(size=20)
    # a classifier given the regression relation, and a steering model given the classification relation
    wrong = MetamorphicCallback(properties=chosen(("brightness",)), task="regression", probe_size=20)
    with pytest.raises(ValueError, match="regression"):
        quick_trainer(tmp_path, [wrong], val_batches=1).validate(module, MNISTDataModule(batch_size=50), verbose=False)
    module.train()
    assert_unchanged(module, before)
    steering = RampRegressor()
    steering_before = fingerprint(steering)
    callback = MetamorphicCallback(
        properties=chosen(("brightness",)), probe_size=20
    )  # task="classification", float targets
    with pytest.raises(ValueError, match="task: 'classification' needs integer class labels"):
        quick_trainer(tmp_path, [callback], val_batches=1).validate(steering, Ramps(), verbose=False)
    labelled = MetamorphicCallback(properties=chosen(("brightness",)), task="classification", probe_size=20,
                                   batch_keys=lambda batch: (batch[0], (batch[1] > 0).long()))  # fmt: skip
    with pytest.raises(ValueError, match="regression output"):
        quick_trainer(tmp_path, [labelled], val_batches=1).validate(steering, Ramps(), verbose=False)
    steering.train()  # trainer.validate leaves a model in eval mode, with or without callbacks
    assert_unchanged(steering, steering_before)


def test_outputs_that_are_not_tensors_are_refused_naming_output_transform(tmp_path: Path) -> None:
    callback = MetamorphicCallback(
        properties=chosen(("brightness",)), probe_size=20, preprocess=normalize, batch_keys=KEYS
    )
    with pytest.raises(ValueError, match="output_transform"):
        quick_trainer(tmp_path, [callback], val_batches=1).fit(NormalizedDigits(output_dict=True), DigitDicts())


def test_normalised_model_dict_batches_dict_outputs_equal_the_pixel_model(tmp_path: Path) -> None:
    runs = {}
    for name, module, kwargs, datamodule in (
        ("pixels", ClassifierModule(pretrained("mnist_a")), {}, MNISTDataModule(batch_size=50)),
        ("normalised", NormalizedDigits(output_dict=True, lr=0.0),
         {"preprocess": normalize, "output_transform": logits_of, "batch_keys": KEYS}, DigitDicts()),
    ):  # fmt: skip
        callback = MetamorphicCallback(properties=chosen(), probe_size=30, **kwargs)
        trainer = quick_trainer(tmp_path / name, [callback], val_batches=2)
        trainer.validate(module, datamodule=datamodule, verbose=False)
        runs[name] = logged_of(trainer)
    assert runs["pixels"].keys() == runs["normalised"].keys()
    for key, value in runs["pixels"].items():
        assert runs["normalised"][key] == pytest.approx(value, abs=1e-6), key


def test_several_loaders_and_limit_val_batches(tmp_path: Path) -> None:
    callback = MetamorphicCallback(
        properties=chosen(("contrast",)), probe_size=20, dataloader_idx=1, preprocess=normalize, batch_keys=KEYS
    )
    trainer = quick_trainer(tmp_path, [callback], train_batches=1, val_batches=1)
    datamodule = DigitDicts(val_splits=(200, 300))
    trainer.fit(NormalizedDigits(), datamodule=datamodule)
    loader_one = torch.stack([datamodule._mnist.val_set[i][0] for i in range(200, 250)])
    assert torch.isin(callback.probe_set().all_keys, content_keys(loader_one, 0)).all()
    assert "metamorphic/contrast" in trainer.callback_metrics


def test_validate_and_test_measure_on_their_own_loaders(tmp_path: Path) -> None:
    callback = MetamorphicCallback(properties=chosen(("brightness",)), task="regression", probe_size=20)
    trainer = quick_trainer(tmp_path, [callback], val_batches=1, limit_test_batches=1)
    module, datamodule = RampRegressor(), Ramps()
    validated = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    tested = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    assert [record["stage"] for record in callback.history] == ["validation", "test"]
    assert "metamorphic/violation_rate" in validated and "metamorphic/violation_rate" in tested
    test_images, _ = ramps(64, 2)
    assert torch.isin(callback.probe_set("test").all_keys, content_keys(test_images[:32], 0)).all()


@pytest.mark.parametrize("precision", ["64-true", "bf16-mixed"])
def test_precisions_give_the_float32_numbers(tmp_path: Path, precision: str) -> None:
    runs = {}
    for name in ("32-true", precision):
        callback = MetamorphicCallback(properties=chosen(("brightness", "fog")), task="regression", probe_size=40)
        trainer = quick_trainer(tmp_path / name, [callback], train_batches=2, val_batches=2, precision=name)
        trainer.fit(RampRegressor(lr=0.0), datamodule=Ramps())
        runs[name] = logged_of(trainer)
    assert runs[precision].keys() == runs["32-true"].keys()
    for key, value in runs["32-true"].items():  # 64-true probes in float64, bf16-mixed in float32 outside autocast
        assert runs[precision][key] == pytest.approx(value, abs=1e-4), key


def _rows(path: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if value and key.startswith("metamorphic/"):
                    rows.setdefault(int(row["epoch"]), {})[key] = float(value)
    return rows


def _resumable(tmp_path: Path) -> list[L.Callback]:
    replay = FailureReplay(fraction=0.25)
    return [
        MetamorphicCallback(
            properties=chosen(("brightness", "fog")),
            task="regression",
            lam=2.0,
            probe_size=40,
            bank=replay.bank,
            budget=None,  # every epoch measures (test_budget: a resumed run spaces its measurements alike)
        ),
        replay,
        ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_top_k=-1, every_n_epochs=1),
    ]


def test_a_resumed_run_measures_what_an_uninterrupted_run_measures(tmp_path: Path) -> None:
    whole = quick_trainer(tmp_path / "whole", _resumable(tmp_path / "whole"), epochs=3, val_batches=2)
    whole.fit(RampRegressor(), datamodule=Ramps())
    first_epoch = next((tmp_path / "whole" / "checkpoints").glob("epoch=0*.ckpt"))
    resumed = quick_trainer(tmp_path / "resumed", _resumable(tmp_path / "resumed"), epochs=3, val_batches=2)
    resumed.fit(RampRegressor(), datamodule=Ramps(), ckpt_path=first_epoch)
    expected, got = _rows(tmp_path / "whole" / "metrics.csv"), _rows(tmp_path / "resumed" / "metrics.csv")
    assert sorted(got) == [1, 2]
    for epoch in (1, 2):
        assert got[epoch] == expected[epoch], epoch


def test_signals_take_properties_for_any_tensor(tmp_path: Path) -> None:
    noise_and_brightness = [p for p in default_properties(value_range=None) if not p.needs_images]
    callback = MetamorphicCallback(properties=noise_and_brightness, budget=None, probe_size=32)
    trainer = quick_trainer(tmp_path, [callback], val_batches=2)
    trainer.fit(SignalClassifier(), datamodule=Signals())
    assert {"metamorphic/noise", "metamorphic/brightness"} <= set(logged_of(trainer))
    with pytest.raises(ValueError, match=r"properties: 'rotation' needs images \(B, C, H, W\)"):
        quick_trainer(tmp_path, [MetamorphicCallback(properties=chosen(("rotation",)))]).fit(
            SignalClassifier(), Signals()
        )
