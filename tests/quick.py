"""Shared test scaffolding: a small quiet Trainer, and running a function in two gloo processes."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch.loggers import CSVLogger


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(rank: int, world: int, port: int, fn: Callable[[int, int], Any], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world)
        if rank == 0:
            import torch

            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def run_on_two_processes(fn: Callable[[int, int], Any], tmp_path: Path) -> Any:
    """Run ``fn(rank, world)`` in two gloo processes (CPU) and return rank 0's result."""
    import torch

    out = tmp_path / "rank0.pt"
    mp.spawn(_run, args=(2, _free_port(), fn, str(out)), nprocs=2, join=True)
    return torch.load(out, weights_only=False)
