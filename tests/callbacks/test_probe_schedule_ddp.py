"""Under ``ddp_spawn`` on 2 CPU processes, a probe set short of a class is measured and refilled as with 1."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import tests.callbacks.test_probe_schedule as schedule
from dlguard.augment import ErrorGuidedAugmentation
from dlguard.callbacks import RobustnessCallback
from dlguard.data import MNISTDataModule
from tests.quick import logged_by_epoch, quick_trainer, split_spent


def _run(root: Path, devices: int) -> tuple[dict[int, dict[str, float]], RobustnessCallback]:
    robustness = RobustnessCallback(per_class=4, budget=None, guide=ErrorGuidedAugmentation())
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    trainer = quick_trainer(root, [robustness], epochs=2, train_batches=1, val_batches=1.0, devices=devices, **extra)
    module = schedule.LearnsAtEpoch(never=3, never_before=1)  # class 3 is learnt at training epoch 1
    module.hparams.lr = 1e-12  # the step leaves the weights as they are: both runs measure the same model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=MNISTDataModule(batch_size=250))
    return logged_by_epoch(root / "metrics.csv"), robustness


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_measure_and_refill_a_short_set_as_one_process_does(tmp_path: Path) -> None:
    (single, callback), (double, _) = _run(tmp_path / "one", 1), _run(tmp_path / "two", 2)
    # one process: measured at epoch 0 without class 3, refilled with it at epoch 1 (the set changed)
    assert [r.get("short_classes") for r in callback.history] == [{3: "0 of 2"}, None]
    assert [r["class_counts"].get(3, 0) for r in callback.history] == [0, 4]
    assert sorted(single) == sorted(double) == [0, 1]
    for epoch in (0, 1):
        one, two = split_spent(single[epoch])[0], split_spent(double[epoch])[0]
        assert one and two == pytest.approx(one, abs=1e-9), epoch  # every rank took the same decisions
    assert split_spent(single[0])[0] != split_spent(single[1])[0]  # the refilled set measures differently
