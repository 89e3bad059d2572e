"""closed_loop_callbacks: the anchored arm's callbacks, in a user's dict-batch project with a normalising network."""

from __future__ import annotations

import inspect
import math
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from dlguard.augment import capture_properties, default_properties, exposure_properties
from dlguard.callbacks import (
    FailureReplay,
    GaussianNoise,
    KeepOriginals,
    ObjectRelevancyCallback,
    ProbeCallback,
    RobustnessCallback,
    closed_loop_callbacks,
)
from tests.callbacks.projects import DigitDicts, NormalizedDigits, normalize
from tests.quick import logged_by_epoch, quick_trainer

KEYS = ("image", "label")


def names(callbacks: list) -> list[str]:
    return [type(callback).__name__ for callback in callbacks]


def test_without_masks_or_noise_those_callbacks_are_left_out_and_the_rest_keep_their_order() -> None:
    full = names(closed_loop_callbacks(masks=2))
    assert names(closed_loop_callbacks()) == [n for n in full if n != "ObjectRelevancyCallback"]
    assert names(closed_loop_callbacks(masks=2, max_sigma=None)) == full[1:] and full[0] == "GaussianNoise"


def test_every_callback_gets_the_project_s_settings() -> None:
    keys, seed = KEYS, 7
    callbacks = closed_loop_callbacks(masks="mask", preprocess=normalize, batch_keys=keys, seed=seed, max_sigma=0.1)
    assert callbacks[0].max_sigma == 0.1 and all(c.batch_keys == keys for c in callbacks)
    probes = [c for c in callbacks if not isinstance(c, GaussianNoise | FailureReplay | KeepOriginals)]
    assert len(probes) == 5 and all(c.preprocess is normalize and c.seed == seed for c in probes)
    assert next(c for c in callbacks if isinstance(c, ObjectRelevancyCallback)).masks == "mask"
    assert next(c for c in callbacks if isinstance(c, RobustnessCallback)).guide.strength == 0.125
    probe_default = inspect.signature(ProbeCallback).parameters["budget"].default
    assert {c.budget for c in probes} == {probe_default} and probe_default == 0.15  # the defaults cannot drift apart
    for budget in (500, 1.5, None):  # passes, a multiple above the loader, no bound: each reaches every detector
        bounded = closed_loop_callbacks(masks="mask", budget=budget)
        assert [c.budget for c in bounded if isinstance(c, ProbeCallback)] == [budget] * 5


def test_the_robustness_loop_measures_and_guides_the_properties_given() -> None:
    def loop(**options: object) -> RobustnessCallback:
        return next(c for c in closed_loop_callbacks(**options) if isinstance(c, RobustnessCallback))

    def named(properties: list) -> list[tuple[str, tuple]]:
        return [(p.name, tuple(p.levels)) for p in properties]

    default = loop()
    assert named(default.properties) == named([*default_properties(), *capture_properties(), *exposure_properties()])
    assert default.guide.properties == default.properties
    given = [*default_properties(), *exposure_properties()]
    chosen = loop(properties=tuple(given))
    assert chosen.properties == given and chosen.guide.properties == given


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_sigma": -1.0}, "max_sigma: expected a non-negative"),
        ({"masks": [1]}, "masks: expected a batch key"),
        ({"properties": []}, "properties: expected at least one Property"),
        ({"budget": 0}, "budget: expected a positive int"),
        ({"budget": -0.5}, "budget: expected a positive int"),
        ({"budget": math.nan}, "budget: expected a positive int"),
        ({"budget": True}, "budget: expected a positive int"),
    ],
)
def test_bad_arguments_are_named(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        closed_loop_callbacks(**options)


@pytest.mark.slow
def test_a_fit_of_a_user_s_project_logs_finite_numbers_and_feeds_failures_back(tmp_path: Path) -> None:
    callbacks = closed_loop_callbacks(
        masks=lambda x: x[:, 0] > 0.3, preprocess=normalize, output_transform=lambda out: out["logits"],
        batch_keys=KEYS,
    )  # fmt: skip
    trainer = quick_trainer(tmp_path, callbacks, epochs=3, train_batches=3, val_batches=20)
    trainer.fit(NormalizedDigits(output_dict=True), datamodule=DigitDicts())
    logged = logged_by_epoch(tmp_path / "metrics.csv")
    assert all(math.isfinite(value) for row in logged.values() for value in row.values())
    prefixes = {key.split("/")[0] for row in logged.values() for key in row}  # budget: not all every epoch
    assert {"dscore", "robustness", "hda", "metamorphic", "relevancy", "replay", "originals"} <= prefixes
    assert logged[1]["replay/rows"] > 0 and logged[1]["originals/rows"] > 0  # the first epoch's failures, fed back


def _bundle(tmp_path: Path) -> list:
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_top_k=-1, every_n_epochs=1)
    return [*closed_loop_callbacks(masks=lambda x: x[:, 0] > 0.3, preprocess=normalize, batch_keys=KEYS), checkpoints]


