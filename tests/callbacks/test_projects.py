"""Every callback in a user's own project: normalised input, dict batches, dict outputs, several loaders,
precisions, validate/test, resume, 1-D signals. Numbers are checked against independent computations."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from dlguard._random import content_keys
from dlguard.augment import ErrorGuidedAugmentation, ScoreGuidedPadding, default_properties
from dlguard.callbacks import (
    DScoreCallback,
    FailureReplay,
    NeuronCoverageCallback,
    ObjectRelevancyCallback,
    RobustnessCallback,
)
from dlguard.metrics.functional import digit_sum
from dlguard.probes import capture_activations, neuron_layers
from tests.callbacks.projects import DigitDicts, NormalizedDigits, normalize
from tests.callbacks.recompute import dscore_logged, robustness_logged
from tests.probes.fingerprint import assert_unchanged, fingerprint
from tests.quick import quick_trainer

KEYS = ("image", "label")


def logits_of(out: dict[str, torch.Tensor]) -> torch.Tensor:
    return out["logits"]


def all_callbacks(**common) -> list[L.Callback]:
    return [
        DScoreCallback(n=2, probe_size=60, **common),
        RobustnessCallback(per_class=4, pairs=40, combine=digit_sum, **common),
        NeuronCoverageCallback(max_profile_batches=2, **common),
    ]


def val_images(datamodule: DigitDicts, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    datamodule.setup()
    items = [datamodule._mnist.val_set[i] for i in range(start, start + count)]
    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def test_normalised_model_dict_batches_dict_outputs(tmp_path: Path) -> None:
    module, datamodule = NormalizedDigits(output_dict=True, lr=0.0), DigitDicts()
    dscore, robustness, coverage = callbacks = all_callbacks(
        preprocess=normalize, output_transform=logits_of, batch_keys=KEYS
    )
    trainer = quick_trainer(tmp_path, callbacks, train_batches=2, val_batches=3)
    trainer.fit(module, datamodule=datamodule)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    pixel_model = module.backbone[1]  # the same network taking pixels: an independent path to the numbers

    # D-Score's probe: the smallest content keys among the 150 digits validation loaded, as many as the default
    # budget pays for (0.15 x 150 passes at 1 + 2n² = 9 per input: 2), raised to the smallest uniform set, 16
    images, _ = val_images(datamodule, 0, 150)
    probe = dscore.probe_set()
    assert torch.equal(probe.all_keys, content_keys(images, 0).sort().values[:16])
    expected = dscore_logged(dscore, pixel_model)
    assert {k: v for k, v in logged.items() if k.startswith("dscore/")} == pytest.approx(expected, abs=1e-5)
    assert logged["dscore/baseline_acc"] > 0.9

    # robustness: a balanced set of correctly predicted digits, swept through the same network
    probe = robustness.probe_set()
    with torch.no_grad():
        assert torch.equal(pixel_model(probe.inputs).argmax(1), probe.target)
    assert probe.class_counts == {c: 4 for c in range(10)}
    expected = robustness_logged(robustness, pixel_model)
    assert {k: v for k, v in logged.items() if "robustness/" in k} == pytest.approx(expected, abs=1e-6)

    # coverage ranges were profiled on what the model sees: the pixel network's layer outputs
    layers = neuron_layers(pixel_model)
    train_images = torch.stack([datamodule._mnist.train_set[i][0] for i in range(100)])
    with torch.no_grad(), capture_activations(pixel_model, layers) as acts:
        pixel_model(train_images)
    for name, outputs in acts.items():
        values = outputs[0] if outputs[0].ndim == 2 else outputs[0].mean((2, 3))
        low, high = coverage.ranges[f"backbone.1.{name}"]
        torch.testing.assert_close(low, values.amin(0))
        torch.testing.assert_close(high, values.amax(0))


def test_a_model_that_needs_preprocess_is_measured_wrongly_without_it(tmp_path: Path) -> None:
    """The planted defect: the same run without ``preprocess`` sees raw pixels and reports a broken model."""
    callback = DScoreCallback(n=2, probe_size=60, batch_keys=KEYS)
    trainer = quick_trainer(tmp_path, [callback], train_batches=1, val_batches=3)
    with pytest.warns(UserWarning, match=r"no probe set at epoch 0: the validation accuracy 0\.\d+ over 150 inputs"):
        trainer.fit(NormalizedDigits(lr=0.0), datamodule=DigitDicts())
    assert callback.history == [] and "dscore/baseline_acc" not in trainer.callback_metrics  # not measured at all
    # told to measure whatever the accuracy, it reports the broken model
    callback = DScoreCallback(n=2, probe_size=60, batch_keys=KEYS, min_accuracy=None)
    trainer = quick_trainer(tmp_path, [callback], train_batches=1, val_batches=3)
    trainer.fit(NormalizedDigits(lr=0.0), datamodule=DigitDicts())
    assert float(trainer.callback_metrics["dscore/baseline_acc"]) < 0.5


def test_several_validation_loaders_and_limit_val_batches(tmp_path: Path) -> None:
    datamodule = DigitDicts(val_splits=(200, 300))
    dscore = DScoreCallback(n=2, probe_size=80, dataloader_idx=1, batch_keys=KEYS, preprocess=normalize)
    robustness = RobustnessCallback(
        per_class=3,
        pairs=20,
        properties=default_properties()[:1],
        dataloader_idx=1,
        batch_keys=KEYS,
        preprocess=normalize,
    )
    trainer = quick_trainer(tmp_path, [dscore, robustness], train_batches=1, val_batches=2)
    trainer.fit(NormalizedDigits(lr=0.0), datamodule=datamodule)
    images, _ = val_images(datamodule, 200, 100)  # loader 1, its first two batches of 50
    loaded = content_keys(images, 0)
    assert dscore.probe_set().size == 16  # probe_size=80 cut to the budget's (0.15 x 100 inputs) smallest set
    assert torch.isin(dscore.probe_set().all_keys, loaded).all()
    assert torch.isin(robustness.probe_set().all_keys, loaded).all()


def test_a_loader_index_that_does_not_exist_fails_before_training(tmp_path: Path) -> None:
    module = NormalizedDigits().train()
    before = fingerprint(module)
    trainer = quick_trainer(tmp_path, [DScoreCallback(n=2, dataloader_idx=2, batch_keys=KEYS)])
    with pytest.raises(ValueError, match=r"dataloader_idx: 2, but the validation loop has 2 dataloader"):
        trainer.fit(module, datamodule=DigitDicts(val_splits=(200, 300)))
    module.train()  # the sanity check's own eval() is Lightning's; weights, flags and hooks are untouched
    assert_unchanged(module, before)


def test_dict_batches_without_batch_keys_fail_at_the_first_batch(tmp_path: Path) -> None:
    trainer = quick_trainer(tmp_path, [DScoreCallback(n=2, preprocess=normalize)])
    with pytest.raises(ValueError, match=r"batch_keys: cannot read the inputs at key 0 .* keys \['image', 'label'\]"):
        trainer.fit(NormalizedDigits(), datamodule=DigitDicts())


@pytest.mark.parametrize("precision", ["64-true", "bf16-mixed"])
def test_precisions_give_the_float32_numbers(tmp_path: Path, precision: str) -> None:
    runs = {}
    for name in ("32-true", precision):
        callbacks = all_callbacks(preprocess=normalize, batch_keys=KEYS)
        trainer = quick_trainer(tmp_path / name, callbacks, train_batches=1, val_batches=3, precision=name)
        trainer.fit(NormalizedDigits(lr=0.0), datamodule=DigitDicts())
        runs[name] = {k: float(v) for k, v in trainer.callback_metrics.items() if "/" in k}
    assert runs[precision].keys() == runs["32-true"].keys()
    for key, value in runs["32-true"].items():
        # probes run in float32 outside autocast (bf16) or in float64 (64-true): at most one of 40-60 inputs flips;
        # coverage reads bf16 activations inside the validation step
        tolerance = 0.06 if key.startswith("coverage") else 0.026
        assert runs[precision][key] == pytest.approx(value, abs=tolerance), key


def test_validate_and_test_measure_on_their_own_loaders(tmp_path: Path) -> None:
    callbacks = all_callbacks(preprocess=normalize, batch_keys=KEYS)
    trainer = quick_trainer(tmp_path, callbacks, val_batches=2, limit_test_batches=2)
    module, datamodule = NormalizedDigits(), DigitDicts()
    validated = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    tested = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    for callback in callbacks:
        assert [record["stage"] for record in callback.history] == ["validation", "test"]
    for key in ("dscore/d_score", "robustness/noise", "coverage/nc", "coverage/kmnc"):
        assert key in validated and key in tested
    test_images, _ = val_images(datamodule, 500, 100)  # the test loader's first two batches
    assert torch.isin(callbacks[0].probe_set("test").all_keys, content_keys(test_images, 0)).all()
    assert not torch.isin(callbacks[0].probe_set("validation").all_keys, content_keys(test_images, 0)).any()


def _metrics(path: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if value and "/" in key:
                    rows.setdefault(int(row["epoch"]), {})[key] = float(value)
    return rows


def _resumable_callbacks(tmp_path: Path, guided: bool = False, p_from: str = "latest") -> list[L.Callback]:
    replay = FailureReplay(fraction=0.25, batch_keys=KEYS)
    common: dict = {"preprocess": normalize, "batch_keys": KEYS}
    if guided:  # measure at every validation, so that the guides change strength after the restart too
        common["budget"] = None
    return [
        DScoreCallback(n=2, probe_size=60, guide=ScoreGuidedPadding() if guided else None, p_from=p_from, **common),
        RobustnessCallback(
            per_class=4,
            pairs=40,
            combine=digit_sum,
            bank=replay.bank,
            guide=ErrorGuidedAugmentation() if guided else None,
            **common,
        ),
        NeuronCoverageCallback(max_profile_batches=2, **common),
        replay,
        ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_top_k=-1, every_n_epochs=1),
    ]


@pytest.mark.parametrize(
    ("guided", "p_from"),
    [(False, "latest"), (True, "latest"), (True, "unpadded")],
    ids=["replay", "replay-and-guides", "guides-with-held-p"],
)
def test_a_resumed_run_measures_what_an_uninterrupted_run_measures(tmp_path: Path, guided: bool, p_from: str) -> None:
    """Lightning checkpoints no global RNG: the guides' draws (kornia's padding, the properties' noise) must
    come from the callbacks' own generators, in their checkpoints, or the resumed run trains on other images.
    A ``p`` held since epoch 0 (``p_from="unpadded"``) stays held after the restart."""
    whole_callbacks = _resumable_callbacks(tmp_path / "whole", guided, p_from)
    whole = quick_trainer(tmp_path / "whole", whole_callbacks, epochs=3, val_batches=3)
    whole.fit(NormalizedDigits(), datamodule=DigitDicts())
    first_epoch = next((tmp_path / "whole" / "checkpoints").glob("epoch=0*.ckpt"))
    resumed_callbacks = _resumable_callbacks(tmp_path / "resumed", guided, p_from)
    resumed = quick_trainer(tmp_path / "resumed", resumed_callbacks, epochs=3, val_batches=3)
    resumed.fit(NormalizedDigits(), datamodule=DigitDicts(), ckpt_path=first_epoch)
    expected, got = _metrics(tmp_path / "whole" / "metrics.csv"), _metrics(tmp_path / "resumed" / "metrics.csv")
    assert resumed_callbacks[3].replayed > 0  # failures found at epoch 0 were replayed after the restart
    if guided:  # both guides augmented the 4 batches of epochs 1 and 2, at strengths the restart changed
        assert [c._guided for c in resumed_callbacks[:2]] == [c._guided for c in whole_callbacks[:2]] == [8, 8]
        if p_from == "latest":
            assert got[1]["dscore/guide_p"] != got[2]["dscore/guide_p"]
        else:  # held at epoch 0's p, which the checkpoint carries (epoch 0's row is not in the resumed log)
            assert got[1]["dscore/guide_p"] == got[2]["dscore/guide_p"] == expected[0]["dscore/guide_p"]
            assert got[2]["dscore/d_score"] != expected[0]["dscore/d_score"]  # measured afresh, only p held
    assert sorted(got) == [1, 2] and expected[1].keys() == got[1].keys()
    for epoch in (1, 2):
        assert got[epoch] == expected[epoch], epoch


# ---- 1-D signals ---------------------------------------------------------------------------------


class Signals(L.LightningDataModule):
    """Two-channel signals (B, 2, 64) whose class is the level of channel 0 (-1, 0, +1), with noise."""

    def setup(self, stage: str | None = None) -> None:
        generator = torch.Generator().manual_seed(0)
        labels = torch.arange(600) % 3
        signals = 0.3 * torch.randn(600, 2, 64, generator=generator)
        signals[:, 0] += (labels - 1).float().view(-1, 1)
        self.data = torch.utils.data.TensorDataset(signals, labels)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.utils.data.Subset(self.data, range(480)), batch_size=48)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.utils.data.Subset(self.data, range(480, 600)), batch_size=40)


class SignalClassifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(2, 8, 5), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_acc", (self(batch[0]).argmax(1) == batch[1]).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.05)


def test_signals_get_coverage_and_noise_robustness(tmp_path: Path) -> None:
    properties = [p for p in default_properties(value_range=None) if p.name != "rotation"]
    robustness = RobustnessCallback(properties=properties, per_class=10, pairs=30, budget=None)  # every epoch
    coverage = NeuronCoverageCallback()
    trainer = quick_trainer(tmp_path, [robustness, coverage], epochs=3, train_batches=10, val_batches=3)
    module = SignalClassifier()
    trainer.fit(module, datamodule=Signals())
    assert float(trainer.callback_metrics["val_acc"]) > 0.9
    probe = robustness.probe_set()
    assert probe.inputs.shape[1:] == (2, 64) and float(probe.inputs.min()) < 0  # signals, not pixels
    expected = robustness_logged(robustness, module.net)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("robustness/")}
    assert logged == pytest.approx(expected, abs=1e-6)
    assert 0 < float(trainer.callback_metrics["coverage/nc"]) <= 1


def test_rotation_and_dscore_refuse_signals_naming_the_argument(tmp_path: Path) -> None:
    trainer = quick_trainer(tmp_path, [DScoreCallback(n=2)], train_batches=1)
    with pytest.raises(ValueError, match="no layer of type Conv2d"):
        trainer.fit(SignalClassifier(), datamodule=Signals())
    rotation = [p for p in default_properties(value_range=None) if p.name == "rotation"]
    trainer = quick_trainer(tmp_path, [RobustnessCallback(properties=rotation, per_class=5)], train_batches=5)
    with pytest.raises(ValueError, match=r"properties: 'rotation' needs images \(B, C, H, W\)"):
        trainer.fit(SignalClassifier(), datamodule=Signals())


def test_signals_outside_the_pixel_range_are_refused_saying_how_to_measure_them(tmp_path: Path) -> None:
    properties = [p for p in default_properties() if p.name != "rotation"]  # value_range (0, 1): pixels
    trainer = quick_trainer(tmp_path, [RobustnessCallback(properties=properties, per_class=5)], train_batches=1)
    module = SignalClassifier()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(ValueError, match=r"expected values in \[0, 1\].*default_properties\(value_range=None\)"):
        trainer.fit(module, datamodule=Signals())
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())  # lr 0.05, one step: would move


class _NoCollectiveAtTheEnd(L.Callback):
    """From the end of the fit loop on, any broadcast fails: dlguard's end-of-run writing may not make one.

    Under ddp_spawn, a broadcast as a run's last collective (``trainer.log_dir``) aborted workers at exit.
    """

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError("a collective at the end of the run")

        trainer.strategy.broadcast = refuse


def test_end_of_run_figures_are_written_without_a_collective(tmp_path: Path) -> None:
    callbacks = all_callbacks(preprocess=normalize, batch_keys=KEYS)
    trainer = quick_trainer(tmp_path, [_NoCollectiveAtTheEnd(), *callbacks], train_batches=2, val_batches=2)
    trainer.fit(NormalizedDigits(), datamodule=DigitDicts())
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png")}
    assert {"dscore/dscore_distributions.png", "coverage/coverage_by_layer.png"} <= written


def test_two_callbacks_of_one_class_side_by_side_keep_their_own_checkpoint_state(tmp_path: Path) -> None:
    """Box against mask removal, one callback per validation loader, one replay per bank: Lightning refuses
    two stateful callbacks with one key, so each setting users have must give a key of its own."""
    pairs = [
        (ObjectRelevancyCallback(removal="box"), ObjectRelevancyCallback(removal="mask")),
        (ObjectRelevancyCallback(), ObjectRelevancyCallback(fresh_backgrounds=3)),
        (RobustnessCallback(dataloader_idx=0), RobustnessCallback(dataloader_idx=1)),
        (DScoreCallback(n=2), DScoreCallback(n=2, seed=1)),
        (FailureReplay(), FailureReplay(seed=1)),
        (FailureReplay(), FailureReplay(repeats=None)),
    ]
    for first, second in pairs:
        assert first.state_key != second.state_key
        L.Trainer(callbacks=[first, second], logger=False, enable_checkpointing=False, enable_progress_bar=False)
    # default callbacks keep the key their checkpoints were written under
    assert RobustnessCallback().state_key == "RobustnessCallback{'properties': ['noise', 'rotation', 'brightness']}"
    assert FailureReplay().state_key == "FailureReplay{'fraction': 0.25}"
    with pytest.raises(
        RuntimeError, match="more than one stateful callback"
    ):  # the same settings twice: Lightning's refusal
        L.Trainer(callbacks=[FailureReplay(), FailureReplay()], logger=False, enable_checkpointing=False)
