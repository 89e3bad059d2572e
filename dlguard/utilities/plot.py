"""matplotlib figures of dlguard's results, shared by the metrics' ``plot()``, the callbacks and recipes.

They sit below :mod:`dlguard.metrics` (as torchmetrics keeps ``torchmetrics/utilities/plot.py``
below its metrics), so they read plain tensors and mappings and import nothing of dlguard above
the argument checks; users find them re-exported in :mod:`dlguard.report`.

Every figure is built with matplotlib's object-oriented API (:class:`~matplotlib.figure.Figure`,
``figure.subplots``), never through ``pyplot``: no backend is chosen or switched, and no figure is
registered in pyplot's global state, so nothing needs closing. ``figure.savefig`` writes files
without a backend, and :func:`~dlguard.report.log_figure` sends figures to W&B.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any, Protocol

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure, SubFigure
from torch import Tensor

from dlguard._validation import positive_int

__all__ = [
    "DScoreDistributions",
    "plot_coverage_by_layer",
    "plot_dscore_heatmaps",
    "plot_image_grid",
    "plot_robustness_curves",
]


class DScoreDistributions(Protocol):
    """What :func:`plot_dscore_heatmaps` reads of a :class:`~dlguard.metrics.functional.DScoreResult`.

    The feature and attention distributions ``f̃`` and ``ã`` (``n²`` values each, row-major over
    the ``n x n`` grid) and the three scores of the default title. A protocol rather than the
    result's class: importing :mod:`dlguard.metrics.functional` runs ``dlguard/metrics/__init__.py``,
    whose metrics draw their plots with this module.
    """

    @property
    def d_score(self) -> Tensor: ...

    @property
    def v_fitness(self) -> Tensor: ...

    @property
    def v_robust(self) -> Tensor: ...

    @property
    def feature_distribution(self) -> Tensor: ...

    @property
    def attention_distribution(self) -> Tensor: ...


def _given_axes(ax: Any, count: int, what: str) -> list[Axes]:
    """``ax`` as a list of ``count`` matplotlib ``Axes`` of one figure (one ``Axes`` when ``count`` is 1)."""
    axes = [ax] if isinstance(ax, Axes) else ax
    if isinstance(axes, np.ndarray):
        axes = list(axes.flat)
    if (
        not isinstance(axes, Sequence)
        or len(axes) != count
        or not all(isinstance(a, Axes) for a in axes)
        or len({id(a.figure) for a in axes}) != 1
    ):
        expected = "one matplotlib Axes" if count == 1 else f"a sequence of {count} matplotlib Axes of one figure"
        raise ValueError(f"ax: expected {expected} ({what}), got {ax!r}")
    return list(axes)


def plot_image_grid(images: Tensor, captions: Sequence[str], columns: int = 8) -> Figure:
    """Show images ``(N, C, H, W)`` in ``[0, 1]`` (``C`` of 1, 3 or 4) in a grid, each with its caption.

    Example:
        >>> import torch
        >>> fig = plot_image_grid(torch.rand(3, 1, 8, 8), ["a", "b", "c"], columns=2)
        >>> len([ax for ax in fig.axes if ax.get_title()])
        3
    """
    if not isinstance(images, Tensor) or images.ndim != 4 or images.shape[1] not in (1, 3, 4):
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images: expected a tensor (N, C, H, W) with C of 1, 3 or 4, got {shape}")
    if isinstance(captions, str) or not isinstance(captions, Sequence) or len(captions) != len(images):
        count = len(captions) if isinstance(captions, Sequence) else type(captions).__name__
        raise ValueError(f"captions: expected one caption per image ({len(images)}), got {count}")
    columns = positive_int("columns", columns)
    count = max(len(images), 1)
    columns = min(columns, count)
    rows = (count + columns - 1) // columns
    figure = Figure(figsize=(1.4 * columns, 1.6 * rows), layout="tight")
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, caption in zip(axes.flat, images, captions, strict=False):
        pixels = image.detach().float().cpu().clamp(0, 1).permute(1, 2, 0).numpy()
        ax.imshow(pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels, cmap="gray", vmin=0, vmax=1)
        ax.set_title(caption, fontsize=8)
    return figure


def plot_dscore_heatmaps(
    result: DScoreDistributions, title: str | None = None, ax: Sequence[Axes] | None = None
) -> Figure | SubFigure:
    """Feature distribution ``f̃`` and attention distribution ``ã`` as ``n x n`` heatmaps.

    Args:
        result: a :class:`~dlguard.metrics.functional.DScoreResult` (or anything with its
            distributions and scores, see :class:`DScoreDistributions`).
        title: the figure's title (default: D-Score, ``v_robust`` and ``v_fitness``); with ``ax``
            a title is set only when given.
        ax: two matplotlib ``Axes`` of one figure (feature, attention) to draw into; a colour bar
            takes room beside them.

    Returns:
        The figure drawn into (the ``SubFigure`` when ``ax`` belongs to one).

    Example:
        >>> from dlguard.metrics.functional import d_score
        >>> fig = plot_dscore_heatmaps(d_score(0.9, [0.9, 0.8, 0.85, 0.9], [0.5, 0.6, 0.7, 0.8], 10))
        >>> [ax.get_title() for ax in fig.axes[:2]]
        ['feature distribution f̃', 'attention distribution ã']
    """
    return _dscore_heatmaps(result, title, ax)[0]


def _dscore_heatmaps(
    result: DScoreDistributions, title: str | None = None, ax: Sequence[Axes] | None = None
) -> tuple[Figure | SubFigure, list[Axes]]:
    """:func:`plot_dscore_heatmaps`, also returning the two heatmap axes."""
    distributions = [getattr(result, name, None) for name in ("feature_distribution", "attention_distribution")]
    if not all(isinstance(d, Tensor) for d in distributions) or distributions[0].shape != distributions[1].shape:
        raise ValueError(f"result: expected a DScoreResult, got {type(result).__name__}")
    cells = distributions[0].numel()
    n = math.isqrt(cells)
    if n * n != cells or n < 2:
        raise ValueError(f"result: expected n² cells per distribution with n >= 2, got {cells}")
    if ax is None:
        figure: Figure | SubFigure = Figure(figsize=(7, 3.2), layout="constrained")
        axes = list(figure.subplots(1, 2))
        if title is None:
            title = (
                f"D-Score {float(result.d_score):.4f}   v_robust {float(result.v_robust):.4f}   "
                f"v_fitness {float(result.v_fitness):.4f}"
            )
    else:
        axes = _given_axes(ax, 2, "feature and attention heatmaps")
        figure = axes[0].figure
    top = float(max(distributions[0].max(), distributions[1].max()))
    for axis, values, name in (
        (axes[0], distributions[0], "feature distribution f̃"),
        (axes[1], distributions[1], "attention distribution ã"),
    ):
        grid = values.detach().double().cpu().reshape(n, n).numpy()
        image = axis.imshow(grid, cmap="viridis", vmin=0, vmax=top)
        for (row, col), value in np.ndenumerate(grid):
            axis.text(
                col,
                row,
                f"{value:.3f}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if value < top / 2 else "black",
            )
        axis.set_title(name)
        axis.set_xticks([])
        axis.set_yticks([])
    figure.colorbar(image, ax=axes, shrink=0.8)
    if title is not None:
        figure.suptitle(title, fontsize=9)
    return figure, axes


def plot_coverage_by_layer(per_layer: Mapping[str, Mapping[str, float]]) -> Figure:
    """Grouped bars: each layer's coverage under each criterion.

    Args:
        per_layer: ``{criterion: {layer: coverage}}``.

    Example:
        >>> fig = plot_coverage_by_layer({"nc": {"conv1": 0.5, "fc": 1.0}, "tknc": {"conv1": 0.2, "fc": 0.3}})
        >>> [t.get_text() for t in fig.axes[0].get_xticklabels()]
        ['conv1', 'fc']
    """
    if not isinstance(per_layer, Mapping) or not all(isinstance(v, Mapping) for v in per_layer.values()):
        raise ValueError(f"per_layer: expected {{criterion: {{layer: coverage}}}}, got {type(per_layer).__name__}")
    criteria = list(per_layer)
    layers = list(next(iter(per_layer.values()))) if criteria else []
    for criterion in criteria:
        if list(per_layer[criterion]) != layers:
            raise ValueError(
                f"per_layer: expected the same layers under every criterion, got {list(per_layer[criterion])} "
                f"under {criterion!r} and {layers} under {criteria[0]!r}"
            )
    figure = Figure(figsize=(max(4.0, 0.9 * len(layers) + 2), 3.4), layout="constrained")
    ax = figure.subplots()
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
    ax: Axes | Sequence[Axes] | None = None,
    title: str | None = None,
) -> Figure | SubFigure:
    """Robustness curves: accuracy against severity.

    Without ``levels``, one panel: a line per property against the severity index ``1..L``.
    With ``levels`` (each property's own severity values: ``σ``, ``θ`` and ``β`` are different
    units), one panel per property, its accuracy against its level values, the x axis labelled
    with the property's name; a property missing from ``levels`` keeps the severity index.

    Args:
        curves: ``{property: accuracy per level}``.
        levels: ``{property: severity values}``, as many as that property's accuracies.
        ax: draw into these axes instead of a new figure: one ``Axes`` for one panel, else a
            sequence of ``Axes``, one per property in ``curves``' order.
        title: the title of the single panel, or of the figure when there are several panels.

    Returns:
        The figure drawn into (the ``SubFigure`` when ``ax`` belongs to one).

    Example:
        >>> fig = plot_robustness_curves({"noise": [0.99, 0.9, 0.6], "rotation": [0.98, 0.8, 0.5]})
        >>> [line.get_label() for line in fig.axes[0].get_lines()]
        ['noise', 'rotation']
        >>> fig = plot_robustness_curves({"noise": [0.9, 0.6], "rotation": [0.8, 0.5]},
        ...                              {"noise": [0.05, 0.1], "rotation": [10, 20]})
        >>> [(ax.get_xlabel(), [float(x) for x in ax.get_lines()[0].get_xdata()]) for ax in fig.axes]
        [('noise', [0.05, 0.1]), ('rotation', [10.0, 20.0])]
    """
    return _robustness_curves(curves, levels, ax, title)[0]


def _curve_values(name: str, values: Tensor | Sequence[float]) -> list[float]:
    try:
        points = torch.as_tensor(values, dtype=torch.float64).detach().cpu().reshape(-1).tolist()
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"curves: expected accuracies per level for {name!r}, got {type(values).__name__}") from None
    if not points:
        raise ValueError(f"curves: expected at least one accuracy for {name!r}")
    return points


def _level_values(name: str, values: Sequence[float], count: int) -> list[float]:
    if isinstance(values, Tensor):
        values = values.detach().cpu().reshape(-1).tolist()
    if (
        isinstance(values, str)
        or not isinstance(values, Sequence)
        or not all(isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    ):
        raise ValueError(f"levels: expected finite severity values for {name!r}, got {values!r}")
    if len(values) != count:
        raise ValueError(f"levels: expected {count} severity values for {name!r} (one per accuracy), got {len(values)}")
    return [float(v) for v in values]


def _robustness_curves(
    curves: Mapping[str, Tensor | Sequence[float]],
    levels: Mapping[str, Sequence[float]] | None = None,
    ax: Axes | Sequence[Axes] | None = None,
    title: str | None = None,
) -> tuple[Figure | SubFigure, list[Axes]]:
    """:func:`plot_robustness_curves`, also returning its panels."""
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError(f"curves: expected a non-empty {{property: accuracies}}, got {curves!r}")
    if levels is not None and not isinstance(levels, Mapping):
        raise ValueError(f"levels: expected None or {{property: severity values}}, got {type(levels).__name__}")
    points = {name: _curve_values(name, values) for name, values in curves.items()}
    if levels is not None:
        unknown = [name for name in levels if name not in points]
        if unknown:
            raise ValueError(f"levels: properties {unknown} have no curve; curves are {list(points)}")
        xs = {
            name: _level_values(name, levels[name], len(ys)) if name in levels else None for name, ys in points.items()
        }
    panels = 1 if levels is None else len(points)
    if ax is None:
        size = (5.5, 3.4) if panels == 1 else (3.2 * panels + 0.4, 3.2)
        figure: Figure | SubFigure = Figure(figsize=size, layout="constrained")
        axes = list(np.atleast_1d(figure.subplots(1, panels, sharey=True)))
    else:
        axes = _given_axes(ax, panels, "one per property" if panels > 1 else "one panel")
        figure = axes[0].figure
    if levels is None:
        axis = axes[0]
        for name, ys in points.items():
            axis.plot(range(1, len(ys) + 1), ys, marker="o", label=name)
        axis.set_xlabel("severity level")
        axis.set_xticks(range(1, 1 + max(len(ys) for ys in points.values())))
        axis.legend(fontsize=8)
    else:
        for axis, (name, ys) in zip(axes, points.items(), strict=True):
            x = xs[name] if xs[name] is not None else list(range(1, len(ys) + 1))
            axis.plot(x, ys, marker="o", label=name)
            axis.set_xlabel(name if xs[name] is not None else f"{name} (severity level)")
            if xs[name] is None:
                axis.set_xticks(x)
    for axis in axes:
        axis.set_ylim(0, 1.02)
    axes[0].set_ylabel("accuracy")
    if title:
        (axes[0].set_title if panels == 1 else figure.suptitle)(title)
    return figure, axes
