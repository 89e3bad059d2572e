from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn

from dlguard.augment import ScoreGuidedPadding
from dlguard.callbacks import DScoreCallback
from dlguard.data import MNISTDataModule
from dlguard.generate import dscore_test
from dlguard.metrics import DScore
from dlguard.metrics.functional import d_score
from dlguard.zoo import ClassifierModule, mnist_a, pretrained
from tests.callbacks.recompute import dscore_logged
from tests.probes.fingerprint import assert_unchanged, fingerprint
from tests.quick import quick_trainer


def fit(tmp_path: Path, callback: DScoreCallback, epochs: int = 2, net: nn.Module | None = None) -> L.Trainer:
    trainer = quick_trainer(tmp_path, [callback], epochs=epochs, train_batches=8, val_batches=4)
    trainer.fit(ClassifierModule(net or pretrained("mnist_a").train()), datamodule=MNISTDataModule(batch_size=64))
    return trainer


def test_fit_logs_dscore_and_drives_the_guide(tmp_path: Path) -> None:
    guide = ScoreGuidedPadding()
    callback = DScoreCallback(n=3, budget=None, probe_size=100, guide=guide)
    trainer = fit(tmp_path, callback)
    assert [record["epoch"] for record in callback.history] == [0, 1]  # never in the sanity check
    latest = callback.latest
    logged = trainer.callback_metrics
    for key in ("d_score", "v_robust", "v_fitness", "baseline_acc"):
        assert float(logged[f"dscore/{key}"]) == pytest.approx(latest[key], abs=1e-6)
    assert guide.p == pytest.approx(latest["augment_probability"]) and 0 < guide.p < 1
    assert float(logged["dscore/guide_p"]) == pytest.approx(guide.p)
    # every logged number is the generator's on the callback's probe set, fed to the same metric
    expected = dscore_logged(callback, trainer.lightning_module)
    assert {k: float(v) for k, v in logged.items() if k.startswith("dscore/")} == pytest.approx(expected, abs=1e-6)
    # the record is consistent with the paper's formulas on its own accuracies
    again = d_score(latest["baseline_acc"], latest["deletion_acc"], latest["translation_acc"], 10)
    assert float(again.d_score) == pytest.approx(latest["d_score"], abs=1e-12)
    assert (tmp_path / "dscore" / "dscore_distributions.png").is_file()


def test_unpadded_holds_the_p_of_the_last_measurement_before_the_guide_padded(tmp_path: Path) -> None:
    """The paper's protocol: ``p`` from the model trained unpadded, held; ``latest`` follows every measurement."""
    held = DScoreCallback(n=3, budget=None, probe_size=100, guide=ScoreGuidedPadding(), p_from="unpadded")
    trainer = fit(tmp_path / "held", held, epochs=3)
    measured = [record["augment_probability"] for record in held.history]
    assert [record["epoch"] for record in held.history] == [0, 1, 2]
    assert measured[0] != pytest.approx(measured[2], abs=1e-3)  # padding moved v_robust: holding is visible
    assert held.guide is not None and held.guide.p == pytest.approx(measured[0])  # set at epoch 0, then held
    assert float(trainer.callback_metrics["dscore/guide_p"]) == pytest.approx(measured[0])
    assert held.state_dict()["guided"] == 16  # epochs 1 and 2 padded every batch at that p

    latest = DScoreCallback(n=3, budget=None, probe_size=100, guide=ScoreGuidedPadding())
    fit(tmp_path / "latest", latest, epochs=3)
    assert latest.history[0]["augment_probability"] == pytest.approx(measured[0])  # the same first measurement
    assert latest.guide is not None and latest.guide.p == pytest.approx(latest.history[-1]["augment_probability"])

    later = DScoreCallback(
        n=3, budget=None, probe_size=100, guide=ScoreGuidedPadding(), p_from="unpadded", start_epoch=1
    )
    fit(tmp_path / "later", later, epochs=3)
    assert [record["epoch"] for record in later.history] == [1, 2]  # two unpadded epochs before the measurement
    assert later.history[1]["augment_probability"] != pytest.approx(later.history[0]["augment_probability"], abs=1e-3)
    assert later.guide is not None and later.guide.p == pytest.approx(later.history[0]["augment_probability"])


