"""The comprehensive framework's sweep (SPEC §5): every property at every severity, then pairs for the adder."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dlguard import _distributed
from dlguard._random import content_keys
from dlguard._validation import check_labels, check_tensor, check_values, positive_int
from dlguard.augment.properties import Property
from dlguard.generate.dscore import logit_width
from dlguard.metrics.functional.robustness import LocalRobustnessResult
from dlguard.metrics.robustness import AdderGlobalRobustness, LocalRobustness
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

__all__ = ["RobustnessSweep", "robustness_sweep"]


@dataclass
class RobustnessSweep:
    """What a sweep measured; every number covers all processes.

    Attributes:
        local: ``{property: LocalRobustnessResult}`` (``LR_{c,p}``, ``LR_p``, confidences per level).
        adder: ``{property: (GR per level, GR per level and class pair)}``; empty without ``combine``.
        pairs: the adder's pair records (``property_index``, ``level``, ``targets``, ``predictions``)
            for :func:`~dlguard.report.summarize_errors`, identical on every process; ``None``
            without ``combine``.
        failures: ``(inputs, labels)``: perturbed inputs of this process's shard the model got
            wrong, at most ``max_failures``, with their true labels (for a failure bank).
        num_classes: ``K``.
    """

    local: dict[str, LocalRobustnessResult]
    adder: dict[str, tuple[Tensor, Tensor]]
    pairs: dict[str, Tensor] | None
    failures: tuple[Tensor, Tensor]
    num_classes: int


def _check_properties(properties: Sequence[Property], inputs: Tensor) -> None:
    names = [getattr(p, "name", None) for p in properties]
    if not properties or not all(isinstance(p, Property) for p in properties) or len(set(names)) != len(names):
        raise ValueError(f"properties: expected Property objects with distinct names, got {names}")
    for prop in properties:
        if getattr(prop, "needs_images", False) and inputs.ndim != 4:
            raise ValueError(
                f"properties: {prop.name!r} needs images (B, C, H, W) but the inputs have shape "
                f"{tuple(inputs.shape)}; for other tensors use properties that take any shape (noise, brightness)"
            )
    for bounds in {getattr(prop, "value_range", (0.0, 1.0)) for prop in properties}:
        check_values("inputs", inputs, bounds)


def _keep(
    pool: tuple[Tensor, Tensor] | None, new: tuple[Tensor, Tensor], limit: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Append the ``new`` (inputs, labels) rows and keep a uniform random ``limit`` of them."""
    inputs, labels = new if pool is None else (torch.cat([pool[0], new[0]]), torch.cat([pool[1], new[1]]))
    if len(labels) > limit:
        chosen = torch.randperm(len(labels), generator=generator)[:limit].to(labels.device)
        inputs, labels = inputs[chosen], labels[chosen]
    return inputs, labels


