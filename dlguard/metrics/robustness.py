"""Local robustness and global robustness through an adder as torchmetrics metrics (SPEC §5)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from numbers import Integral, Real
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from dlguard._validation import check_combine, positive_int
from dlguard.metrics.functional.robustness import (
    LocalRobustnessResult,
    _adder_compute,
    _adder_update,
    _local_robustness_compute,
    _local_robustness_update,
    digit_sum,
)

__all__ = ["AdderGlobalRobustness", "LocalRobustness"]


def _property_levels(prop: object, levels: int) -> tuple[float, ...] | None:
    """The severity values of a :class:`~dlguard.augment.Property` (``None`` for a name)."""
    values = getattr(prop, "levels", None)
    if values is None or isinstance(prop, str):
        return None
    if (
        isinstance(values, str)
        or not isinstance(values, Sequence)
        or not values
        or not all(isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    ):
        raise ValueError(f"properties: expected finite severity values for {prop.name!r}, got {values!r}")
    if len(values) > levels:
        raise ValueError(f"levels: is {levels} but property {prop.name!r} has {len(values)} severity values")
    return tuple(float(v) for v in values)


class _PerProperty(Metric):
    """Names properties and their number of levels; states are indexed ``[property, level, ...]``.

    ``properties`` are names or :class:`~dlguard.augment.Property` objects (``.name``, ``.levels``);
    the level values of the latter are kept in ``level_values`` (``{name: values}``) for plots. A
    property may have fewer values than ``levels`` (a sweep pads it to the widest property).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, num_classes: int, properties: Sequence[Any], levels: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        positive_int("num_classes", num_classes, minimum=2)
        levels = positive_int("levels", levels)
        if isinstance(properties, str) or not isinstance(properties, Sequence):
            raise ValueError(f"properties: expected a sequence of property names, got {properties!r}")
        names = [getattr(p, "name", p) for p in properties]
        if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise ValueError(f"properties: expected distinct property names, got {names}")
        self.num_classes, self.properties, self.levels = num_classes, names, levels
        self.level_values: dict[str, tuple[float, ...]] = {}
        for name, prop in zip(names, properties, strict=True):
            values = _property_levels(prop, levels)
            if values is not None:
                self.level_values[name] = values

    def _index(self, prop: Any) -> int:
        prop = getattr(prop, "name", prop)
        if prop not in self.properties:
            raise ValueError(f"property: unknown {prop!r}; known properties: {self.properties}")
        return self.properties.index(prop)


