from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt

from dlguard.report import log_figure, plot_training_curves


def fake_trainer(rank_zero: bool) -> SimpleNamespace:
    return SimpleNamespace(loggers=[], is_global_zero=rank_zero, global_step=0)


def test_without_wandb_the_figure_becomes_a_png(tmp_path: Path) -> None:
    figure = plot_training_curves([{"epoch": 0, "val_loss": 1.0}, {"epoch": 1, "val_loss": 0.5}])
    path = log_figure(fake_trainer(True), "dscore/heatmap", figure, tmp_path)
    assert path == tmp_path / "dscore_heatmap.png"
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert not plt.fignum_exists(figure.number)  # closed


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    figure = plot_training_curves([{"epoch": 0, "val_acc": 0.5}])
    assert log_figure(fake_trainer(False), "curves", figure, tmp_path) is None
    assert not list(tmp_path.iterdir())
    assert not plt.fignum_exists(figure.number)


def test_training_curves_use_distinct_colours() -> None:
    figure = plot_training_curves([{"epoch": e, "train_loss": 1 / (e + 1), "val_acc": e / 3} for e in range(3)])
    lines = [line for ax in figure.axes for line in ax.get_lines()]
    assert len({line.get_color() for line in lines}) == len(lines) == 2
    plt.close(figure)
