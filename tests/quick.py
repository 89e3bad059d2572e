"""Shared test scaffolding: a small quiet Trainer, and running a function in two gloo processes."""

from __future__ import annotations

import csv
import faulthandler
import os
import sys
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor


def quick_trainer(
    tmp_path: Path,
    callbacks: list[L.Callback],
    epochs: int = 1,
    train_batches: int = 4,
    val_batches: int = 3,
    **kwargs: Any,
) -> L.Trainer:
    """A seeded, quiet Trainer on a few batches, logging CSV into ``tmp_path``."""
    L.seed_everything(0, verbose=False)
    settings: dict[str, Any] = {
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": any(isinstance(c, L.pytorch.callbacks.ModelCheckpoint) for c in callbacks),
        "logger": CSVLogger(tmp_path, name="", version=""),
        "default_root_dir": tmp_path,
    }
    return L.Trainer(
        max_epochs=epochs,
        limit_train_batches=train_batches,
        limit_val_batches=val_batches,
        callbacks=callbacks,
        **(settings | kwargs),
    )


def mnist_validation(count: int) -> tuple[Tensor, Tensor]:
    """The first ``count`` digits of the embedded MNIST validation set: images ``(count, 1, 28, 28)``, labels."""
    from dlguard.data import MNISTDataModule

    data = MNISTDataModule()
    data.setup()
    images = torch.stack([data.val_set[i][0] for i in range(count)])
    return images, torch.tensor([data.val_set[i][1] for i in range(count)])


_WORKER_TIMEOUT_S = 120


def _run(rank: int, world: int, store: str, fn: Callable[[int, int], Any], out: str) -> None:
    # a stuck worker prints where it is stuck and exits, so mp.spawn fails instead of waiting forever
    faulthandler.dump_traceback_later(_WORKER_TIMEOUT_S, exit=True)
    # a file rendezvous: no TCP port to race for with other processes of the test run
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    result = fn(rank, world)
    if rank == 0:
        import torch

        torch.save(result, out)
    # both ranks leave together, then exit at once: destroy_process_group itself can hang in gloo
    # (torch 2.5.1 did, once in CI, after the barrier), and the OS frees the group's sockets anyway
    dist.barrier()
    faulthandler.cancel_dump_traceback_later()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_on_two_processes(fn: Callable[[int, int], Any], tmp_path: Path) -> Any:
    """Run ``fn(rank, world)`` in two gloo processes (CPU) and return rank 0's result."""
    import torch

    out = tmp_path / "rank0.pt"
    store = Path(tempfile.mkdtemp(prefix="rendezvous-", dir=tmp_path)) / "store"  # fresh per call
    mp.spawn(_run, args=(2, store, fn, str(out)), nprocs=2, join=True)
    return torch.load(out, weights_only=False)


def logged_by_epoch(path: Path) -> dict[int, dict[str, float]]:
    """``{epoch: {key: value}}`` of the ``<prefix>/<name>`` figures a CSVLogger wrote to ``path`` (metrics.csv)."""
    by_epoch: dict[int, dict[str, float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            figures = {key: float(value) for key, value in row.items() if value and "/" in key}
            if figures:
                by_epoch.setdefault(int(row["epoch"]), {}).update(figures)
    return by_epoch


def split_spent(logged: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """``(measured numbers, {key: value} of <prefix>/forward_passes)`` of a callback's logged row.

    Forward passes are a cost, counted over every process: N processes each run the one-input checks
    (the logits' width, a pass size), so they add a few passes; every measured number is the same.
    """
    spent = {key: value for key, value in logged.items() if key.endswith("/forward_passes")}
    return {key: value for key, value in logged.items() if key not in spent}, spent
