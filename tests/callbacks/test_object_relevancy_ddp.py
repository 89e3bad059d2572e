"""Under ``ddp_spawn`` on 2 CPU processes, ObjectRelevancyCallback (default arguments) reports what 1 process does."""

from __future__ import annotations

import csv
import pickle
from pathlib import Path

import pytest
import torch

from dlguard.callbacks import FailureReplay, ObjectRelevancyCallback
from dlguard.data import SceneDataModule
from dlguard.zoo import ClassifierModule, mnist_b
from tests.callbacks.test_object_relevancy_callback import LOGGED
from tests.quick import quick_trainer


def test_the_callback_pickles() -> None:
    replay = FailureReplay()
    copy = pickle.loads(pickle.dumps(ObjectRelevancyCallback(bank=replay.bank)))
    assert copy.probe_size == 256 and copy.bank is not None


def _run(tmp_path: Path, devices: int) -> dict[str, float]:
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    replay = FailureReplay()
    callback = ObjectRelevancyCallback(bank=replay.bank)  # default arguments: 256 scenes, masks at position 2
    trainer = quick_trainer(tmp_path, [callback, replay], val_batches=1.0, accelerator="cpu", devices=devices, **extra)
    torch.manual_seed(0)
    module = ClassifierModule(mnist_b(in_channels=3, input_size=32))
    trainer.validate(module, datamodule=SceneDataModule(batch_size=250))
    with (tmp_path / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("relevancy/score")]
    assert len(rows) == 1
    return {key: float(value) for key, value in rows[0].items() if value and key.startswith("relevancy/")}


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_report_what_one_process_reports(tmp_path: Path) -> None:
    single, double = _run(tmp_path / "one", 1), _run(tmp_path / "two", 2)
    assert set(single) == LOGGED
    for key, value in single.items():
        assert double[key] == pytest.approx(value, abs=1e-6), key