def robustness_sweep(
    model: nn.Module | ModelAdapter,
    inputs: Tensor,
    target: Tensor,
    properties: Sequence[Property],
    *,
    num_classes: int | None = None,
    pairs: int = 1000,
    combine: Callable[[Tensor, Tensor], Tensor] | None = None,
    keys: Tensor | None = None,
    seed: int = 0,
    max_batch: int = 1024,
    max_failures: int = 0,
) -> RobustnessSweep:
    """Apply each property at each level to ``inputs``; local robustness, the adder's pairs, the failures.

    The model runs in eval mode, in passes of at most ``max_batch`` inputs, and is left exactly as
    found. Random properties draw from ``keys`` (one per input; default: content keys), so an input
    is perturbed alike in every epoch and whatever process it is on; properties without keyed
    randomness draw from the global RNG reseeded with ``seed`` inside a forked RNG state (training's
    randomness is untouched). With ``combine``, ``pairs`` input pairs per property are drawn over the
    whole probe set (all processes' shards, in key order, the same draw on every process) and judged
    by the adder at every level, both inputs perturbed alike; each process adds its share of the
    pairs, so the summed metric is the one-process value. Under DDP every process must call this.

    Args:
        model: the network or a :class:`~dlguard.probes.ModelAdapter` (``preprocess`` after perturbing).
        inputs: ``(B, ...)`` this process's probe inputs (images ``(B, C, H, W)`` in ``[0, 1]`` for
            image properties).
        target: ``(B,)`` labels.
        properties: the properties, each with increasing levels.
        num_classes: ``K``; default the width of the model's logits.
        pairs: adder pairs per property.
        combine: the adder's combination of two labels (e.g. :func:`~dlguard.metrics.functional.digit_sum`
            for digits); ``None`` skips global robustness.
        keys: ``(B,)`` int64 keys of the inputs (a :class:`~dlguard.data.ProbeSet`'s ``keys``).
        seed: seed of the pairs and of unkeyed random properties.
        max_batch: rows per forward pass.
        max_failures: failing perturbed inputs to return (a uniform random subset).

    Example:
        >>> import torch
        >>> from dlguard.augment import Property
        >>> from dlguard.augment.functional import brightness_scale
        >>> class Bright(torch.nn.Module):  # class 1 when the mean pixel exceeds 0.5
        ...     def forward(self, x):
        ...         return torch.stack([x.mean((1, 2, 3)) * 0 + 0.5, x.mean((1, 2, 3))], 1)
        >>> prop = Property("bright", brightness_scale, (1.0, 3.0))
        >>> images, labels = torch.full((4, 1, 2, 2), 0.3), torch.zeros(4, dtype=torch.long)
        >>> sweep = robustness_sweep(Bright(), images, labels, [prop], pairs=5, combine=torch.add)
        >>> sweep.local["bright"].per_level.tolist(), sweep.pairs["targets"].shape
        ([1.0, 0.0], torch.Size([10, 2]))
    """
    positive_int("pairs", pairs)
    positive_int("max_batch", max_batch)
    positive_int("max_failures", max_failures, minimum=0)
    check_tensor("inputs", inputs)
    check_labels("target", target, batch=len(inputs))
    _check_properties(properties, inputs)
    adapter = model if isinstance(model, ModelAdapter) else ModelAdapter(model)
    device = adapter.device
    inputs, target = inputs.to(device), target.to(device)
    keys = content_keys(inputs, seed) if keys is None else keys.to(device)
    classes = num_classes or logit_width(adapter, inputs)
    check_labels("target", target, num_classes=classes)
    levels = max(len(p.levels) for p in properties)
    local = LocalRobustness(classes, properties, levels).to(device)
    adder = None if combine is None else AdderGlobalRobustness(classes, properties, levels, combine).to(device)
    predictions = torch.zeros(len(properties), levels, len(inputs), dtype=torch.long, device=device)
    failed: tuple[Tensor, Tensor] | None = None
    chooser = torch.Generator().manual_seed(seed + _distributed.rank())
    forked = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked), evaluation(adapter.model), torch.no_grad():
        torch.manual_seed(seed)  # unkeyed random properties see the same draws every epoch
        for index, prop in enumerate(properties):
            per_level = []
            for level_index, level in enumerate(prop.levels):
                logits, offset = [], 0
                for part, part_keys in zip(inputs.split(max_batch), keys.split(max_batch), strict=True):
                    perturbed = (
                        prop(part, level, keys=part_keys) if getattr(prop, "keyed", False) else prop(part, level)
                    )
                    logits.append(adapter.logits(perturbed, num_classes=classes))
                    if max_failures:
                        part_target = target[offset : offset + len(part)]
                        wrong = logits[-1].argmax(dim=1) != part_target
                        failed = _keep(failed, (perturbed[wrong], part_target[wrong]), max_failures, chooser)
                    offset += len(part)
                level_logits = torch.cat(logits) if logits else torch.zeros(0, classes, device=device)
                predictions[index, level_index] = level_logits.argmax(dim=1)
                per_level.append(level_logits)
            stacked = torch.stack(per_level)
            if len(prop.levels) < levels:  # pad to the widest property; padded levels are not reported
                stacked = torch.cat([stacked, stacked[-1:].expand(levels - len(prop.levels), -1, -1)])
            local.update(stacked, target, prop.name)
    records = None if adder is None else _judge_pairs(adder, properties, keys, target, predictions, pairs, seed)
    failures = failed if failed is not None else (inputs.new_zeros((0, *inputs.shape[1:])), target.new_zeros(0))
    return RobustnessSweep(
        local=local.compute(),
        adder={} if adder is None else adder.compute(),
        pairs=records,
        failures=failures,
        num_classes=classes,
    )


def _judge_pairs(
    adder: AdderGlobalRobustness,
    properties: Sequence[Property],
    keys: Tensor,
    target: Tensor,
    predictions: Tensor,
    pairs: int,
    seed: int,
) -> dict[str, Tensor]:
    """Draw pairs over every process's probe inputs (in key order) and feed this process's share to the adder."""
    table = torch.cat([keys.long()[None], target.long()[None], predictions.flatten(0, 1)])  # (2 + P·L, B)
    table = _distributed.gather_cat(table.T).T
    table = table[:, table[0].argsort()]
    labels, every_prediction = table[1], table[2:].view(*predictions.shape[:2], -1)
    generator = torch.Generator().manual_seed(seed)
    mine = (torch.arange(pairs) % _distributed.world_size() == _distributed.rank()).to(keys.device)
    records: dict[str, list[Tensor]] = {"property_index": [], "level": [], "targets": [], "predictions": []}
    for index, prop in enumerate(properties):
        first = torch.randint(table.shape[1], (pairs,), generator=generator).to(keys.device)
        second = torch.randint(table.shape[1], (pairs,), generator=generator).to(keys.device)
        truth = torch.stack([labels[first], labels[second]], 1)
        for level in range(len(prop.levels)):
            predicted = torch.stack([every_prediction[index, level, first], every_prediction[index, level, second]], 1)
            adder.update((predicted[mine, 0], predicted[mine, 1]), (truth[mine, 0], truth[mine, 1]), prop.name, level)
            records["property_index"].append(torch.full((pairs,), index, device=keys.device))
            records["level"].append(torch.full((pairs,), level, device=keys.device))
            records["targets"].append(truth)
            records["predictions"].append(predicted)
    return {key: torch.cat(values) for key, values in records.items()}
