"""Reporting: error summaries, matplotlib figures and W&B helpers (PNG files when W&B is absent)."""

from dlguard.report.errors import ErrorSummary, summarize_errors
from dlguard.report.figures import plot_training_curves
from dlguard.report.logging import find_wandb_logger, log_figure, log_wandb_bars
from dlguard.utilities.plot import (
    plot_coverage_by_layer,
    plot_dscore_heatmaps,
    plot_image_grid,
    plot_robustness_curves,
)

__all__ = [
    "ErrorSummary",
    "find_wandb_logger",
    "log_figure",
    "log_wandb_bars",
    "plot_coverage_by_layer",
    "plot_dscore_heatmaps",
    "plot_image_grid",
    "plot_robustness_curves",
    "plot_training_curves",
    "summarize_errors",
]
