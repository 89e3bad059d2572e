"""The comprehensive framework's sweep (SPEC §5): every property at every severity, then pairs for the adder."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from dlguard import _distributed
from dlguard._random import content_keys
from dlguard._validation import check_labels, check_tensor, check_values, optional_positive_int, positive_int
from dlguard.augment.properties import Property, check_properties, check_property_inputs
from dlguard.generate.outputs import check_num_classes, logit_width
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation
from dlguard.probes.packing import packed_passes

__all__ = ["RobustnessSweep", "robustness_sweep"]


@dataclass
class RobustnessSweep:
    """What one robustness sweep ran: this process's shard of the probe set, and the adder's pairs.

    Feed it to :class:`~dlguard.metrics.LocalRobustness` (one ``update(run.logits[name], run.target,
    name)`` per property) and :class:`~dlguard.metrics.AdderGlobalRobustness` (one
    ``update(*run.adder_share)``); their states sum over processes, so ``compute()`` gives the whole
    probe set's numbers.

    Attributes:
        inputs: ``(B, ...)`` the probe inputs, on the model's device.
        target: ``(B,)`` their labels.
        keys: ``(B,)`` their content keys (the keyed properties' draws).
        logits: ``{property: (L_p, B, K)}`` the model's logits at each of the property's levels.
        pairs: the adder's pair records of every process, identical on each (``property_index``,
            ``level``, ``targets (M, 2)``, ``predictions (M, 2)``), for
            :func:`~dlguard.report.summarize_errors`; ``None`` without ``combine``.
        adder_share: the pairs this process counts -- ``(predictions, targets, property_index,
            level)`` as :meth:`~dlguard.metrics.AdderGlobalRobustness.update` takes them -- so that
            each pair is counted once over all processes; ``None`` without ``combine``.
        failures: ``(inputs, labels)``: perturbed inputs of this process's shard the model got
            wrong, at most ``max_failures``, with their true labels (for a failure bank).
        num_classes: ``K``.
    """

    inputs: Tensor
    target: Tensor
    keys: Tensor
    logits: dict[str, Tensor]
    pairs: dict[str, Tensor] | None
    adder_share: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor], Tensor, Tensor] | None
    failures: tuple[Tensor, Tensor]
    num_classes: int


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
    max_batch: int | None = None,
    max_failures: int = 0,
    validate_args: bool = True,
) -> RobustnessSweep:
    """Apply each property at each level to ``inputs``; the logits, the adder's pairs and the failures.

    The model runs in eval mode, in passes of at most ``max_batch`` inputs, and is left exactly as
    found. Random properties draw from ``keys`` (one per input; default: content keys), so an input
    is perturbed alike in every epoch and whatever process it is on; properties without keyed
    randomness draw from the global RNG reseeded with ``seed`` inside a forked RNG state (training's
    randomness is untouched). With ``combine``, ``pairs`` input pairs per property are drawn over the
    whole probe set (all processes' shards, in key order, the same draw on every process) and judged
    at every level, both inputs perturbed alike; each process counts its share of the pairs
    (``adder_share``), so the summed metric is the one-process value. Under DDP every process must
    call this.

    Args:
        model: the network or a :class:`~dlguard.probes.ModelAdapter` (``preprocess`` after perturbing).
        inputs: ``(B, ...)`` this process's probe inputs (images ``(B, C, H, W)`` in ``[0, 1]`` for
            image properties).
        target: ``(B,)`` labels.
        properties: the properties, each with increasing levels.
        num_classes: ``K``; default the width of the model's logits (checked against it when given).
        pairs: adder pairs per property.
        combine: the adder's combination of two labels (e.g. :func:`~dlguard.metrics.functional.digit_sum`
            for digits); ``None`` skips global robustness.
        keys: ``(B,)`` int64 keys of the inputs (a :class:`~dlguard.data.ProbeSet`'s ``keys``).
        seed: seed of the pairs and of unkeyed random properties.
        max_batch: rows per forward pass (``None``: a memory budget, :func:`~dlguard.probes.default_max_batch`).
        max_failures: failing perturbed inputs to return (a uniform random subset).
        validate_args: check the inputs' values against the properties' ranges and the labels' range;
            callers that checked them already (a callback's probe set) pass ``False``.

    Example:
        >>> import torch
        >>> from dlguard.augment import Property
        >>> from dlguard.augment.functional import brightness_scale
        >>> from dlguard.metrics import LocalRobustness
        >>> class Bright(torch.nn.Module):  # class 1 when the mean pixel exceeds 0.5
        ...     def forward(self, x):
        ...         return torch.stack([x.mean((1, 2, 3)) * 0 + 0.5, x.mean((1, 2, 3))], 1)
        >>> prop = Property("bright", brightness_scale, (1.0, 3.0))
        >>> images, labels = torch.full((4, 1, 2, 2), 0.3), torch.zeros(4, dtype=torch.long)
        >>> run = robustness_sweep(Bright(), images, labels, [prop], pairs=5, combine=torch.add)
        >>> local = LocalRobustness(run.num_classes, [prop], levels=2)
        >>> local.update(run.logits["bright"], run.target, "bright")
        >>> local.compute()["bright"].per_level.tolist(), run.pairs["targets"].shape
        ([1.0, 0.0], torch.Size([10, 2]))
    """
    positive_int("pairs", pairs)
    optional_positive_int("max_batch", max_batch)
    positive_int("max_failures", max_failures, minimum=0)
    check_tensor("inputs", inputs)
    check_labels("target", target, batch=len(inputs))
    properties = check_properties(properties)
    check_property_inputs(properties, inputs)
    if validate_args:
        for bounds in {prop.value_range for prop in properties}:
            check_values("inputs", inputs, bounds)
    adapter = ModelAdapter.wrap(model)
    device = adapter.device
    inputs, target = inputs.to(device), target.to(device)
    keys = content_keys(inputs, seed) if keys is None else keys.to(device)
    classes = check_num_classes(num_classes, logit_width(adapter, inputs), "inputs")
    if validate_args:
        check_labels("target", target, num_classes=classes)
    levels = max(len(p.levels) for p in properties)
    logits: dict[str, Tensor] = {}
    predictions = torch.zeros(len(properties), levels, len(inputs), dtype=torch.long, device=device)
    failed: tuple[Tensor, Tensor] | None = None
    chooser = torch.Generator().manual_seed(seed + _distributed.rank())
    forked = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked), evaluation(adapter.model), torch.no_grad():
        torch.manual_seed(seed)  # unkeyed random properties see the same draws every epoch
        rows = adapter.rows_per_pass(inputs, max_batch) if len(inputs) else 1

        def perturbed() -> Iterator[tuple[tuple[int, int, int], Tensor]]:
            for index, prop in enumerate(properties):
                for level_index, level in enumerate(prop.levels):
                    for offset in range(0, len(inputs), rows):  # perturbed a pass's rows at a time
                        part, part_keys = inputs[offset : offset + rows], keys[offset : offset + rows]
                        moved = prop(part, level, keys=part_keys) if prop.keyed else prop(part, level)
                        yield (index, level_index, offset), moved

        swept: dict[tuple[int, int], list[Tensor]] = defaultdict(list)
        run = partial(adapter.logits, num_classes=classes)
        for (index, level_index, offset), moved, part_logits in packed_passes(run, perturbed(), rows):
            swept[index, level_index].append(part_logits)  # every level in full passes across the levels
            if max_failures:
                part_target = target[offset : offset + len(moved)]
                wrong = part_logits.argmax(dim=1) != part_target
                failed = _keep(failed, (moved[wrong], part_target[wrong]), max_failures, chooser)
        empty = torch.zeros(0, classes, device=device)
        for index, prop in enumerate(properties):
            per_level = [torch.cat(swept[index, level] or [empty]) for level in range(len(prop.levels))]
            for level_index, level_logits in enumerate(per_level):
                predictions[index, level_index] = level_logits.argmax(dim=1)
            logits[prop.name] = torch.stack(per_level)
    records = share = None
    if combine is not None:
        records = _draw_pairs(properties, keys, target, predictions, pairs, seed)
        mine = _pair_share(len(records["level"]), pairs, device)
        predicted, truth = records["predictions"][mine], records["targets"][mine]
        share = ((predicted[:, 0], predicted[:, 1]), (truth[:, 0], truth[:, 1]), records["property_index"][mine],
                 records["level"][mine])  # fmt: skip
    failures = failed if failed is not None else (inputs.new_zeros((0, *inputs.shape[1:])), target.new_zeros(0))
    return RobustnessSweep(inputs, target, keys, logits, records, share, failures, classes)


def _pair_share(count: int, pairs: int, device: torch.device) -> Tensor:
    """``(count,)`` the pairs this process counts: pair ``j`` of every (property, level) block on rank ``j % world``."""
    return ((torch.arange(count, device=device) % pairs) % _distributed.world_size()) == _distributed.rank()


def _draw_pairs(
    properties: Sequence[Property],
    keys: Tensor,
    target: Tensor,
    predictions: Tensor,
    pairs: int,
    seed: int,
) -> dict[str, Tensor]:
    """Draw pairs over every process's probe inputs (in key order) and record them at every level."""
    table = torch.cat([keys.long()[None], target.long()[None], predictions.flatten(0, 1)])  # (2 + P·L, B)
    table = _distributed.gather_cat(table.T).T
    table = table[:, table[0].argsort()]
    labels, every_prediction = table[1], table[2:].view(*predictions.shape[:2], -1)
    generator = torch.Generator().manual_seed(seed)
    records: dict[str, list[Tensor]] = {"property_index": [], "level": [], "targets": [], "predictions": []}
    for index, prop in enumerate(properties):
        first = torch.randint(table.shape[1], (pairs,), generator=generator).to(keys.device)
        second = torch.randint(table.shape[1], (pairs,), generator=generator).to(keys.device)
        truth = torch.stack([labels[first], labels[second]], 1)
        for level in range(len(prop.levels)):
            predicted = torch.stack([every_prediction[index, level, first], every_prediction[index, level, second]], 1)
            records["property_index"].append(torch.full((pairs,), index, device=keys.device))
            records["level"].append(torch.full((pairs,), level, device=keys.device))
            records["targets"].append(truth)
            records["predictions"].append(predicted)
    return {key: torch.cat(values) for key, values in records.items()}
