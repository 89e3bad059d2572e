from __future__ import annotations

import csv
import os
import socket
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch.loggers import CSVLogger

from dlguard.callbacks import DScoreCallback
from dlguard.data import MNISTDataModule
from dlguard.metrics import DScore
from dlguard.zoo import ClassifierModule, pretrained
from tests.metrics.test_dscore import random_logits


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        baseline, mutants, translated, target = random_logits(0)
        metric = DScore(n=3, num_classes=5)
        shard = slice(rank, None, world)  # each rank its own shard, uneven sizes
        metric.update(baseline[shard], mutants[:, shard], translated[:, shard], target[shard])
        result = metric.compute()
        if rank == 0:
            torch.save({"result": result._asdict(), "total": metric.total}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_two_processes_equal_one(tmp_path: Path) -> None:
    out = tmp_path / "rank0.pt"
    mp.spawn(_worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    reduced = torch.load(out, weights_only=False)
    single = DScore(n=3, num_classes=5)
    single.update(*random_logits(0))
    expected = single.compute()
    assert int(reduced["total"]) == 20  # compute() syncs, then restores each rank's own shard
    for name, value in expected._asdict().items():
        torch.testing.assert_close(reduced["result"][name], value)


@pytest.mark.ddp
@pytest.mark.slow
def test_callback_under_ddp_spawn(tmp_path: Path) -> None:
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        limit_train_batches=4,
        limit_val_batches=4,
        callbacks=[DScoreCallback(n=2, probe_size=64)],
        logger=CSVLogger(tmp_path, name="", version=""),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
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
