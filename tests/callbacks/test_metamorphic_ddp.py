"""Under ``ddp_spawn`` on 2 CPU processes, MetamorphicCallback (default arguments) reports what 1 process does."""

from __future__ import annotations

import csv
import pickle
from pathlib import Path

import pytest

from dlguard.callbacks import FailureReplay, MetamorphicCallback
from dlguard.data import MNISTDataModule
from dlguard.zoo import ClassifierModule, pretrained
from tests.quick import quick_trainer, split_spent


def test_the_callback_pickles() -> None:
    replay = FailureReplay()
    copy = pickle.loads(pickle.dumps(MetamorphicCallback(bank=replay.bank)))
    assert copy.probe_size == 256 and copy.bank is not None and len(copy.properties) == 9


def _run(tmp_path: Path, devices: int) -> dict[str, float]:
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    replay = FailureReplay()
    callback = MetamorphicCallback(bank=replay.bank)  # default arguments: 9 label-preserving properties, 256 inputs
    trainer = quick_trainer(tmp_path, [callback, replay], val_batches=1.0, accelerator="cpu", devices=devices, **extra)
    trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=250))
    with (tmp_path / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("metamorphic/violation_rate")]
    assert len(rows) == 1
    return {key: float(value) for key, value in rows[0].items() if value and key.startswith("metamorphic/")}


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_report_what_one_process_reports(tmp_path: Path) -> None:
    (single, spent_one), (double, spent_two) = (
        split_spent(_run(tmp_path / "one", 1)),
        split_spent(_run(tmp_path / "two", 2)),
    )
    assert len(single) == 10 and 0 < single["metamorphic/violation_rate"] < 1
    for key, value in single.items():
        assert double[key] == pytest.approx(value, abs=1e-6), key
    # the second process sizes its passes with one input, as the first does: 1 pass more
    assert spent_two["metamorphic/forward_passes"] == spent_one["metamorphic/forward_passes"] + 1
