"""DeepTest's metamorphic test (SPEC §2): every property at every parameter, and the violations that count.

One run, usable without Lightning and shared by :class:`~dlguard.callbacks.MetamorphicCallback` and
``recipes/deeptest_roads.py``: the model's outputs on the probe inputs and on each transformed copy,
``MSE_orig`` over every process's probe set (regression), and the transformed inputs that violate the
relation -- for regression after eq. 3's filter, whose per-(property, parameter) MSE also covers every
process -- with their sources' labels, ready for a failure bank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dlguard import _distributed
from dlguard._random import content_keys
from dlguard._validation import (
    check_labels,
    check_tensor,
    check_values,
    finite_float,
    one_of,
    optional_positive_int,
)
from dlguard.augment.properties import Property, check_properties, check_property_inputs
from dlguard.generate.failures import Failures
from dlguard.generate.outputs import Task, model_outputs, pass_outputs
from dlguard.metrics.functional.metamorphic import (
    TASKS,
    MetamorphicRelation,
    is_filtered,
    passes_filter,
    squared_errors,
)
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation
from dlguard.probes.packing import packed_passes

__all__ = ["MetamorphicFailures", "MetamorphicRun", "check_relation", "check_task_target", "metamorphic_test"]


@dataclass
class MetamorphicFailures(Failures):
    """Violations that count, with the sources' labels, and where each came from.

    Attributes:
        rows: ``(F,)`` the source's row in the run's ``inputs``.
        outputs: ``(F, K)`` or ``(F,)`` the model's outputs on the violating inputs.
        properties: the property of each violation.
        levels: ``(F,)`` the index of its parameter in the property's ``levels``.
    """

    rows: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    outputs: Tensor = field(default_factory=lambda: torch.zeros(0))
    properties: list[str] = field(default_factory=list)
    levels: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))


@dataclass
class MetamorphicRun:
    """What one metamorphic test ran, on this process's shard of the probe set.

    Feed it to :class:`~dlguard.metrics.MetamorphicViolations`, one ``update(outputs, name,
    source_outputs=run.outputs, target=run.target, mse_orig=run.mse_orig)`` per property of
    ``run.transformed_outputs``; its counts sum over processes.

    Attributes:
        inputs: ``(B, ...)`` the sources, on the model's device.
        target: ``(B,)`` their labels (class labels, or float targets for regression).
        keys: ``(B,)`` their content keys (keyed properties' draws).
        outputs: the model on the sources: logits ``(B, K)`` or predictions ``(B,)``.
        transformed_outputs: ``{property: (L_p, B, K) or (L_p, B)}`` the model on every transformed copy.
        mse_orig: regression: the model's MSE on every process's sources (eq. 2's ``MSE_orig``); else ``None``.
        kept: ``{property: (L_p,)}`` which parameters count (eq. 3 with ``epsilon``; all for classification).
        failures: the violations that count (:class:`MetamorphicFailures`).
        task: ``"classification"`` or ``"regression"``.
    """

    inputs: Tensor
    target: Tensor
    keys: Tensor
    outputs: Tensor
    transformed_outputs: dict[str, Tensor]
    mse_orig: float | None
    kept: dict[str, Tensor]
    failures: MetamorphicFailures
    task: Task


def check_relation(task: object, lam: object, epsilon: object) -> None:
    """The relation's settings: ``task`` one of ``TASKS``, eq. 2's ``λ > 0``, eq. 3's ``ε ≥ 0``."""
    one_of("task", task, TASKS)
    if finite_float("lam", lam) <= 0:
        raise ValueError(f"lam: expected λ > 0, got {lam}")
    if finite_float("epsilon", epsilon) < 0:
        raise ValueError(f"epsilon: expected ε >= 0, got {epsilon}")


def check_task_target(task: str, target: Tensor, batch: int) -> Tensor:
    """Targets the task reads: class labels ``(B,)``, or one float per input for regression (returned ``(B,)``)."""
    if task == "classification":
        if target.is_floating_point():
            raise ValueError(
                "task: 'classification' needs integer class labels, the targets are floats "
                f"({target.dtype}, e.g. steering angles); use task='regression'"
            )
        return check_labels("target", target, batch=batch)
    if not target.is_floating_point() or target.reshape(len(target), -1).shape[1] != 1 or len(target) != batch:
        raise ValueError(
            "task: 'regression' needs one float target per input (e.g. a steering angle), got "
            f"{target.dtype} targets of shape {tuple(target.shape)}; class labels need task='classification'"
        )
    return target.reshape(batch).float()


def _mse(squared_sum: Tensor, count: Tensor) -> Tensor:
    """Means over every process: ``Σ (ŷ − y)² / n`` per entry (0 where no process had an input)."""
    totals = _distributed.all_sum(torch.stack([squared_sum, count]).double())
    return torch.where(totals[1] > 0, totals[0] / totals[1].clamp(min=1), torch.zeros_like(totals[0]))


def metamorphic_test(
    model: nn.Module | ModelAdapter,
    inputs: Tensor,
    target: Tensor,
    properties: Sequence[Property],
    *,
    task: Task = "classification",
    lam: float = 5.0,
    epsilon: float = 0.03,
    keys: Tensor | None = None,
    max_batch: int | None = None,
    validate_args: bool = True,
) -> MetamorphicRun:
    """Apply every property at every parameter to ``inputs`` and check the metamorphic relation (SPEC §2).

    - ``task="classification"``: a transformed input violates the relation when its predicted label
      differs from its source's.
    - ``task="regression"`` (steering, eq. 2): it violates when ``(ŷ' − y)² > λ·MSE_orig``, ``MSE_orig``
      the model's MSE on every process's sources; a (property, parameter) counts only when its
      ``|MSE_trans − MSE_orig| ≤ ε`` (eq. 3, over every process), except fog, rain and compositions.

    Keyed properties (fog, rain, noise) draw per input from ``keys``, so every epoch and process
    transforms an input alike. The model runs in eval mode without gradients and is left as found.
    Under DDP every process must call this (``MSE_orig`` and eq. 3 are all-reduced).

    Args:
        model: the network or a :class:`~dlguard.probes.ModelAdapter` (``preprocess`` after transforming).
        inputs: ``(B, ...)`` the sources (images ``(B, C, H, W)`` in ``[0, 1]`` for image properties).
        target: ``(B,)`` class labels, or float targets (``(B,)``/``(B, 1)``) for regression.
        properties: the transformations, each with its parameter values (``Property.levels``).
        task: ``"classification"`` or ``"regression"``.
        lam: eq. 2's ``λ > 0`` (regression).
        epsilon: eq. 3's ``ε ≥ 0`` (regression).
        keys: ``(B,)`` int64 content keys of the inputs (default: :func:`~dlguard._random.content_keys`).
        max_batch: inputs per forward pass (``None``: a memory budget, :func:`~dlguard.probes.default_max_batch`).
        validate_args: check the inputs' values against the properties' ranges (NaN included);
            callers that checked them already (a callback's probe set) pass ``False``.

    Returns:
        A :class:`MetamorphicRun`.

    Example:
        >>> import torch
        >>> from dlguard.augment import deeptest_properties
        >>> from dlguard.data import make_roads
        >>> from dlguard.metrics import MetamorphicViolations
        >>> from dlguard.zoo import pretrained
        >>> roads = make_roads(32, seed=2)
        >>> weather = [p for p in deeptest_properties() if p.name in ("fog", "rain")]
        >>> run = metamorphic_test(pretrained("road_epoch"), roads.images, roads.angles, weather, task="regression")
        >>> metric = MetamorphicViolations(weather, task="regression", lambdas=(5.0,), epsilons=(0.03,))
        >>> for name, outputs in run.transformed_outputs.items():
        ...     metric.update(outputs, name, source_outputs=run.outputs, target=run.target, mse_orig=run.mse_orig)
        >>> int(metric.compute()["total"]["violations"]) == len(run.failures)
        True
    """
    check_relation(task, lam, epsilon)
    optional_positive_int("max_batch", max_batch)
    properties = check_properties(properties)
    check_tensor("inputs", inputs)
    check_property_inputs(properties, inputs)
    labels = target  # as given: failures are replayed into batches of targets of this shape
    target = check_task_target(task, target, len(inputs))
    if validate_args:
        for bounds in {prop.value_range for prop in properties}:
            check_values("inputs", inputs, bounds)
    adapter = ModelAdapter.wrap(model)
    device = adapter.device
    inputs, target, labels = inputs.to(device), target.to(device), labels.to(device)
    keys = content_keys(inputs) if keys is None else keys.to(device)
    relation = MetamorphicRelation(task, lam=lam)
    with evaluation(adapter.model):  # the pass size, once: every call below transforms inputs of one shape
        per_pass = adapter.rows_per_pass(inputs, max_batch) if len(inputs) else 1
    source = model_outputs(adapter, inputs, task, per_pass)
    mse_orig = None
    if task == "regression":
        count = torch.tensor(float(len(target)), device=device, dtype=torch.float64)
        mse_orig = float(_mse(squared_errors(source, target).sum() if len(target) else count * 0, count))
    found: list[tuple[str, int, Tensor, Tensor, Tensor]] = []  # property, level index, rows, outputs, inputs
    squared_sums: list[Tensor] = []
    levels = [(prop, index, level) for prop in properties for index, level in enumerate(prop.levels)]
    per_level: dict[str, list[Tensor]] = {prop.name: [] for prop in properties}
    with evaluation(adapter.model), torch.no_grad():
        if len(inputs):  # every level's transformed inputs, run in full passes across the levels
            moved_levels = (((prop, index), prop(inputs, level, keys)) for prop, index, level in levels)
            swept = packed_passes(lambda part: pass_outputs(adapter, part, task), moved_levels, per_pass)
        else:
            swept = (((prop, index), inputs, model_outputs(adapter, inputs, task)) for prop, index, _ in levels)
        for (prop, index), moved, outputs in swept:
            per_level[prop.name].append(outputs)
            if task == "regression":
                squared_sums.append(squared_errors(outputs, target).sum() if len(target) else count * 0)
            if len(inputs):
                rows = relation.violations(source, outputs, target, mse_orig).nonzero().squeeze(1)
                if len(rows):
                    found.append((prop.name, index, rows, outputs[rows], moved[rows]))
    transformed = {name: torch.stack(outputs) for name, outputs in per_level.items()}
    kept = {prop.name: torch.ones(len(prop.levels), dtype=torch.bool, device=device) for prop in properties}
    if task == "regression":
        assert mse_orig is not None
        mse_trans = _mse(torch.stack(squared_sums), count.expand(len(squared_sums))).split(
            [len(p.levels) for p in properties]
        )
        for prop, mse in zip(properties, mse_trans, strict=True):
            if is_filtered(prop.name):
                kept[prop.name] = passes_filter(mse, mse_orig, epsilon)
    counted = [entry for entry in found if bool(kept[entry[0]][entry[1]])]
    failures = MetamorphicFailures(
        inputs=torch.cat([moved for *_, moved in counted]) if counted else inputs[:0],
        labels=torch.cat([labels[rows] for _, _, rows, _, _ in counted]) if counted else labels[:0],
        rows=torch.cat([rows for _, _, rows, _, _ in counted]) if counted else torch.zeros(0, dtype=torch.long),
        outputs=torch.cat([outputs for _, _, _, outputs, _ in counted]) if counted else source[:0],
        properties=[name for name, _, rows, _, _ in counted for _ in range(len(rows))],
        levels=torch.tensor([index for _, index, rows, _, _ in counted for _ in range(len(rows))], dtype=torch.long),
    )
    return MetamorphicRun(inputs, target, keys, source, transformed, mse_orig, kept, failures, task)
