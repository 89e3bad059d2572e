"""Sending figures to Weights & Biases when attached, to PNG files otherwise (SPEC §7)."""

from __future__ import annotations

import io
import sys
from collections.abc import Mapping
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from matplotlib.figure import Figure, SubFigure

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

    The figure is rendered by ``figure.savefig`` alone: no pyplot, no backend. dlguard's figures
    are plain :class:`~matplotlib.figure.Figure` objects that need no closing; a figure made with
    pyplot is closed after logging (when pyplot is loaded at all).

    Args:
        trainer: supplies the loggers, the rank and the global step.
        key: W&B key, also the file name (``/`` becomes ``_``).
        figure: the figure to log.
        directory: where the PNG goes.
        always_save: write the PNG even when W&B receives the figure.

    Returns:
        The PNG's path when one was written, else ``None``.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"key: expected a non-empty string, got {key!r}")
    if not isinstance(figure, Figure | SubFigure):
        raise ValueError(f"figure: expected a matplotlib Figure, got {type(figure).__name__}")
    figure = figure.get_figure(root=True) if isinstance(figure, SubFigure) else figure
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
            from PIL import Image

            # rendered here: wandb.Image(figure) reaches for matplotlib.pyplot, which may not be loaded
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
            buffer.seek(0)
            image = wandb.Image(Image.open(buffer))
            wandb_logger.experiment.log({key: image, "trainer/global_step": trainer.global_step})
        return path
    finally:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:  # a no-op for figures pyplot does not manage, such as dlguard's
            pyplot.close(figure)


def log_wandb_bars(trainer: L.Trainer, key: str, values: Mapping[str, float], title: str) -> bool:
    """On rank zero, log ``{label: value}`` as a native W&B bar chart (drawn by W&B, not here).

    Returns:
        Whether a ``WandbLogger`` was attached (on every rank), so callers know to fall back to files.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"key: expected a non-empty string, got {key!r}")
    if not isinstance(values, Mapping):
        raise ValueError(f"values: expected {{label: value}}, got {type(values).__name__}")
    wandb_logger = find_wandb_logger(trainer)
    if wandb_logger is None:
        return False
    if trainer.is_global_zero:
        import wandb

        table = wandb.Table(data=[[label, float(value)] for label, value in values.items()], columns=["layer", "value"])
        chart = wandb.plot.bar(table, "layer", "value", title=title)
        wandb_logger.experiment.log({key: chart, "trainer/global_step": trainer.global_step})
    return True
