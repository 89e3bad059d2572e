"""Under ``ddp_spawn`` on 2 CPU processes, every callback with default arguments reports what 1 process reports."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from dlguard.augment import ErrorGuidedAugmentation, ScoreGuidedPadding
from dlguard.callbacks import DScoreCallback, FailureReplay, NeuronCoverageCallback, RobustnessCallback
from dlguard.data import MNISTDataModule
from dlguard.metrics.functional import digit_sum
from dlguard.zoo import ClassifierModule, pretrained
from tests.quick import logged_by_epoch, quick_trainer, split_spent


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


def _run(tmp_path: Path, devices: int) -> tuple[dict[int, dict[str, float]], Path]:
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    trainer = quick_trainer(
        tmp_path,
        default_callbacks(),
        epochs=3,
        train_batches=1,
        val_batches=1.0,
        accelerator="cpu",
        devices=devices,
        **extra,
    )
    # lr 1e-12: the training step leaves the weights as they are, so both runs measure the same model on
    # the same 1,000 validation digits (500 per process under DDP)
    trainer.fit(ClassifierModule(pretrained("mnist_a"), lr=1e-12), datamodule=MNISTDataModule(batch_size=250))
    return logged_by_epoch(tmp_path / "metrics.csv"), tmp_path


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_report_what_one_process_reports(tmp_path: Path) -> None:
    (single_epochs, one), (double_epochs, two) = _run(tmp_path / "one", 1), _run(tmp_path / "two", 2)
    # the default budget, 150 passes of the 1,000 digits, is below the smallest sets: D-Score's 306 passes are
    # paid by epochs 0-1 and measured again at 2, robustness's 752 only at 0 -- alike in both runs
    for epochs in (single_epochs, double_epochs):
        assert [e for e, row in sorted(epochs.items()) if "dscore/d_score" in row] == [0, 2]
        assert [e for e, row in sorted(epochs.items()) if "robustness/rotation" in row] == [0]
    assert sorted(single_epochs) == sorted(double_epochs)
    for epoch in sorted(single_epochs):
        (single, spent_one), (double, spent_two) = split_spent(single_epochs[epoch]), split_spent(double_epochs[epoch])
        assert double == pytest.approx(single, abs=1e-9), epoch
        # the budget cut both runs' sets alike; the second process adds its two one-input checks per callback
        assert spent_two == {key: value + 2 for key, value in spent_one.items()}, epoch
    single = split_spent(single_epochs[0])[0]
    prefixes = ("dscore/", "robustness/", "global_robustness/", "coverage/", "replay/")  # replay: summed over ranks
    assert {key.split("/")[0] + "/" for key in single} == set(prefixes)
    assert set(split_spent(single_epochs[0])[1]) == {"dscore/forward_passes", "robustness/forward_passes"}
    summaries = [json.loads((run / "robustness" / "error_summary.json").read_text()) for run in (one, two)]
    assert summaries[0] == summaries[1]
    # the end-of-run figures are drawn from the same global numbers on rank zero only
    for figure in ("dscore/dscore_distributions.png", "robustness/robustness_curves.png"):
        assert (one / figure).read_bytes() == (two / figure).read_bytes(), figure
