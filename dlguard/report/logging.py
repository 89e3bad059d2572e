"""Sending figures to Weights & Biases when attached, to PNG files otherwise (SPEC §7)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import lightning as L
import matplotlib.pyplot as plt
from lightning.pytorch.loggers import WandbLogger
from matplotlib.figure import Figure

__all__ = ["find_wandb_logger", "log_figure", "log_wandb_bars"]


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


def log_wandb_bars(trainer: L.Trainer, key: str, values: Mapping[str, float], title: str) -> bool:
    """On rank zero, log ``{label: value}`` as a native W&B bar chart (drawn by W&B, not here).

    Returns:
        Whether a ``WandbLogger`` was attached (on every rank), so callers know to fall back to files.
    """
    wandb_logger = find_wandb_logger(trainer)
    if wandb_logger is None:
        return False
    if trainer.is_global_zero:
        import wandb

        table = wandb.Table(data=[[label, float(value)] for label, value in values.items()], columns=["layer", "value"])
        chart = wandb.plot.bar(table, "layer", "value", title=title)
        wandb_logger.experiment.log({key: chart, "trainer/global_step": trainer.global_step})
    return True
