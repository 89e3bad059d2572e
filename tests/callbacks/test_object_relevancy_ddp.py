"""Under ``ddp_spawn`` on 2 CPU processes, ObjectRelevancyCallback (default arguments) reports what 1 process does."""

from __future__ import annotations

import csv
import pickle
from pathlib import Path

import pytest
from torch import Tensor, nn

from dlguard.callbacks import FailureReplay, ObjectRelevancyCallback
from dlguard.data import SceneDataModule
from dlguard.zoo import ClassifierModule, pretrained
from tests.callbacks.test_object_relevancy_callback import LOGGED
from tests.quick import quick_trainer, split_spent


def test_the_callback_pickles() -> None:
    replay = FailureReplay()
    copy = pickle.loads(pickle.dumps(ObjectRelevancyCallback(bank=replay.bank)))
    assert copy.probe_size == 256 and copy.bank is not None


class SceneDigits(nn.Module):
    """The shipped crop classifier on the scenes' central 28x28, its digit logits only: a model that has learnt.

    It gets about half the validation scenes right, above the default ``min_accuracy`` (0.40 for 10
    classes), so the callback measures it with default arguments; an untrained network would be refused.
    """

    def __init__(self) -> None:
        super().__init__()
        self.net = pretrained("scene_digits")

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x[:, :, 2:30, 2:30])[:, 1:]


def _run(tmp_path: Path, devices: int) -> dict[str, float]:
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    replay = FailureReplay()
    callback = ObjectRelevancyCallback(bank=replay.bank)  # default arguments: 256 scenes, masks at position 2
    trainer = quick_trainer(tmp_path, [callback, replay], val_batches=1.0, accelerator="cpu", devices=devices, **extra)
    module = ClassifierModule(SceneDigits())
    trainer.validate(module, datamodule=SceneDataModule(batch_size=250))
    with (tmp_path / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("relevancy/score")]
    assert len(rows) == 1
    return {key: float(value) for key, value in rows[0].items() if value and key.startswith("relevancy/")}


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_report_what_one_process_reports(tmp_path: Path) -> None:
    (single, spent_one), (double, spent_two) = (
        split_spent(_run(tmp_path / "one", 1)),
        split_spent(_run(tmp_path / "two", 2)),
    )
    assert set(single) | set(spent_one) == LOGGED
    for key, value in single.items():
        assert double[key] == pytest.approx(value, abs=1e-6), key
    # the second process sizes its own passes on one input
    assert spent_two["relevancy/forward_passes"] == spent_one["relevancy/forward_passes"] + 1
