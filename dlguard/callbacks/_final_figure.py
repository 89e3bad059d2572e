"""A callback base whose figure goes to W&B each epoch, or to one PNG when the run ends."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from matplotlib.figure import Figure

from dlguard.report.logging import find_wandb_logger, log_figure


class _FinalFigureCallback(Callback, ABC):
    """Without W&B, write the latest figure once, when ``fit`` or a lone ``validate`` ends.

    A PNG per epoch would only overwrite itself, and rendering one costs tens of milliseconds.
    Subclasses return ``(key, figure)`` from :meth:`_final_figure`, or ``None`` before any result.
    """

    @abstractmethod
    def _final_figure(self) -> tuple[str, Figure] | None:
        """``(key, figure)`` of the latest result, or ``None`` before any."""

    def _write_final_figure(self, trainer: L.Trainer) -> None:
        if find_wandb_logger(trainer) is not None:
            return
        drawn = self._final_figure()
        if drawn is not None:
            key, figure = drawn
            log_figure(trainer, key, figure, Path(trainer.log_dir or trainer.default_root_dir) / key.split("/")[0])

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_final_figure(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn != "fit":  # trainer.validate(): the run ends here
            self._write_final_figure(trainer)
