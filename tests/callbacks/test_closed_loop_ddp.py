"""Under ``ddp_spawn`` on 2 CPU processes, closed_loop_callbacks at its defaults measures what 1 process measures."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest

from dlguard.callbacks import closed_loop_callbacks
from dlguard.data import SceneDataModule
from dlguard.zoo import ClassifierModule
from tests.callbacks.test_object_relevancy_ddp import SceneDigits
from tests.quick import logged_by_epoch, quick_trainer, split_spent

# each process trains its own batch into its own bank (capacity per origin and process): the rows fed back and
# the failures held are summed over processes, not what one process reports
FED_BACK = ("replay/", "originals/")


def test_the_bundle_pickles() -> None:
    """ddp_spawn pickles the callbacks; the copies must still share one bank, the replay's."""
    copies = pickle.loads(pickle.dumps(closed_loop_callbacks(masks=2)))
    replay = copies[-2]
    assert len(copies) == 8 and sum(getattr(c, "bank", None) is replay.bank for c in copies) == 5


def _run(tmp_path: Path, devices: int) -> dict[int, dict[str, float]]:
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    trainer = quick_trainer(
        tmp_path, closed_loop_callbacks(masks=2), epochs=2, train_batches=1, val_batches=1.0,
        accelerator="cpu", devices=devices, **extra,
    )  # fmt: skip
    # lr 1e-12: the weights stay the shipped scene reader's, so both runs measure one model on the same
    # 1,000 validation scenes (500 per process under DDP), whatever the noise and the loops train on
    trainer.fit(ClassifierModule(SceneDigits(), lr=1e-12), datamodule=SceneDataModule(batch_size=250))
    return logged_by_epoch(tmp_path / "metrics.csv")


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_measure_what_one_process_measures(tmp_path: Path) -> None:
    single_epochs, double_epochs = _run(tmp_path / "one", 1), _run(tmp_path / "two", 2)
    assert sorted(single_epochs) == sorted(double_epochs) == [0, 1]
    measured = set()
    for epoch in (0, 1):
        single, spent_one = split_spent({k: v for k, v in single_epochs[epoch].items() if not k.startswith(FED_BACK)})
        double, spent_two = split_spent({k: v for k, v in double_epochs[epoch].items() if not k.startswith(FED_BACK)})
        assert single.keys() == double.keys() and spent_one.keys() == spent_two.keys(), epoch
        for key, value in single.items():
            assert double[key] == pytest.approx(value, abs=1e-6), (epoch, key)
        # the budget cut both runs' sets alike; the second process adds its own one-input checks (HDA's search
        # a few more: tests/callbacks/test_hda_ddp.py)
        most = {"hda/forward_passes": 8}
        assert all(0 <= spent_two[k] - spent_one[k] <= most.get(k, 2) for k in spent_one), (spent_one, spent_two)
        measured |= {key.split("/")[0] for key in single}
        assert all(math.isfinite(v) for v in double_epochs[epoch].values())
    # D-Score starts at epoch 2: tests/callbacks/test_dscore_ddp.py holds it to 1 process's numbers
    assert {"robustness", "hda", "metamorphic", "relevancy"} <= measured
    for epochs in (single_epochs, double_epochs):  # fed back in both runs
        assert epochs[1]["replay/rows"] > 0 and epochs[1]["originals/rows"] > 0
    assert double_epochs[1]["replay/failures"] >= single_epochs[1]["replay/failures"]  # two banks, summed
