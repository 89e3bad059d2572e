"""ObjectRelevancyCallback in a fit and in users' projects: numbers against a direct run, follow-ups made once,
the bank, normalised input, dict batches and outputs, several loaders, precisions, validate/test, resume, scenes."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from dlguard._random import content_keys
from dlguard.augment import object_follow_ups
from dlguard.callbacks import FailureReplay, ObjectRelevancyCallback
from dlguard.data import MNISTDataModule, SceneDataModule, scene_backgrounds
from dlguard.generate import object_relevancy_test
from dlguard.metrics.functional import unreliable
from dlguard.zoo import ClassifierModule, mnist_a, pretrained
from tests.callbacks.projects import DigitDicts, NormalizedDigits, normalize
from tests.callbacks.recompute import relevancy_logged
from tests.callbacks.test_projects import SignalClassifier, Signals
from tests.probes.fingerprint import assert_unchanged, fingerprint
from tests.quick import quick_trainer

KEYS = ("image", "label")
LOGGED = {"relevancy/score", "relevancy/preserving", "relevancy/removing", "relevancy/unreliable_rate"} | {
    "relevancy/forward_passes"
}


def digit_masks(images: torch.Tensor) -> torch.Tensor:
    """A user's mask function: MNIST digits are the bright pixels."""
    return images[:, 0] > 0.3


def logits_of(out: dict[str, torch.Tensor]) -> torch.Tensor:
    return out["logits"]


def logged_of(trainer: L.Trainer) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("relevancy/")}


@pytest.mark.parametrize("fresh", [10, 0])
def test_a_measurement_equals_a_direct_run_and_feeds_the_bank(tmp_path: Path, fresh: int) -> None:
    replay = FailureReplay(fraction=0.25)
    callback = ObjectRelevancyCallback(
        masks=digit_masks, budget=None, probe_size=40, bank=replay.bank, p_high=0.8, workers=1, fresh_backgrounds=fresh
    )
    trainer = quick_trainer(tmp_path, [callback, replay], val_batches=2)
    module = ClassifierModule(pretrained("mnist_a"))
    trainer.validate(module, datamodule=MNISTDataModule(batch_size=50), verbose=False)
    logged = logged_of(trainer)
    assert set(logged) == LOGGED

    probe = callback.probe_set()
    assert probe.size == 40
    assert callback.backgrounds.shape == (4, 3, 28, 28)  # RGB scene backgrounds, grayed for the digits
    follow_ups = object_follow_ups(probe.inputs, digit_masks(probe.inputs), callback.backgrounds, workers=2)
    torch.testing.assert_close(follow_ups.inputs, callback.last_run.follow_ups.inputs)
    run = object_relevancy_test(module.net, probe.inputs, probe.target, follow_ups)
    assert logged["relevancy/score"] == pytest.approx(float(run.scores.score.mean()), abs=1e-6)
    assert logged["relevancy/preserving"] == pytest.approx(float(run.scores.preserving.mean()), abs=1e-6)
    assert logged["relevancy/removing"] == pytest.approx(float(run.scores.removing.mean()), abs=1e-6)
    flagged = unreliable(run.scores, p_high=0.8)
    assert flagged.any()  # an MNIST model was never shown a digit on a photo: some confident inferences rely on black
    rate = float(flagged.sum() / run.scores.correct.sum())
    assert logged["relevancy/unreliable_rate"] == pytest.approx(rate, abs=1e-6)

    # the flagged inferences' objects on backgrounds drawn for this measurement (epoch 0), with their labels
    stored, labels = replay.bank.inputs("relevancy"), replay.bank.labels("relevancy")
    if fresh:  # each flagged input on ten backgrounds of its own, drawn for this measurement (epoch 0, step 0)
        rows = flagged.nonzero().flatten()
        keep = -(-replay.bank.capacity // fresh)  # no more than the bank keeps: the lowest content keys
        rows = rows[content_keys(probe.inputs[rows], 0).argsort()[:keep]].sort().values if len(rows) > keep else rows
        count = len(rows)
        backgrounds = scene_backgrounds(count * fresh, 28, seed=0 + 7919 * 1)[0].view(count, fresh, 3, 28, 28)
        sources, masks = probe.inputs[rows], digit_masks(probe.inputs)[rows]
        expected = torch.stack(
            [object_follow_ups(sources[i : i + 1], masks[i : i + 1], backgrounds[i]).background_swapped()[0]
             for i in range(count)]
        )  # fmt: skip
        assert torch.equal(labels, probe.target[rows].repeat_interleave(fresh))
    else:  # the follow-ups' own four background swaps
        expected = follow_ups.background_swapped()[flagged]
        assert torch.equal(labels, probe.target[flagged].repeat_interleave(4))
    torch.testing.assert_close(stored, expected.flatten(0, 1))
    assert (tmp_path / "relevancy" / "relevancy_gallery.png").is_file()
    assert (tmp_path / "relevancy" / "relevancy_distribution.png").is_file()
    # the generator on the callback's probe set and the follow-ups made independently, fed to the same metric
    assert logged == pytest.approx(relevancy_logged(callback, module.net, follow_ups=follow_ups), abs=1e-6)


def test_follow_ups_are_made_once_and_reused_every_epoch(tmp_path: Path) -> None:
    callback = ObjectRelevancyCallback(masks=digit_masks, budget=None, probe_size=30)
    trainer = quick_trainer(tmp_path, [callback], epochs=3, train_batches=2, val_batches=2)
    trainer.fit(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50))
    assert len(callback.history) == 3
    assert callback.cache.generated == 30 and len(callback.cache) == 30
    scores = [record["logged"]["relevancy/score"] for record in callback.history]
    assert len(set(scores)) == 3  # the model trains; the follow-ups stay


