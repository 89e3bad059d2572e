from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import pytest
from lightning.pytorch.loggers import WandbLogger

from dlguard.report import log_figure, plot_training_curves


def fake_trainer(rank_zero: bool, loggers: list | None = None) -> SimpleNamespace:
    return SimpleNamespace(loggers=loggers or [], is_global_zero=rank_zero, global_step=7)


class RecordingWandbLogger(WandbLogger):
    """A WandbLogger whose experiment only records what it is given (no run, no network)."""

    def __init__(self) -> None:  # deliberately no super().__init__(): nothing to start
        self.logged: list[dict] = []

    @property
    def experiment(self) -> SimpleNamespace:
        return SimpleNamespace(log=self.logged.append)


def test_without_wandb_the_figure_becomes_a_png(tmp_path: Path) -> None:
    figures_before = plt.get_fignums()
    figure = plot_training_curves([{"epoch": 0, "val_loss": 1.0}, {"epoch": 1, "val_loss": 0.5}])
    assert plt.get_fignums() == figures_before  # built without pyplot: nothing to close
    path = log_figure(fake_trainer(True), "dscore/heatmap", figure, tmp_path)
    assert path == tmp_path / "dscore_heatmap.png"
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    figure = plot_training_curves([{"epoch": 0, "val_acc": 0.5}])
    assert log_figure(fake_trainer(False), "curves", figure, tmp_path) is None
    assert not list(tmp_path.iterdir())


def test_with_wandb_the_figure_becomes_an_image(tmp_path: Path) -> None:
    import wandb

    logger = RecordingWandbLogger()
    figure = plot_training_curves([{"epoch": 0, "val_acc": 0.5}, {"epoch": 1, "val_acc": 0.7}])
    assert log_figure(fake_trainer(True, [logger]), "curves", figure, tmp_path) is None
    assert not list(tmp_path.iterdir())
    (entry,) = logger.logged
    assert entry["trainer/global_step"] == 7 and isinstance(entry["curves"], wandb.Image)
    width, height = entry["curves"].image.size
    assert width > 100 and height > 100
    path = log_figure(fake_trainer(True, [logger]), "curves", figure, tmp_path, always_save=True)
    assert path is not None and path.exists() and len(logger.logged) == 2


def test_a_pyplot_figure_is_closed_after_logging(tmp_path: Path) -> None:
    figure = plt.figure()
    log_figure(fake_trainer(True), "pyplot", figure, tmp_path)
    assert not plt.fignum_exists(figure.number)


def test_bad_arguments(tmp_path: Path) -> None:
    figure = plot_training_curves([{"epoch": 0, "val_acc": 0.5}])
    with pytest.raises(ValueError, match="key: expected a non-empty string"):
        log_figure(fake_trainer(True), "", figure, tmp_path)
    with pytest.raises(ValueError, match="figure: expected a matplotlib Figure"):
        log_figure(fake_trainer(True), "curves", "figure.png", tmp_path)


def test_training_curves_use_distinct_colours() -> None:
    figure = plot_training_curves([{"epoch": e, "train_loss": 1 / (e + 1), "val_acc": e / 3} for e in range(3)])
    lines = [line for ax in figure.axes for line in ax.get_lines()]
    assert len({line.get_color() for line in lines}) == len(lines) == 2
