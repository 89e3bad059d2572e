from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

from dlguard.metrics.functional import d_score
from dlguard.utilities.plot import (
    plot_coverage_by_layer,
    plot_dscore_heatmaps,
    plot_image_grid,
    plot_robustness_curves,
)


def test_robustness_curves_one_panel_per_property_with_its_own_levels() -> None:
    curves = {"noise": torch.tensor([0.9, 0.7, 0.4]), "rotation": [0.95, 0.6], "brightness": [1.0, 0.8]}
    levels = {"noise": (0.02, 0.05, 0.1), "rotation": [5, 20]}  # brightness: no values given
    figure = plot_robustness_curves(curves, levels, title="after training")
    assert len(figure.axes) == 3 and figure.get_suptitle() == "after training"
    assert [ax.get_xlabel() for ax in figure.axes] == ["noise", "rotation", "brightness (severity level)"]
    assert [list(ax.get_lines()[0].get_xdata()) for ax in figure.axes] == [[0.02, 0.05, 0.1], [5.0, 20.0], [1, 2]]
    assert list(figure.axes[0].get_lines()[0].get_ydata()) == pytest.approx([0.9, 0.7, 0.4])


def test_robustness_curves_without_levels_share_the_severity_index() -> None:
    figure = plot_robustness_curves({"noise": [0.9, 0.7, 0.4], "rotation": torch.tensor([0.8])}, title="t")
    (ax,) = figure.axes
    assert ax.get_xlabel() == "severity level" and ax.get_title() == "t"
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[1, 2, 3], [1]]
    scalar = plot_robustness_curves({"noise": torch.tensor(0.5)})  # torchmetrics squeezes one-level results
    assert list(scalar.axes[0].get_lines()[0].get_ydata()) == [0.5]


def test_robustness_curves_draw_into_the_given_axes() -> None:
    figure = Figure()
    axes = figure.subplots(1, 3)
    got = plot_robustness_curves({"noise": [0.9, 0.5], "rotation": [0.8, 0.2]}, {"noise": [1, 2], "rotation": [3, 4]},
                                 ax=axes[1:])  # fmt: skip
    assert got is figure and not axes[0].get_lines()
    assert [list(ax.get_lines()[0].get_xdata()) for ax in axes[1:]] == [[1.0, 2.0], [3.0, 4.0]]
    single = Figure().subplots()
    assert plot_robustness_curves({"noise": [0.9, 0.5]}, ax=single) is single.figure
    assert plot_robustness_curves({"noise": [0.9, 0.5]}, {"noise": [1, 2]}, ax=[single]) is single.figure


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (({"noise": [0.9, 0.5], "rotation": [0.8, 0.2]}, {"noise": [1, 2], "rotation": [3, 4]}, "one"), "ax: expected"),
        (({"noise": [0.9, 0.5], "rotation": [0.8]}, {"noise": [1, 2], "rotation": [3, 4]}), "levels: expected 1"),
        (({"noise": [0.9, 0.5]}, {"noise": [1, 2], "fog": [1, 2]}), r"levels: properties \['fog'\] have no curve"),
        (({"noise": [0.9, 0.5]}, {"noise": ["a", "b"]}), "levels: expected finite severity values for 'noise'"),
        (({"noise": [0.9, 0.5]}, [1, 2]), "levels: expected None or"),
        (({},), "curves: expected a non-empty"),
        (({"noise": []},), "curves: expected at least one accuracy for 'noise'"),
        (({"noise": "high"},), "curves: expected accuracies per level for 'noise'"),
    ],
)
def test_robustness_curves_reject_bad_input(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plot_robustness_curves(*args)


def test_dscore_heatmaps_into_given_axes_and_bad_input() -> None:
    result = d_score(0.9, [0.9, 0.8, 0.85, 0.9], [0.5, 0.6, 0.7, 0.8], 10)
    figure = Figure()
    axes = figure.subplots(1, 2)
    assert plot_dscore_heatmaps(result, ax=axes) is figure
    # losses 0, 0.1, 0.05, 0 over their sum 0.15, row-major
    assert axes[0].images[0].get_array().flatten().tolist() == pytest.approx([0.0, 2 / 3, 1 / 3, 0.0])
    assert figure.get_suptitle() == ""  # a title only when asked for, in someone else's figure
    with pytest.raises(ValueError, match="result: expected a DScoreResult"):
        plot_dscore_heatmaps({"d_score": 0.5})


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: plot_image_grid(torch.rand(3, 1, 8, 8), ["a", "b"]),
            r"captions: expected one caption per image \(3\)",
        ),
        (lambda: plot_image_grid(torch.rand(3, 8, 8), ["a", "b", "c"]), r"images: expected a tensor \(N, C, H, W\)"),
        (lambda: plot_image_grid(torch.rand(1, 1, 8, 8), ["a"], columns=0), "columns: expected an integer"),
        (lambda: plot_coverage_by_layer({"nc": {"a": 1.0}, "kmnc": {"b": 1.0}}), "per_layer: expected the same layers"),
    ],
)
def test_other_figures_reject_bad_input(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_image_grid_draws_every_image() -> None:
    images = torch.stack([torch.full((1, 4, 4), v) for v in (0.1, 0.5, 0.9)])
    figure = plot_image_grid(images, ["a", "b", "c"], columns=2)
    drawn = [ax for ax in figure.axes if ax.images]
    assert [ax.get_title() for ax in drawn] == ["a", "b", "c"]
    assert [float(ax.images[0].get_array().mean()) for ax in drawn] == pytest.approx([0.1, 0.5, 0.9])