def test_the_model_is_left_as_found_and_bad_input_fails_before_any_work(tmp_path: Path) -> None:
    module = ClassifierModule(pretrained("mnist_a")).train()
    module.net.fc3.weight.requires_grad_(False)
    before = fingerprint(module)
    trainer = quick_trainer(
        tmp_path, [ObjectRelevancyCallback(masks=digit_masks, budget=None, probe_size=20)], val_batches=1
    )
    trainer.validate(module, datamodule=MNISTDataModule(batch_size=50), verbose=False)
    module.train()
    assert_unchanged(module, before)

    for masks, message in (
        (lambda x: x[:, 0, :20] > 0.3, r"masks: expected \(50, 28, 28\) to match the inputs"),
        (lambda x: x[:, 0] > 2.0, "masks: input 0 of the batch has an empty mask"),
        (5, "masks: cannot read the object masks at key 5 from a list batch of 2 elements"),  # what it holds
    ):
        trainer = quick_trainer(
            tmp_path, [ObjectRelevancyCallback(masks=masks, budget=None, probe_size=20)], val_batches=1
        )
        with pytest.raises(ValueError, match=message):
            trainer.fit(module, datamodule=MNISTDataModule(batch_size=50))
        module.train()
        assert_unchanged(module, before)
    wrong_size = ObjectRelevancyCallback(masks=digit_masks, backgrounds=torch.rand(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"backgrounds: expected images of the inputs' size \(28, 28\)"):
        quick_trainer(tmp_path, [wrong_size]).fit(module, datamodule=MNISTDataModule(batch_size=50))
    for kwargs, message in (
        ({"p_high": 1.5}, "p_high"),
        ({"s_low": -0.5}, "s_low"),
        ({"backgrounds": torch.rand(2, 3, 28, 28) * 2}, r"backgrounds: expected values in \[0, 1\]"),
        ({"backgrounds": torch.rand(3, 28, 28)}, "backgrounds: expected"),
        ({"probe_size": 0}, "probe_size"),
    ):
        with pytest.raises(ValueError, match=message):
            ObjectRelevancyCallback(masks=digit_masks, **kwargs)
    module.train()
    assert_unchanged(module, before)


def test_outputs_that_are_not_logits_are_refused_naming_output_transform(tmp_path: Path) -> None:
    callback = ObjectRelevancyCallback(
        masks=digit_masks, budget=None, probe_size=20, preprocess=normalize, batch_keys=KEYS
    )
    with pytest.raises(ValueError, match="output_transform"):
        quick_trainer(tmp_path, [callback]).fit(NormalizedDigits(output_dict=True), datamodule=DigitDicts())


def test_normalised_model_dict_batches_dict_outputs_equal_the_pixel_model(tmp_path: Path) -> None:
    callback = ObjectRelevancyCallback(
        masks=digit_masks, probe_size=30, preprocess=normalize, output_transform=logits_of, batch_keys=KEYS
    )
    trainer = quick_trainer(tmp_path, [callback], train_batches=1, val_batches=2)
    module = NormalizedDigits(output_dict=True, lr=0.0)
    trainer.fit(module, datamodule=DigitDicts())
    probe = callback.probe_set()
    follow_ups = object_follow_ups(probe.inputs, digit_masks(probe.inputs), callback.backgrounds)
    run = object_relevancy_test(module.backbone[1], probe.inputs, probe.target, follow_ups)  # the pixel-space net
    assert float(trainer.callback_metrics["relevancy/score"]) == pytest.approx(float(run.scores.score.mean()), abs=1e-5)


def test_scene_masks_come_from_the_batch(tmp_path: Path) -> None:
    # masks at position 2 of (image, label, mask); an untrained network, measured all the same
    callback = ObjectRelevancyCallback(budget=None, probe_size=24, min_accuracy=None)
    trainer = quick_trainer(tmp_path, [callback], val_batches=1)
    datamodule = SceneDataModule(batch_size=32)
    torch.manual_seed(0)
    trainer.validate(ClassifierModule(mnist_a(in_channels=3, input_size=32)), datamodule=datamodule, verbose=False)
    # an untrained network's near-uniform softmax: whether any of its 24 inferences is correct turns on the
    # host's last bits (none on an Intel AVX-512 Xeon, some on an AMD EPYC); without one the rate has no value
    correct = bool(callback.last_run.scores.correct.any())
    assert set(logged_of(trainer)) == (LOGGED if correct else LOGGED - {"relevancy/unreliable_rate"})
    probe = callback.probe_set()
    scenes = datamodule.val_set
    keys = content_keys(scenes.images[:32], 0)
    rows = torch.stack([(keys == k).nonzero()[0, 0] for k in probe.keys])
    expected = object_follow_ups(scenes.images[rows], scenes.masks[rows], callback.backgrounds)
    torch.testing.assert_close(callback.last_run.follow_ups.inputs, expected.inputs)


def test_several_loaders_and_limit_val_batches(tmp_path: Path) -> None:
    callback = ObjectRelevancyCallback(masks=digit_masks, budget=None, probe_size=20, dataloader_idx=1,
                                       preprocess=normalize, batch_keys=KEYS)  # fmt: skip
    trainer = quick_trainer(tmp_path, [callback], train_batches=1, val_batches=1)
    datamodule = DigitDicts(val_splits=(200, 300))
    trainer.fit(NormalizedDigits(), datamodule=datamodule)
    loader_one = torch.stack([datamodule._mnist.val_set[i][0] for i in range(200, 250)])
    assert torch.isin(callback.probe_set().all_keys, content_keys(loader_one, 0)).all()


def test_validate_and_test_measure_on_their_own_loaders(tmp_path: Path) -> None:
    callback = ObjectRelevancyCallback(
        masks=digit_masks, budget=None, probe_size=20, preprocess=normalize, batch_keys=KEYS
    )
    trainer = quick_trainer(tmp_path, [callback], val_batches=1, limit_test_batches=1)
    module, datamodule = NormalizedDigits(), DigitDicts()
    validated = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    tested = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    assert [record["stage"] for record in callback.history] == ["validation", "test"]
    assert "relevancy/score" in validated and "relevancy/score" in tested
    test_images = torch.stack([datamodule._mnist.val_set[i][0] for i in range(500, 550)])
    assert torch.isin(callback.probe_set("test").all_keys, content_keys(test_images, 0)).all()


@pytest.mark.parametrize("precision", ["64-true", "bf16-mixed"])
def test_precisions_give_the_float32_numbers(tmp_path: Path, precision: str) -> None:
    runs = {}
    for name in ("32-true", precision):
        callback = ObjectRelevancyCallback(
            masks=digit_masks, budget=None, probe_size=30, preprocess=normalize, batch_keys=KEYS
        )
        trainer = quick_trainer(tmp_path / name, [callback], train_batches=1, val_batches=2, precision=name)
        trainer.fit(NormalizedDigits(lr=0.0), datamodule=DigitDicts())
        runs[name] = logged_of(trainer)
    assert runs[precision].keys() == runs["32-true"].keys() == LOGGED
    for key, value in runs["32-true"].items():  # 64-true probes in float64, bf16-mixed in float32 outside autocast
        assert runs[precision][key] == pytest.approx(value, abs=1e-4), key


def _rows(path: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if value and key.startswith("relevancy/"):
                    rows.setdefault(int(row["epoch"]), {})[key] = float(value)
    return rows


def _resumable(tmp_path: Path) -> list[L.Callback]:
    replay = FailureReplay(fraction=0.25, batch_keys=KEYS)
    return [
        ObjectRelevancyCallback(
            masks=digit_masks, probe_size=30, bank=replay.bank, preprocess=normalize, batch_keys=KEYS, budget=None
        ),
        replay,
        ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_top_k=-1, every_n_epochs=1),
    ]


def test_a_resumed_run_measures_what_an_uninterrupted_run_measures(tmp_path: Path) -> None:
    whole = quick_trainer(tmp_path / "whole", _resumable(tmp_path / "whole"), epochs=3, val_batches=2)
    whole.fit(NormalizedDigits(), datamodule=DigitDicts())
    first_epoch = next((tmp_path / "whole" / "checkpoints").glob("epoch=0*.ckpt"))
    callbacks = _resumable(tmp_path / "resumed")
    resumed = quick_trainer(tmp_path / "resumed", callbacks, epochs=3, val_batches=2)
    resumed.fit(NormalizedDigits(), datamodule=DigitDicts(), ckpt_path=first_epoch)
    expected, got = _rows(tmp_path / "whole" / "metrics.csv"), _rows(tmp_path / "resumed" / "metrics.csv")
    assert sorted(got) == [1, 2]
    for epoch in (1, 2):
        assert got[epoch] == expected[epoch], epoch


def test_signals_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    """Object relevancy mutates images around an object mask: 1-D signals have neither; the error says so."""
    callback = ObjectRelevancyCallback(masks=lambda x: x[:, 0] > 0)
    with pytest.raises(ValueError, match=r"inputs: ObjectRelevancyCallback mutates images \(B, C, H, W\)"):
        quick_trainer(tmp_path, [callback]).fit(SignalClassifier(), datamodule=Signals())
