"""Sending figures to Weights & Biases when attached, to PNG files otherwise (SPEC §7)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import matplotlib.pyplot as plt
from lightning.pytorch.loggers import WandbLogger
from matplotlib.figure import Figure

__all__ = ["find_wandb_logger", "log_figure"]


def find_wandb_logger(trainer: L.Trainer) -> WandbLogger | None:
    """The trainer's :class:`~lightning.pytorch.loggers.WandbLogger`, if one is attached."""
    return next((lg for lg in trainer.loggers if isinstance(lg, WandbLogger)), None)


def log_figure(
    trainer: L.Trainer,
    key: str,
    figure: Figure,
    directory: str | Path,
    *,
    always_save: bool = False,
) -> Path | None:
    """On rank zero, send ``figure`` to W&B under ``key`` or write ``directory/<key>.png``.

    Args:
        trainer: supplies the loggers, the rank and the global step.
        key: W&B key, also the file name (``/`` becomes ``_``).
        figure: closed after logging.
        directory: where the PNG goes.
        always_save: write the PNG even when W&B receives the figure.

    Returns:
        The PNG's path when one was written, else ``None``.
    """
    path = None
    try:
        if not trainer.is_global_zero:
            return None
        wandb_logger = find_wandb_logger(trainer)
        if wandb_logger is None or always_save:
            path = Path(directory) / f"{key.replace('/', '_')}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(path, dpi=120, bbox_inches="tight")
        if wandb_logger is not None:
            import wandb

            wandb_logger.experiment.log({key: wandb.Image(figure), "trainer/global_step": trainer.global_step})
        return path
    finally:
        plt.close(figure)
