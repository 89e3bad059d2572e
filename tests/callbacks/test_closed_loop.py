"""closed_loop_callbacks: the anchored arm's callbacks, in a user's dict-batch project with a normalising network."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dlguard.callbacks import (
    FailureReplay,
    GaussianNoise,
    KeepOriginals,
    ObjectRelevancyCallback,
    RobustnessCallback,
    closed_loop_callbacks,
)
from tests.callbacks.projects import DigitDicts, NormalizedDigits, normalize
from tests.quick import logged_by_epoch, quick_trainer


def names(callbacks: list) -> list[str]:
    return [type(callback).__name__ for callback in callbacks]


def test_without_masks_or_noise_those_callbacks_are_left_out_and_the_rest_keep_their_order() -> None:
    full = names(closed_loop_callbacks(masks=2))
    assert names(closed_loop_callbacks()) == [n for n in full if n != "ObjectRelevancyCallback"]
    assert names(closed_loop_callbacks(masks=2, max_sigma=None)) == full[1:] and full[0] == "GaussianNoise"


def test_every_callback_gets_the_project_s_settings() -> None:
    keys, seed = ("image", "label"), 7
    callbacks = closed_loop_callbacks(masks="mask", preprocess=normalize, batch_keys=keys, seed=seed, max_sigma=0.1)
    assert callbacks[0].max_sigma == 0.1 and all(c.batch_keys == keys for c in callbacks)
    probes = [c for c in callbacks if not isinstance(c, GaussianNoise | FailureReplay | KeepOriginals)]
    assert len(probes) == 5 and all(c.preprocess is normalize and c.seed == seed for c in probes)
    assert next(c for c in callbacks if isinstance(c, ObjectRelevancyCallback)).masks == "mask"
    assert next(c for c in callbacks if isinstance(c, RobustnessCallback)).guide.strength == 0.125


@pytest.mark.parametrize(
    ("options", "message"),
    [({"max_sigma": -1.0}, "max_sigma: expected a non-negative"), ({"masks": [1]}, "masks: expected a batch key")],
)
def test_bad_arguments_are_named(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        closed_loop_callbacks(**options)


@pytest.mark.slow
def test_a_fit_of_a_user_s_project_logs_finite_numbers_and_feeds_failures_back(tmp_path: Path) -> None:
    callbacks = closed_loop_callbacks(
        masks=lambda x: x[:, 0] > 0.3, preprocess=normalize, output_transform=lambda out: out["logits"],
        batch_keys=("image", "label"),
    )  # fmt: skip
    trainer = quick_trainer(tmp_path, callbacks, epochs=3, train_batches=3, val_batches=20)
    trainer.fit(NormalizedDigits(output_dict=True), datamodule=DigitDicts())
    logged = logged_by_epoch(tmp_path / "metrics.csv")
    assert all(math.isfinite(value) for row in logged.values() for value in row.values())
    prefixes = {key.split("/")[0] for row in logged.values() for key in row}  # budget: not all every epoch
    assert {"dscore", "robustness", "hda", "metamorphic", "relevancy", "replay", "originals"} <= prefixes
    assert logged[1]["replay/rows"] > 0 and logged[1]["originals/rows"] > 0  # the first epoch's failures, fed back
