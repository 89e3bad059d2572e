"""matplotlib figures shared by the demo, callbacks and recipes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # figures are written to files or W&B, never shown on a screen

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from torch import Tensor

if TYPE_CHECKING:
    from dlguard.metrics.functional.dscore import DScoreResult

__all__ = [
    "plot_coverage_by_layer",
    "plot_dscore_heatmaps",
    "plot_image_grid",
    "plot_robustness_curves",
    "plot_training_curves",
]


def plot_training_curves(history: Sequence[Mapping[str, float]]) -> Figure:
    """Plot per-epoch scalars: losses on the left axis, ``*acc*`` values on the right one.

    Args:
        history: one mapping per epoch, e.g. ``{"epoch": 0, "val_loss": 0.3, "val_acc": 0.91}``.

    Example:
        >>> fig = plot_training_curves([{"epoch": 0, "val_acc": 0.8}, {"epoch": 1, "val_acc": 0.9}])
        >>> [line.get_label() for line in fig.axes[1].get_lines()]
        ['val_acc']
    """
    figure, loss_axis = plt.subplots(figsize=(6, 3.5))
    acc_axis = loss_axis.twinx()
    epochs = [row.get("epoch", i) for i, row in enumerate(history)]
    keys = sorted({key for row in history for key in row if key != "epoch"})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, key in enumerate(keys):
        points = [(e, row[key]) for e, row in zip(epochs, history, strict=True) if key in row]
        is_accuracy = "acc" in key
        (acc_axis if is_accuracy else loss_axis).plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker="o",
            label=key,
            color=colours[index % len(colours)],
            linestyle="--" if is_accuracy else "-",
        )
    loss_axis.xaxis.get_major_locator().set_params(integer=True)
    loss_axis.set_xlabel("epoch")
    loss_axis.set_ylabel("loss")
    acc_axis.set_ylabel("accuracy")
    handles = loss_axis.get_lines() + acc_axis.get_lines()
    loss_axis.legend(handles, [h.get_label() for h in handles], loc="center right")
    figure.tight_layout()
    return figure


def plot_image_grid(images: Tensor, captions: Sequence[str], columns: int = 8) -> Figure:
    """Show images ``(N, C, H, W)`` in ``[0, 1]`` in a grid, each with its caption.

    Example:
        >>> import torch
        >>> fig = plot_image_grid(torch.rand(3, 1, 8, 8), ["a", "b", "c"], columns=2)
        >>> len([ax for ax in fig.axes if ax.get_title()])
        3
    """
    count = max(len(images), 1)
    columns = min(columns, count)
    rows = (count + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(1.4 * columns, 1.6 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, caption in zip(axes.flat, images, captions, strict=False):
        pixels = image.detach().float().cpu().clamp(0, 1).permute(1, 2, 0).numpy()
        ax.imshow(pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels, cmap="gray", vmin=0, vmax=1)
        ax.set_title(caption, fontsize=8)
    figure.tight_layout()
    return figure


def plot_dscore_heatmaps(result: DScoreResult, title: str | None = None) -> Figure:
    """Feature distribution ``f̃`` and attention distribution ``ã`` as ``n x n`` heatmaps.

    Example:
        >>> from dlguard.metrics.functional import d_score
        >>> fig = plot_dscore_heatmaps(d_score(0.9, [0.9, 0.8, 0.85, 0.9], [0.5, 0.6, 0.7, 0.8], 10))
        >>> [ax.get_title() for ax in fig.axes[:2]]
        ['feature distribution f̃', 'attention distribution ã']
    """
    cells = result.feature_distribution.numel()
    n = round(cells**0.5)
    figure, axes = plt.subplots(1, 2, figsize=(7, 3.2), layout="constrained")
    top = float(max(result.feature_distribution.max(), result.attention_distribution.max()))
    for ax, values, name in (
        (axes[0], result.feature_distribution, "feature distribution f̃"),
        (axes[1], result.attention_distribution, "attention distribution ã"),
    ):
        grid = values.detach().double().cpu().reshape(n, n).numpy()
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=top)
        for (row, col), value in np.ndenumerate(grid):
            ax.text(
                col,
                row,
                f"{value:.3f}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if value < top / 2 else "black",
            )
        ax.set_title(name)
        ax.set_xticks([])
        ax.set_yticks([])
    figure.colorbar(image, ax=list(axes), shrink=0.8)
    figure.suptitle(
        title
        or f"D-Score {float(result.d_score):.4f}   v_robust {float(result.v_robust):.4f}   "
        f"v_fitness {float(result.v_fitness):.4f}",
        fontsize=9,
    )
    return figure


def plot_coverage_by_layer(per_layer: Mapping[str, Mapping[str, float]]) -> Figure:
    """Grouped bars: each layer's coverage under each criterion.

    Args:
        per_layer: ``{criterion: {layer: coverage}}``.

    Example:
        >>> fig = plot_coverage_by_layer({"nc": {"conv1": 0.5, "fc": 1.0}, "tknc": {"conv1": 0.2, "fc": 0.3}})
        >>> [t.get_text() for t in fig.axes[0].get_xticklabels()]
        ['conv1', 'fc']
    """
    criteria = list(per_layer)
    layers = list(next(iter(per_layer.values()))) if criteria else []
    figure, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(layers) + 2), 3.4), layout="constrained")
    width = 0.8 / max(len(criteria), 1)
    for index, criterion in enumerate(criteria):
        positions = [i + (index - (len(criteria) - 1) / 2) * width for i in range(len(layers))]
        ax.bar(positions, [per_layer[criterion][layer] for layer in layers], width, label=criterion.upper())
    ax.set_xticks(range(len(layers)), layers, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("coverage")
    ax.legend(ncols=min(len(criteria), 5), fontsize=8, loc="upper left")
    return figure


def plot_robustness_curves(
    curves: Mapping[str, Tensor | Sequence[float]],
    levels: Mapping[str, Sequence[float]] | None = None,
    ax: Any = None,
    title: str | None = None,
) -> Figure:
    """Robustness curves: accuracy against severity, one line per property.

    Args:
        curves: ``{property: accuracy per level}``.
        levels: ``{property: severity values}``; their range goes into the legend.
        ax: draw into these axes instead of a new figure.
        title: axes title.

    Example:
        >>> fig = plot_robustness_curves({"noise": [0.99, 0.9, 0.6], "rotation": [0.98, 0.8, 0.5]})
        >>> [line.get_label() for line in fig.axes[0].get_lines()]
        ['noise', 'rotation']
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.4), layout="constrained")
    for name, values in curves.items():
        ys = [float(v) for v in values]
        label = name
        if levels and name in levels:  # the severity range in the legend: "rotation (5-45)"
            label = f"{name} ({levels[name][0]:g}–{levels[name][-1]:g})"
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=label)
    ax.set_xlabel("severity level")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(range(1, 1 + max((len(list(v)) for v in curves.values()), default=1)))
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax.figure
