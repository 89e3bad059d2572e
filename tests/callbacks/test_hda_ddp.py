"""Under ``ddp_spawn`` on 2 CPU processes, HDACallback with default arguments reports what 1 process reports."""

from __future__ import annotations

import csv
import math
import pickle
from pathlib import Path

import pytest
import torch

from dlguard.callbacks import FailureReplay, HDACallback
from dlguard.data import MNISTDataModule
from dlguard.generate import VAEDistribution
from dlguard.zoo import ClassifierModule, pretrained
from tests.callbacks.test_hda_callback import LOGGED
from tests.quick import quick_trainer, split_spent


def _distribution() -> VAEDistribution:
    data = MNISTDataModule()
    data.setup()
    return VAEDistribution(pretrained("vae_mnist")).fit(torch.stack([data.train_set[i][0] for i in range(1000)]))


def test_the_callback_pickles() -> None:
    """ddp_spawn pickles the trainer's callbacks (and so the fitted distribution) into its workers."""
    replay = FailureReplay()
    copy = pickle.loads(pickle.dumps(HDACallback(distribution=_distribution(), bank=replay.bank)))
    assert copy.distribution.is_fitted and copy.k == 10 and copy.ga["population"] == 100


def _run(tmp_path: Path, devices: int) -> dict[str, float]:
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    replay = FailureReplay()
    # default arguments: k 10, N 100, T 30, and a PCA distribution each process fits on the same training inputs
    callback = HDACallback(bank=replay.bank)
    trainer = quick_trainer(tmp_path, [callback, replay], val_batches=1.0, accelerator="cpu", devices=devices, **extra)
    # validate(): no training step, so both runs measure the same weights on the same 1,000 validation digits
    trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=250))
    with (tmp_path / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("hda/ae_proportion")]
    assert len(rows) == 1
    return {key: float(value) for key, value in rows[0].items() if value and key.startswith("hda/")}


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_report_what_one_process_reports(tmp_path: Path) -> None:
    (single, spent_one), (double, spent_two) = (
        split_spent(_run(tmp_path / "one", 1)),
        split_spent(_run(tmp_path / "two", 2)),
    )
    assert {"hda/ae_proportion", "hda/seed_density"} <= set(single) <= LOGGED
    assert single.keys() == double.keys() and all(math.isfinite(value) for value in single.values())
    for key, value in single.items():
        assert double[key] == pytest.approx(value, abs=1e-6), key
    # the same search; the second process adds its one-input checks (the logits' width, a pass size)
    assert 0 <= spent_two["hda/forward_passes"] - spent_one["hda/forward_passes"] <= 8