@pytest.mark.slow
def test_resumed_with_two_validation_loaders_it_trains_and_measures_what_an_uninterrupted_run_does(
    tmp_path: Path,
) -> None:
    """The eight callbacks share one bank, and the noise, the guides and the keeper each draw from their own
    generators: a run resumed after epoch 0 must replay, append and log what the whole run did, say nothing
    about its probe sets that the whole run did not, and end on the same weights, with two validation
    loaders cut short by ``limit_val_batches``."""
    data = {"val_splits": (300, 300)}
    whole_callbacks = _bundle(tmp_path / "whole")
    whole = quick_trainer(tmp_path / "whole", whole_callbacks, epochs=3, val_batches=4)
    whole_model = NormalizedDigits()
    with warnings.catch_warnings(record=True) as whole_said:
        warnings.simplefilter("always")
        whole.fit(whole_model, datamodule=DigitDicts(**data))
    first_epoch = next((tmp_path / "whole" / "checkpoints").glob("epoch=0*.ckpt"))
    callbacks = _bundle(tmp_path / "resumed")
    resumed = quick_trainer(tmp_path / "resumed", callbacks, epochs=3, val_batches=4)
    resumed_model = NormalizedDigits()
    with warnings.catch_warnings(record=True) as resumed_said:
        warnings.simplefilter("always")
        resumed.fit(resumed_model, datamodule=DigitDicts(**data), ckpt_path=first_epoch)
    expected = logged_by_epoch(tmp_path / "whole" / "metrics.csv")
    got = logged_by_epoch(tmp_path / "resumed" / "metrics.csv")
    assert got[1]["replay/rows"] > 0 and got[2]["originals/rows"] > 0  # fed back after the restart
    # the sets measured on after the restart are the whole run's: HDA's, found again, and D-Score's, drawn at
    # epoch 2 (the others measure at epoch 0 only: they save up their budget after it)
    measured = {}
    for before, after in zip(whole_callbacks, callbacks, strict=True):
        if isinstance(after, ProbeCallback) and after.probe_set() is not None:
            measured[type(after).__name__] = torch.equal(after.probe_set().all_keys, before.probe_set().all_keys)
    assert measured == {"DScoreCallback": True, "HDACallback": True}
    assert {"val_acc/dataloader_idx_0", "val_acc/dataloader_idx_1"} <= got[2].keys()
    assert sorted(got) == [1, 2]
    probe_notes = [
        {str(w.message) for w in said if "probe set" in str(w.message)} for said in (whole_said, resumed_said)
    ]
    assert probe_notes[1] <= probe_notes[0]  # the sets found again are the sets in use: nothing new to say
    for epoch in (1, 2):
        assert got[epoch] == expected[epoch], epoch
    weights, resumed_weights = whole_model.state_dict(), resumed_model.state_dict()
    assert all(torch.equal(weights[key], resumed_weights[key]) for key in weights)