@pytest.mark.parametrize("p_from", ["latest", "unpadded"])
def test_a_validate_before_fit_sets_no_p_and_pads_nothing(tmp_path: Path, p_from: str) -> None:
    """A baseline ``trainer.validate`` measures, but the guide waits for the fit's first measurement: it
    neither pads at its initial ``p`` nor, holding, keeps that ``p`` for good."""
    callback = DScoreCallback(n=3, budget=None, probe_size=100, guide=ScoreGuidedPadding(p=0.5), p_from=p_from)
    trainer = quick_trainer(tmp_path, [callback], epochs=2, train_batches=8, val_batches=4)
    module, data = ClassifierModule(pretrained("mnist_a").train()), MNISTDataModule(batch_size=64)
    trainer.validate(module, datamodule=data)
    assert [record["fn"] for record in callback.history] == ["validate"] and callback.guide.p == 0.5
    trainer.fit(module, datamodule=data)
    fitted = [record for record in callback.history if record["fn"] == "fit"]
    assert [record["epoch"] for record in fitted] == [0, 1]
    assert callback.state_dict()["guided"] == 8  # epoch 1's batches only: nothing padded before epoch 0 measured
    set_by = fitted[0] if p_from == "unpadded" else fitted[-1]
    assert callback.guide.p == pytest.approx(set_by["augment_probability"]) != 0.5


def test_probe_is_a_random_fixed_draw_across_classes(tmp_path: Path) -> None:
    callback = DScoreCallback(n=2, budget=None, probe_size=100)
    fit(tmp_path, callback)
    probe = callback.probe_set()
    images, target = probe.inputs, probe.target
    assert images.shape == (100, 1, 28, 28) and probe.size == 100
    assert len(target.unique()) == 10 and sum(probe.class_counts.values()) == 100
    module = ClassifierModule(mnist_a())
    with torch.no_grad():
        accuracy = (module(images).argmax(1) == target).float().mean()
    before = fingerprint(module)
    run = dscore_test(module, images, target, n=2)
    assert_unchanged(module, before)
    metric = DScore(n=2, num_classes=run.num_classes)
    metric.update(run.logits, run.mutant_logits, run.translated_logits, run.target)
    result = metric.compute()
    assert float(result.baseline_accuracy) == pytest.approx(float(accuracy))
    assert result.feature_distribution.shape == (4,)


def test_every_n_epochs(tmp_path: Path) -> None:
    callback = DScoreCallback(n=2, budget=None, probe_size=50, every_n_epochs=2)
    fit(tmp_path, callback, epochs=3)
    assert [record["epoch"] for record in callback.history] == [1]


def test_guided_training_batch_is_replaced() -> None:
    callback = DScoreCallback(n=2, guide=ScoreGuidedPadding(p=1.0))
    images = torch.ones(4, 1, 16, 16)
    batch = [images, torch.zeros(4, dtype=torch.long)]
    callback.on_train_batch_start(None, None, batch, 0)
    assert torch.equal(images, torch.ones(4, 1, 16, 16))  # nothing measured yet: untouched
    callback.history.append({"augment_probability": 1.0})
    callback.on_train_batch_start(None, None, batch, 0)
    assert torch.equal(images, torch.ones(4, 1, 16, 16))  # not a fit's measurement (a validate()'s): untouched
    callback._p_set = True  # as a fit's measurement does
    callback.on_train_batch_start(None, None, batch, 0)
    assert batch[0].mean() < 0.5  # padded by (1 + p) = 2: a quarter stays bright
    assert torch.equal(images, torch.ones(4, 1, 16, 16))  # a new tensor in the list: the loader's as it gave it


