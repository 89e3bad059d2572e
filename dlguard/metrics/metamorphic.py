"""Violations of DeepTest's metamorphic relations (SPEC §2) counted per transformation and parameter, sum-reduced.

The relations and eq. 2/eq. 3 are in :mod:`dlguard.metrics.functional.metamorphic`; this module keeps
the counts a probe set needs. The eq. 3 filter needs each (transformation, parameter)'s MSE over the
*whole* probe set, so updates count eq. 2 violations for every ``λ`` unfiltered, with the inputs and
the sums of squared errors, and ``compute()`` applies the filter for every ``ε`` once every process's
counts are in. All states are sums (``MSE_orig`` aside, which every update is given whole), so N
processes report what one process reports for the same inputs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Integral, Real
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from dlguard.metrics.functional.metamorphic import (
    UNFILTERED,
    _check_mse,
    _check_target,
    _check_task,
    _classification_violations,
    _passes_filter,
    _regression_violations,
    _squared_errors,
    check_outputs,
    is_filtered,
)

__all__ = ["MetamorphicViolations"]

_REL_TOL = 1e-6  # parameters matched to their values: a float32 round trip of a level still finds it
_TOTAL = "total"


def _numbers(name: str, values: object, strict: bool) -> tuple[float, ...]:
    """A non-empty sequence of finite numbers, each ``> 0`` (``strict``) or ``≥ 0``."""
    relation = "> 0" if strict else ">= 0"
    if isinstance(values, Tensor):
        values = values.tolist() if values.ndim == 1 else values
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name}: expected a non-empty sequence of finite numbers {relation}, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or v < 0 or (strict and v == 0):
            raise ValueError(f"{name}: expected finite numbers {relation}, got {v!r} in {list(values)}")
    return tuple(float(v) for v in values)


def _check_properties(properties: object) -> dict[str, tuple[float | int, ...]]:
    """``{name: parameter values}`` from a mapping or from properties (``.name``, ``.levels``).

    Names distinct and not ``"total"``, values finite and distinct.
    """
    if isinstance(properties, Sequence) and not isinstance(properties, str) and properties:
        names = [getattr(p, "name", None) for p in properties]
        if len(set(names)) != len(names):
            raise ValueError(f"properties: expected distinct names, got {names}")
        properties = {getattr(p, "name", p): getattr(p, "levels", None) for p in properties}
    if not isinstance(properties, Mapping) or not properties:
        raise ValueError(
            "properties: expected a non-empty list of dlguard.augment.Property or a mapping {name: parameter "
            f"values}}, e.g. {{'rotation': (3.0, 6.0)}}, got {properties!r}"
        )
    checked = {}
    for name, values in properties.items():
        if not isinstance(name, str) or not name or name == _TOTAL:
            raise ValueError(f"properties: expected names other than {_TOTAL!r}, got {name!r}")
        if isinstance(values, Tensor):
            values = values.tolist() if values.ndim == 1 else values
        if isinstance(values, str) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"properties: {name!r} needs a non-empty sequence of parameter values, got {values!r}")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v):
                raise ValueError(f"properties: {name!r} has a parameter {v!r}; expected finite numbers")
        for i, v in enumerate(values):
            for w in values[:i]:
                if math.isclose(v, w, rel_tol=_REL_TOL):
                    raise ValueError(f"properties: {name!r} lists the parameter {v!r} twice ({list(values)})")
        checked[name] = tuple(int(v) if isinstance(v, Integral) else float(v) for v in values)
    return checked


class MetamorphicViolations(Metric):
    r"""Violations of a metamorphic relation (SPEC §2) per transformation, parameter, ``λ`` and ``ε``.

    ``update(transformed_outputs, property, parameter, source_outputs=None, target=None,
    mse_orig=None)`` adds one batch of inputs transformed by ``property`` at ``parameter`` (with
    ``parameter=None``, ``transformed_outputs`` stacks the outputs at every parameter of the property,
    ``(P, B, ...)``, as :class:`~dlguard.generate.MetamorphicRun` holds them):

    - ``task="classification"``: ``transformed_outputs`` and ``source_outputs`` are logits ``(B, K)``;
      a violation is a changed label (``target`` and ``mse_orig`` are not read).
    - ``task="regression"``: ``transformed_outputs`` are predictions ``(B,)``/``(B, 1)``, ``target``
      the sources' labels ``(B,)`` and ``mse_orig`` the model's MSE on the *source* inputs of the
      whole probe set, over all processes (the caller computes it once; every update gets the same
      value, and ``compute()`` refuses updates that got different ones); a violation for ``λ`` is
      ``(ŷ' − y)² > λ·MSE_orig`` (eq. 2). ``source_outputs`` is optional (checked when given, not read).

    ``parameter`` names one of the property's values: a float is matched to a value with
    ``math.isclose`` (relative tolerance ``1e-6``); an int is the value's index, except where the
    values were given as ints and it equals one of them (then it is that value; an int that is a
    value and the index of another value is refused as ambiguous).

    States (all reduced by sum but ``MSE_orig``): per (transformation, parameter) the inputs, the
    violation counts per ``λ`` (regression) or the label changes (classification), and the sums of
    squared errors; ``MSE_orig`` is kept by ``max`` and by ``min`` (to see that every update got the
    same). The eq. 3 filter is applied in ``compute()`` to the reduced counts.

    ``compute()`` returns ``{name: {...}, ..., "total": {...}}`` with, per property name (``P``
    its parameters, ``L = len(lambdas)``, ``E = len(epsilons)``):

    - ``"inputs"``: ``(P,)`` int64, transformed inputs added;
    - ``"violations"``: regression ``(P, L, E)`` int64, eq. 2 violations of parameter ``p`` at
      ``λ_l`` counted when ``(p, ε_e)`` passes eq. 3 (else 0); classification ``(P,)`` int64 label changes;
    - ``"rate"``: ``violations / inputs`` (float64, same shape; NaN for a parameter without inputs);
    - regression only: ``"mse"`` ``(P,)`` float64 ``MSE_(trans,param)`` (NaN without inputs) and
      ``"kept"`` ``(P, E)`` bool, which ``(p, ε)`` pass eq. 3 (all ``True`` for a name in ``unfiltered``
      or containing ``"+"``; ``False`` for a filtered parameter without inputs);

    and under ``"total"``: ``"violations"`` (regression ``(L, E)``, classification a scalar, int64),
    the sum over every name and parameter after the filter; ``"inputs"`` (int64 scalar), all inputs
    added, filtered or not; ``"rate"`` their ratio (float64); regression also ``"mse_orig"`` (float64
    scalar). These shapes hold also where a dimension is 1 (one parameter, one ``λ``): torchmetrics
    squeezes one-element results to 0-d, and this metric gives them their shapes back.

    Args:
        properties: the transformations: :class:`~dlguard.augment.Property` objects (their ``levels``
            are the parameters), or a mapping ``{name: parameter values}``.
        task: ``"classification"`` or ``"regression"``.
        lambdas: the ``λ > 0`` of eq. 2 (regression; the paper's 1–10).
        epsilons: the ``ε ≥ 0`` of eq. 3 (regression; the paper's 0.01–0.1).
        unfiltered: names eq. 3 is not applied to (fog, rain, the guided search's images); names
            containing ``"+"`` (compositions) are never filtered either.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Example:
        >>> import torch
        >>> metric = MetamorphicViolations({"rotation": (3.0, 30.0), "fog": (1.0,)}, lambdas=(5.0,), epsilons=(0.03,))
        >>> target = torch.tensor([0.0, 0.1, -0.1, 0.2])
        >>> source = target + torch.tensor([0.1, -0.1, 0.1, -0.1])  # MSE_orig = 0.01: eq. 2 allows 0.05
        >>> metric.update(target + torch.tensor([0.3, 0.0, 0.1, 0.1]), "rotation", 3.0, source, target, 0.01)
        >>> metric.update(target + torch.tensor([0.5, 0.5, 0.5, 0.5]), "rotation", 1, source, target, 0.01)
        >>> metric.update(target + torch.tensor([0.3, 0.3, 0.0, 0.0]), "fog", 1.0, source, target, 0.01)
        >>> result = metric.compute()
        >>> [round(v, 4) for v in result["rotation"]["mse"].tolist()]  # 30° strays far from MSE_orig
        [0.0275, 0.25]
        >>> result["rotation"]["kept"].tolist(), result["rotation"]["violations"].flatten().tolist()
        ([[True], [False]], [1, 0])
        >>> int(result["fog"]["violations"]), int(result["total"]["violations"]), int(result["total"]["inputs"])
        (2, 3, 12)
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    inputs: Tensor
    violations: Tensor
    squared_error_sum: Tensor
    mse_orig: Tensor
    mse_orig_min: Tensor

    def __init__(
        self,
        properties: Sequence[Any] | Mapping[str, Sequence[float]],
        task: str = "regression",
        lambdas: Sequence[float] = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10),
        epsilons: Sequence[float] = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1),
        unfiltered: Sequence[str] = UNFILTERED,
        **kwargs: Any,
    ) -> None:
        self.task = _check_task(task)
        self.properties = _check_properties(properties)
        self.lambdas = _numbers("lambdas", lambdas, strict=True)
        self.epsilons = _numbers("epsilons", epsilons, strict=False)
        if isinstance(unfiltered, str) or not isinstance(unfiltered, Sequence):
            raise ValueError(f"unfiltered: expected a sequence of transformation names, got {unfiltered!r}")
        self.unfiltered = tuple(unfiltered)
        self.filtered = {name: is_filtered(name, self.unfiltered) for name in self.properties}
        super().__init__(**kwargs)
        self._rows: dict[str, tuple[int, int]] = {}
        start = 0
        for name, values in self.properties.items():
            self._rows[name] = (start, start + len(values))
            start += len(values)
        long = torch.long
        self.add_state("inputs", torch.zeros(start, dtype=long), dist_reduce_fx="sum")
        if self.task == "classification":
            self.add_state("violations", torch.zeros(start, dtype=long), dist_reduce_fx="sum")
        else:
            self.add_state("violations", torch.zeros(start, len(self.lambdas), dtype=long), dist_reduce_fx="sum")
            self.add_state("squared_error_sum", torch.zeros(start, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("mse_orig", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="max")
            self.add_state("mse_orig_min", torch.tensor(math.inf, dtype=torch.float64), dist_reduce_fx="min")

    def _wrap_compute(self, compute: Callable) -> Callable:
        # torchmetrics squeezes every one-element tensor of the result to 0-d; give them their documented shapes back
        wrapped = super()._wrap_compute(compute)

        @functools.wraps(wrapped)
        def shaped(*args: Any, **kwargs: Any) -> Any:
            return self._shaped(wrapped(*args, **kwargs))

        return shaped

    def _shaped(self, result: Any) -> Any:
        """``result`` with every tensor in its documented shape (see the class docstring)."""
        if not isinstance(result, dict):
            return result
        lambdas, epsilons = len(self.lambdas), len(self.epsilons)
        regression = self.task == "regression"
        counts = (lambdas, epsilons) if regression else ()
        shapes: dict[str, dict[str, tuple[int, ...]]] = {}
        for name, values in self.properties.items():
            p = len(values)
            shapes[name] = {"inputs": (p,), "violations": (p, *counts), "rate": (p, *counts)}
            if regression:
                shapes[name] |= {"mse": (p,), "kept": (p, epsilons)}
        shapes[_TOTAL] = {"violations": counts, "inputs": (), "rate": counts, "mse_orig": ()}
        return {
            name: {
                key: value.reshape(shapes[name][key])
                if isinstance(value, Tensor) and key in shapes.get(name, {})
                else value
                for key, value in entry.items()
            }
            if isinstance(entry, dict)
            else entry
            for name, entry in result.items()
        }

    def _row(self, prop: object, parameter: object) -> int:
        """The state row of ``(property, parameter)`` (rules in the class docstring)."""
        if not isinstance(prop, str) or prop not in self.properties:
            raise ValueError(f"property: unknown {prop!r}; known properties: {list(self.properties)}")
        values = self.properties[prop]
        start = self._rows[prop][0]
        expected = f"one of {prop!r}'s values {list(values)} or an index in [0, {len(values)})"
        if isinstance(parameter, Tensor):
            if parameter.numel() != 1 or parameter.dtype == torch.bool or parameter.is_complex():
                raise ValueError(f"parameter: expected {expected}, got a tensor of shape {tuple(parameter.shape)}")
            parameter = parameter.item()
        if isinstance(parameter, bool) or not isinstance(parameter, Real):
            raise ValueError(f"parameter: expected {expected}, got {parameter!r}")
        if isinstance(parameter, Integral):
            p = int(parameter)
            integer_values = all(isinstance(v, int) for v in values)
            as_value = [i for i, v in enumerate(values) if integer_values and v == p]
            as_index = p if 0 <= p < len(values) else None
            if as_value and as_index is not None and as_value[0] != as_index:
                raise ValueError(
                    f"parameter: {p} is ambiguous for {prop!r}: the value at index {as_value[0]} and the "
                    f"index of the value {values[p]}; give the values as floats to pass indices"
                )
            if as_value:
                return start + as_value[0]
            if as_index is not None:
                return start + as_index
            raise ValueError(f"parameter: expected {expected}, got {p}")
        matches = [i for i, v in enumerate(values) if math.isclose(v, parameter, rel_tol=_REL_TOL, abs_tol=1e-12)]
        if not matches:
            raise ValueError(f"parameter: expected {expected}, got {parameter!r}")
        return start + matches[0]

    def update(
        self,
        transformed_outputs: Tensor,
        property: str,
        parameter: float | int | None = None,
        source_outputs: Tensor | None = None,
        target: Tensor | None = None,
        mse_orig: float | Tensor | None = None,
    ) -> None:
        """Add one batch transformed by ``property`` at ``parameter`` (arguments as in the class docstring)."""
        if parameter is not None:
            self._add(self._row(property, parameter), transformed_outputs, source_outputs, target, mse_orig)
            return
        if not isinstance(property, str) or property not in self.properties:
            raise ValueError(f"property: unknown {property!r}; known properties: {list(self.properties)}")
        start, stop = self._rows[property]
        if not isinstance(transformed_outputs, Tensor) or len(transformed_outputs) != stop - start:
            shape = tuple(transformed_outputs.shape) if isinstance(transformed_outputs, Tensor) else transformed_outputs
            raise ValueError(
                f"transformed_outputs: expected the outputs at {property!r}'s {stop - start} parameters stacked "
                f"(P, B, ...) when no parameter is given, got {shape}"
            )
        for row, outputs in zip(range(start, stop), transformed_outputs, strict=True):
            self._add(row, outputs, source_outputs, target, mse_orig)

    def _add(
        self,
        row: int,
        transformed_outputs: Tensor,
        source_outputs: Tensor | None,
        target: Tensor | None,
        mse_orig: float | Tensor | None,
    ) -> None:
        device = self.inputs.device
        if self.task == "classification":
            if source_outputs is None:
                raise ValueError(
                    "source_outputs: the classification relation compares labels with the sources'; "
                    "pass the logits (B, K) on the source inputs, got None"
                )
            changed = _classification_violations(
                source_outputs, transformed_outputs, ("source_outputs", "transformed_outputs")
            )
            self.inputs[row] += changed.numel()
            self.violations[row] += changed.sum().to(device)
            return
        preds = check_outputs("regression", transformed_outputs, "transformed_outputs")
        batch = preds.shape[0]
        if target is None:
            raise ValueError("target: the regression relation (eq. 2) needs the sources' labels (B,), got None")
        if mse_orig is None:
            raise ValueError(
                "mse_orig: the regression relation (eq. 2) needs the model's MSE on the source inputs of the whole "
                "probe set (all processes), got None"
            )
        target = _check_target(target, batch)
        if source_outputs is not None:
            source = check_outputs("regression", source_outputs, "source_outputs")
            if source.shape != preds.shape:
                raise ValueError(
                    f"source_outputs: expected {batch} predictions like transformed_outputs, got {source.shape[0]}"
                )
        mse = _check_mse("mse_orig", mse_orig, device)
        squared = _squared_errors(preds, target).to(device)
        lambdas = torch.tensor(self.lambdas, dtype=torch.float64, device=device)
        self.inputs[row] += batch
        self.violations[row] += _regression_violations(squared, mse, lambdas).sum(dim=0)
        self.squared_error_sum[row] += squared.sum()
        self.mse_orig = torch.maximum(self.mse_orig, mse)
        self.mse_orig_min = torch.minimum(self.mse_orig_min, mse)

    def compute(self) -> dict[str, dict[str, Tensor]]:
        """Counts, rates, MSEs and the eq. 3 filter per transformation, and the totals (see the class docstring)."""
        total_inputs = self.inputs.sum()
        if int(total_inputs) == 0:
            raise ValueError(f"{type(self).__name__}: no inputs were added")
        results: dict[str, dict[str, Tensor]] = {}
        if self.task == "classification":
            for name, (start, stop) in self._rows.items():
                inputs, violations = self.inputs[start:stop].clone(), self.violations[start:stop].clone()
                results[name] = {"inputs": inputs, "violations": violations, "rate": violations / inputs.double()}
            total = self.violations.sum()
            results[_TOTAL] = {"violations": total, "inputs": total_inputs, "rate": total / total_inputs.double()}
            return results
        low, high = self.mse_orig_min, self.mse_orig
        if not bool(torch.isclose(low, high, rtol=1e-6, atol=1e-12)):
            raise ValueError(
                f"mse_orig: updates were given different values, from {float(low):.6g} to {float(high):.6g}; pass "
                "every update the model's MSE on the source inputs of the whole probe set, over all processes"
            )
        epsilons = torch.tensor(self.epsilons, dtype=torch.float64, device=self.inputs.device)
        total = torch.zeros(len(self.lambdas), len(self.epsilons), dtype=torch.long, device=self.inputs.device)
        for name, (start, stop) in self._rows.items():
            inputs = self.inputs[start:stop].clone()
            mse = self.squared_error_sum[start:stop] / inputs.double()
            if self.filtered[name]:
                kept = _passes_filter(mse, high, epsilons)
            else:
                kept = torch.ones(len(inputs), len(self.epsilons), dtype=torch.bool, device=inputs.device)
            violations = self.violations[start:stop, :, None] * kept[:, None, :]
            total += violations.sum(dim=0)
            rate = violations / inputs.double()[:, None, None]
            results[name] = {"inputs": inputs, "violations": violations, "rate": rate, "mse": mse, "kept": kept}
        results[_TOTAL] = {
            "violations": total,
            "inputs": total_inputs,
            "rate": total / total_inputs.double(),
            "mse_orig": high.clone(),
        }
        return results
