from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from dlguard.metrics import DScore
from tests.metrics.test_dscore import random_logits
from tests.quick import quick_trainer, run_on_two_processes


def _shard_result(rank: int, world: int) -> dict:
    baseline, mutants, translated, target = random_logits(0)
    metric = DScore(n=3, num_classes=5)
    shard = slice(rank, None, world)  # each rank its own shard, uneven sizes
    metric.update(baseline[shard], mutants[:, shard], translated[:, shard], target[shard])
    result = metric.compute()
    return {"result": result._asdict(), "total": metric.total, "baseline_correct": metric.baseline_correct}


@pytest.mark.ddp
def test_two_processes_equal_one(tmp_path: Path) -> None:
    reduced = run_on_two_processes(_shard_result, tmp_path)
    single = DScore(n=3, num_classes=5)
    single.update(*random_logits(0))
    expected = single.compute()
    assert int(reduced["total"]) == 20  # compute() syncs, then restores each rank's own shard
    for name, value in expected._asdict().items():
        torch.testing.assert_close(reduced["result"][name], value)
    # the result keeps the accuracies over both shards, which the restored states no longer hold
    baseline, mutants, _, target = random_logits(0)
    correct = baseline.argmax(1) == target
    assert int(reduced["baseline_correct"]) == int(correct[0::2].sum())
    assert float(reduced["result"]["baseline_accuracy"]) == pytest.approx(float(correct.double().mean()))
    assert float(reduced["result"]["baseline_accuracy"]) != pytest.approx(int(correct[0::2].sum()) / 20)
    expected_deletion = [float((m.argmax(1) == target).double().mean()) for m in mutants]
    assert reduced["result"]["deletion_accuracy"].tolist() == pytest.approx(expected_deletion)


@pytest.mark.ddp
@pytest.mark.slow
def test_callback_under_ddp_spawn(tmp_path: Path) -> None:
    from dlguard.callbacks import DScoreCallback  # imported here: the metric tests above need no callback
    from dlguard.data import MNISTDataModule
    from dlguard.zoo import ClassifierModule, pretrained

    trainer = quick_trainer(
        tmp_path,
        [DScoreCallback(n=2, probe_size=64)],
        val_batches=4,
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
    )
    trainer.fit(ClassifierModule(pretrained("mnist_a").train()), datamodule=MNISTDataModule(batch_size=32))
    with (tmp_path / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("dscore/d_score")]
    assert len(rows) == 1
    baseline = float(rows[0]["dscore/baseline_acc"])
    assert 0.8 < baseline <= 1.0 and (baseline * 64) == pytest.approx(round(baseline * 64), abs=1e-4)  # 2 x 32 probes
    assert float(rows[0]["dscore/d_score"]) == pytest.approx(
        float(rows[0]["dscore/v_fitness"]) - float(rows[0]["dscore/v_robust"]), abs=1e-5
    )
    assert len(list((tmp_path / "dscore").glob("*.png"))) == 1  # rank zero only