class LocalRobustness(_PerProperty):
    """``LR_{c,p}`` per property, severity and class, ``LR_p``, and mean true-label confidence.

    ``update(logits, target, property)`` takes the model's logits ``(L, B, K)`` on the same inputs
    perturbed at each of the property's ``L ≤ levels`` levels (a property may have fewer levels than
    the widest; its results then cover its own ``L``). States are per (property, level, class)
    counts and confidence sums, reduced by sum across processes.

    Args:
        num_classes: ``C``.
        properties: property names, or :class:`~dlguard.augment.Property` objects whose level
            values :meth:`plot` puts on the x axis (kept in ``level_values``).
        levels: severity levels per property (at least each property's number of level values).

    Example:
        >>> import torch
        >>> target = torch.tensor([0, 1])
        >>> logits = torch.stack([torch.eye(2) * 5, torch.eye(2).flip(0) * 5])  # level 2 swaps the labels
        >>> metric = LocalRobustness(num_classes=2, properties=["noise"], levels=2)
        >>> metric.update(logits, target, "noise")
        >>> metric.compute()["noise"].per_level.tolist()
        [1.0, 0.0]
    """

    correct: Tensor
    total: Tensor
    confidence: Tensor

    def __init__(self, num_classes: int, properties: Sequence[Any], levels: int, **kwargs: Any) -> None:
        super().__init__(num_classes, properties, levels, **kwargs)
        shape = (len(self.properties), levels, num_classes)
        self.add_state("correct", torch.zeros(shape, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(shape, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("confidence", torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logits: Tensor, target: Tensor, property: Any) -> None:
        """Add the logits ``(levels, B, K)`` of one property's sweep (its name or object) over labels ``target``."""
        index = self._index(property)
        property = self.properties[index]
        if isinstance(logits, Tensor) and logits.ndim == 3 and not 0 < logits.shape[0] <= self.levels:
            raise ValueError(f"logits: expected 1 to {self.levels} levels for {property!r}, got {logits.shape[0]}")
        correct, total, confidence = _local_robustness_update(logits, target, self.num_classes)
        levels = len(correct)
        self.correct[index, :levels] += correct
        self.total[index, :levels] += total.expand_as(correct)
        self.confidence[index, :levels] += confidence.double()

    def compute(self) -> dict[str, LocalRobustnessResult]:
        """``{property: LocalRobustnessResult}`` over the levels that received inputs, for every property that did."""
        results = {}
        for index, name in enumerate(self.properties):
            levels = int((self.total[index].sum(dim=1) > 0).sum())  # a prefix: a property's levels come together
            if levels:
                total = self.total[index][0]
                results[name] = _local_robustness_compute(
                    self.correct[index, :levels], total, self.confidence[index, :levels]
                )
        if not results:
            raise ValueError("LocalRobustness: no inputs were added")
        return results

    def plot(self, val: dict[str, LocalRobustnessResult] | None = None, ax: Any = None) -> tuple[Any, Any]:
        """Robustness curves ``LR_p`` against severity.

        When every property came with level values (:class:`~dlguard.augment.Property` objects),
        one panel per property with its level values on the x axis; otherwise one panel, a line per
        property against the severity index. See :func:`~dlguard.report.plot_robustness_curves`.

        Args:
            val: results to draw (default: :meth:`compute`).
            ax: matplotlib ``Axes`` to draw into: one for a single panel, else one per property of
                ``val`` (default: a new figure).

        Returns:
            ``(figure, axes)``: one ``Axes`` for a single panel, else a list of them.
        """
        # matplotlib loads only when a figure is drawn
        from dlguard.utilities.plot import plot_robustness_curves

        results = val if val is not None else self.compute()
        curves = {name: result.per_level.reshape(-1) for name, result in results.items()}
        levels = None
        if curves and all(name in self.level_values for name in curves):
            levels = {name: self.level_values[name] for name in curves}
            curves = {name: values[: len(levels[name])] for name, values in curves.items()}
        figure = plot_robustness_curves(curves, levels, ax)
        if ax is None:
            axes = [a for a in figure.axes if a.get_lines()]
        else:
            axes = list(ax) if isinstance(ax, list | tuple) else [ax]
        return figure, axes[0] if len(axes) == 1 else axes


class AdderGlobalRobustness(_PerProperty):
    """Global robustness through an adder of two predictions, per property, severity and class pair.

    For pairs ``(x₁, x₂)`` of classes ``(c₁, c₂)`` perturbed alike, a pair counts as robust when
    ``combine(ŷ₁, ŷ₂) = combine(c₁, c₂)`` (SPEC §5). Named apart from HDA's density-weighted
    empirical global robustness.

    Args:
        num_classes: ``C``.
        properties: property names (or :class:`~dlguard.augment.Property` objects).
        levels: severity levels per property.
        combine: how two labels combine, elementwise. The default, the sum of two digits
            (:func:`~dlguard.metrics.functional.digit_sum`), needs ``num_classes = 10``; any other
            task passes a combine that fits its labels.

    Example:
        >>> import torch
        >>> metric = AdderGlobalRobustness(num_classes=10, properties=["rotation"], levels=1)
        >>> metric.update((torch.tensor([3, 2]), torch.tensor([4, 6])), (torch.tensor([3, 3]), torch.tensor([4, 4])),
        ...               "rotation", level=0)
        >>> overall, per_pair = metric.compute()["rotation"]
        >>> float(overall), float(per_pair[0, 3, 4])  # torchmetrics squeezes one-level results
        (0.5, 0.5)
    """

    correct: Tensor
    total: Tensor

    def __init__(
        self,
        num_classes: int,
        properties: Sequence[Any],
        levels: int,
        combine: Callable[[Tensor, Tensor], Tensor] = digit_sum,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes, properties, levels, **kwargs)
        check_combine(combine, num_classes)
        self.combine = combine
        shape = (len(self.properties), levels, num_classes, num_classes)
        self.add_state("correct", torch.zeros(shape, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(shape, dtype=torch.long), dist_reduce_fx="sum")

    def update(
        self, preds: tuple[Tensor, Tensor], targets: tuple[Tensor, Tensor], property: Any, level: int | Tensor
    ) -> None:
        """Add pairs: predicted labels of both inputs, their true labels (all in ``[0, C)``), property, level index.

        ``property`` and ``level`` name one (property, level) for every pair, or, as ``(M,)`` integer
        tensors (property indices into ``properties`` and level indices), one per pair: a robustness
        sweep's whole record in one update.
        """
        if isinstance(property, Tensor) or isinstance(level, Tensor):
            self._update_per_pair(preds, targets, property, level)
            return
        index = self._index(property)
        if isinstance(level, bool) or not isinstance(level, Integral) or not 0 <= level < self.levels:
            raise ValueError(f"level: expected an index in 0..{self.levels - 1}, got {level}")
        correct, total = _adder_update(preds, targets, self.num_classes, self.combine)
        self.correct[index, level] += correct
        self.total[index, level] += total

    def _update_per_pair(
        self, preds: tuple[Tensor, Tensor], targets: tuple[Tensor, Tensor], property: Any, level: Any
    ) -> None:
        count = preds[0].shape[0] if isinstance(preds, tuple | list) and isinstance(preds[0], Tensor) else None
        cells = []
        for name, value, bound in (("property", property, len(self.properties)), ("level", level, self.levels)):
            if not isinstance(value, Tensor) or value.is_floating_point() or value.shape != (count,):
                raise ValueError(f"{name}: expected ({count},) integer indices, one per pair, got {value!r}")
            if value.numel() and (int(value.min()) < 0 or int(value.max()) >= bound):
                raise ValueError(f"{name}: expected indices in 0..{bound - 1}")
            cells.append(value.long())
        groups = len(self.properties) * self.levels
        group = cells[0] * self.levels + cells[1]
        correct, total = _adder_update(preds, targets, self.num_classes, self.combine, group, groups)
        self.correct += correct.view_as(self.correct)
        self.total += total.view_as(self.total)

    def compute(self) -> dict[str, tuple[Tensor, Tensor]]:
        """``{property: (GR per level (L,), GR per level and class pair (L, C, C))}``."""
        results = {}
        for index, name in enumerate(self.properties):
            if self.total[index].sum() == 0:
                continue
            per_level = [_adder_compute(self.correct[index, lv], self.total[index, lv]) for lv in range(self.levels)
                         if self.total[index, lv].sum() > 0]  # fmt: skip
            results[name] = (torch.stack([g for g, _ in per_level]), torch.stack([p for _, p in per_level]))
        if not results:
            raise ValueError("AdderGlobalRobustness: no pairs were added")
        return results