def test_the_guide_draws_from_the_callback_s_own_generator_in_its_checkpoint() -> None:
    """Kornia samples the padding from the global RNG: the callback seeds it from a generator of its own
    (restored with its state), so the global RNG goes on as without a guide and a resumed run pads alike."""

    def guided(callback: DScoreCallback, batches: int) -> list[torch.Tensor]:
        callback.history.append({"augment_probability": 0.5})
        callback._p_set = True  # as a fit's measurement does
        padded = []
        for step in range(batches):
            batch = [torch.rand(6, 1, 12, 12, generator=torch.Generator().manual_seed(step)), torch.zeros(6).long()]
            callback.on_train_batch_start(None, None, batch, step)
            padded.append(batch[0])
        return padded

    source = DScoreCallback(n=2, guide=ScoreGuidedPadding(p=0.5))
    torch.manual_seed(7)
    guided(source, 2)
    after_guide = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(after_guide, torch.rand(3))  # the global RNG did not move
    target = DScoreCallback(n=2, guide=ScoreGuidedPadding(p=0.5))
    target.load_state_dict(source.state_dict())
    expected, got = guided(source, 3), guided(target, 3)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    fresh = guided(DScoreCallback(n=2, seed=1, guide=ScoreGuidedPadding(p=0.5)), 3)  # another seed pads otherwise
    assert not all(torch.equal(a, b) for a, b in zip(fresh, expected, strict=True))


def test_state_round_trip() -> None:
    source = DScoreCallback(n=3, guide=ScoreGuidedPadding(p=0.1))
    source.history.append({"epoch": 4, "d_score": 0.6, "augment_probability": 0.37})
    source.guide.p = 0.37
    target = DScoreCallback(n=3, guide=ScoreGuidedPadding(p=0.1))
    target.load_state_dict(source.state_dict())
    assert target.latest == source.latest and target.guide.p == 0.37
    target.load_state_dict({})  # an old checkpoint without this callback's state
    assert target.history == []
    assert DScoreCallback(n=3).state_key != DScoreCallback(n=4).state_key


@pytest.mark.parametrize(
    ("records", "ready"),
    [
        ([{"fn": "fit", "stage": "validation", "augment_probability": 0.37}], True),
        ([{"fn": "validate", "stage": "validation", "augment_probability": 0.37}], False),
        ([], False),
    ],
    ids=["a-fit-measured", "only-a-validate", "nothing-measured"],
)
def test_checkpoint_written_before_guide_p_set_pads_only_after_a_fit_measurement(
    records: list[dict[str, Any]], ready: bool
) -> None:
    source = DScoreCallback(n=3, guide=ScoreGuidedPadding(p=0.37))
    source.history.extend(records)
    old = {key: value for key, value in source.state_dict().items() if key != "guide_p_set"}  # as written before it
    target = DScoreCallback(n=3, guide=ScoreGuidedPadding(p=0.1))
    target.load_state_dict(old)
    assert target.guide.p == 0.37 and target._guide_ready() is ready
    batch = [torch.ones(4, 1, 12, 12), torch.zeros(4).long()]
    target.on_train_batch_start(None, None, batch, 0)
    assert target.state_dict()["guided"] == int(ready)  # pads only where a fit had measured


def test_model_without_conv_fails_before_training(tmp_path: Path) -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    before = fingerprint(net)
    with pytest.raises(
        ValueError, match=r"no layer of type Conv2d.*available layers: net \(Sequential\), net.0 \(Flatten\)"
    ):
        fit(tmp_path, DScoreCallback(n=3), net=net)
    assert_unchanged(net, before)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 1}, "n: expected"),
        ({"t": 1}, "t: expected an integer greater than 1"),
        ({"probe_size": 0}, "probe_size"),
        ({"every_n_epochs": 0}, "every_n_epochs"),
        ({"guide": nn.Identity()}, "guide: expected a ScoreGuidedPadding"),
        ({"p_from": "first"}, r"p_from: expected one of \('latest', 'unpadded'\), got 'first'"),
        ({"p_from": ["latest"]}, r"p_from: expected one of \('latest', 'unpadded'\), got \['latest'\]"),
        ({"p_from": "unpadded"}, "p_from='unpadded' sets a guide's p: pass guide=ScoreGuidedPadding()"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DScoreCallback(**kwargs)
