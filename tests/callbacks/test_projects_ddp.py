"""Under ``ddp_spawn`` on 2 CPU processes, every callback with default arguments reports what 1 process reports."""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import pytest

from dlguard.augment import ErrorGuidedAugmentation, ScoreGuidedPadding
from dlguard.callbacks import DScoreCallback, FailureReplay, NeuronCoverageCallback, RobustnessCallback
from dlguard.data import MNISTDataModule
from dlguard.metrics.functional import digit_sum
from dlguard.zoo import ClassifierModule, pretrained
from tests.quick import quick_trainer, split_spent


def default_callbacks() -> list:
    replay = FailureReplay()
    return [
        DScoreCallback(guide=ScoreGuidedPadding()),
        RobustnessCallback(combine=digit_sum, guide=ErrorGuidedAugmentation(), bank=replay.bank),
        NeuronCoverageCallback(),
        replay,
    ]


def test_every_default_callback_pickles() -> None:
    """ddp_spawn pickles the trainer's callbacks into its worker processes."""
    for callback in default_callbacks():
        copy = pickle.loads(pickle.dumps(callback))
        assert type(copy) is type(callback)


def _run(tmp_path: Path, devices: int) -> tuple[dict[str, float], Path]:
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    trainer = quick_trainer(
        tmp_path, default_callbacks(), train_batches=1, val_batches=1.0, accelerator="cpu", devices=devices, **extra
    )
    # lr 1e-12: the training step leaves the weights as they are, so both runs measure the same model on
    # the same 1,000 validation digits (500 per process under DDP)
    trainer.fit(ClassifierModule(pretrained("mnist_a"), lr=1e-12), datamodule=MNISTDataModule(batch_size=250))
    with (tmp_path / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("dscore/d_score")]
    assert len(rows) == 1
    return {key: float(value) for key, value in rows[0].items() if value and "/" in key}, tmp_path


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_report_what_one_process_reports(tmp_path: Path) -> None:
    (single, one), (double, two) = _run(tmp_path / "one", 1), _run(tmp_path / "two", 2)
    (single, spent_one), (double, spent_two) = split_spent(single), split_spent(double)
    prefixes = ("dscore/", "robustness/", "global_robustness/", "coverage/")
    assert {key.split("/")[0] + "/" for key in single} == set(prefixes)
    assert double == pytest.approx(single, abs=1e-9)
    # the budget cut both runs' sets alike; the second process adds its two one-input checks per callback
    assert spent_two == {key: value + 2 for key, value in spent_one.items()}
    assert set(spent_one) == {"dscore/forward_passes", "robustness/forward_passes"}
    summaries = [json.loads((run / "robustness" / "error_summary.json").read_text()) for run in (one, two)]
    assert summaries[0] == summaries[1]
    # the end-of-run figures are drawn from the same global numbers on rank zero only
    for figure in ("dscore/dscore_distributions.png", "robustness/robustness_curves.png"):
        assert (one / figure).read_bytes() == (two / figure).read_bytes(), figure
