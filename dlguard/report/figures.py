"""The training run's figure, beside the result figures of :mod:`dlguard.utilities.plot`.

Built with matplotlib's object-oriented API, never through ``pyplot`` (see :mod:`dlguard.utilities.plot`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
from matplotlib.figure import Figure

__all__ = ["plot_training_curves"]


def plot_training_curves(history: Sequence[Mapping[str, float]]) -> Figure:
    """Plot per-epoch scalars: losses on the left axis, ``*acc*`` values on the right one.

    Args:
        history: one mapping per epoch, e.g. ``{"epoch": 0, "val_loss": 0.3, "val_acc": 0.91}``.

    Example:
        >>> fig = plot_training_curves([{"epoch": 0, "val_acc": 0.8}, {"epoch": 1, "val_acc": 0.9}])
        >>> [line.get_label() for line in fig.axes[1].get_lines()]
        ['val_acc']
    """
    if isinstance(history, Mapping | str) or not isinstance(history, Sequence):
        raise ValueError(f"history: expected a sequence of per-epoch mappings, got {type(history).__name__}")
    if not all(isinstance(row, Mapping) for row in history):
        raise ValueError("history: expected one mapping of scalars per epoch")
    figure = Figure(figsize=(6, 3.5), layout="tight")  # constrained layout collapses under a long legend
    loss_axis = figure.subplots()
    acc_axis = loss_axis.twinx()
    epochs = [row.get("epoch", i) for i, row in enumerate(history)]
    keys = sorted({key for row in history for key in row if key != "epoch"})
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
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
    return figure
