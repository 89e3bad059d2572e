"""Neuron coverage (DeepTest) and the DeepGauge criteria, on layer activations (SPEC §2).

A *neuron* of a layer output ``(B, N)`` is a unit; of ``(B, C, *positions)`` (conv of any
dimension) a channel, whose value is the mean over its positions. Recurrent outputs should be
passed as ``(B, T·H)``, one neuron per time step and unit (the coverage callback does this).
Every criterion is a ratio in ``[0, 1]`` built from per-neuron hit counts, so it does not depend
on input order or on how inputs are split across batches or processes. Activations containing NaN
are refused (a NaN would count as the largest value of its layer and as outside every range).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from dlguard._validation import check_labels, check_tensor, check_values, positive_int, probability

__all__ = [
    "NeuronRange",
    "activation_jaccard_distance",
    "input_bounds",
    "k_multisection_coverage",
    "neuron_boundary_coverage",
    "neuron_coverage",
    "neuron_values",
    "output_impartiality",
    "scale_neuron_values",
    "scaled_neuron_values",
    "strong_neuron_activation_coverage",
    "top_k_neuron_coverage",
]


class NeuronRange(NamedTuple):
    """Per-neuron ``low``/``high`` of one layer over the training data, each ``(N,)``."""

    low: Tensor
    high: Tensor


_HALF = (torch.float16, torch.bfloat16)


def neuron_values(activation: Tensor) -> Tensor:
    """``(B, N)`` neuron values: units of a ``(B, N)`` output, channel means of ``(B, C, ...)``.

    Half-precision activations (``float16``/``bfloat16``, e.g. under ``bf16-mixed``) are averaged
    with a ``float32`` accumulator and give ``float32`` values.

    Example:
        >>> import torch
        >>> neuron_values(torch.arange(8.0).reshape(1, 2, 2, 2))
        tensor([[1.5000, 5.5000]])
        >>> neuron_values(torch.ones(1, 2, 3, 3, dtype=torch.bfloat16)).dtype
        torch.float32
    """
    check_tensor("activations", activation)
    if activation.ndim < 2:
        raise ValueError(f"activations: expected (B, N) or (B, C, ...), got shape {tuple(activation.shape)}")
    half = activation.dtype in _HALF
    if activation.ndim == 2:
        return activation.float() if half else activation
    return activation.flatten(2).mean(dim=2, dtype=torch.float32 if half else None)


def _check_finite_values(values: Tensor) -> None:
    """One NaN check on ``(B, N)`` neuron values (a NaN anywhere in a neuron's positions reaches its mean)."""
    check_values("activations", values, bounds=None)


def _check_activations(activations: object) -> Mapping[str, Tensor]:
    if not isinstance(activations, Mapping) or not activations:
        raise ValueError(f"activations: expected a non-empty {{layer: output}}, got {type(activations).__name__}")
    return activations


def _check_range(name: str, bounds: object) -> NeuronRange:
    """``bounds`` as a :class:`NeuronRange` of two ``(N,)`` tensors with ``low <= high``."""
    try:
        low, high = bounds  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ValueError(
            f"ranges: layer {name!r} needs a NeuronRange(low, high), got {type(bounds).__name__}"
        ) from None
    if not isinstance(low, Tensor) or not isinstance(high, Tensor) or low.shape != high.shape or low.ndim != 1:
        raise ValueError(f"ranges: layer {name!r} needs low and high of the same shape (N,)")
    if (low > high).any():
        raise ValueError(f"ranges: layer {name!r} has low > high")
    return NeuronRange(low, high)


def _check_ranges(ranges: object, activations: Mapping[str, Tensor]) -> dict[str, NeuronRange]:
    """A :class:`NeuronRange` for every layer of ``activations``."""
    if not isinstance(ranges, Mapping) or activations.keys() - ranges.keys():
        missing = sorted(activations.keys() - ranges.keys()) if isinstance(ranges, Mapping) else list(activations)
        raise ValueError(f"ranges: expected a NeuronRange for every layer of activations, missing {missing}")
    return {name: _check_range(name, ranges[name]) for name in activations}


def scaled_neuron_values(activation: Tensor, values: Tensor | None = None) -> Tensor:
    """DeepTest's form: the whole layer output min-max scaled per input, then per neuron.

    Scaling is affine, so the channel mean of the scaled output is the scaled channel mean: one
    pass for the means (skipped when ``values`` are given) and one for each input's min and max,
    never a scaled copy of the output. An input whose layer output is constant gets zeros.

    Example:
        >>> import torch
        >>> scaled_neuron_values(torch.tensor([[0.0, 2.0, 4.0], [1.0, 1.0, 1.0]]))
        tensor([[0.0000, 0.5000, 1.0000],
                [0.0000, 0.0000, 0.0000]])
    """
    values = neuron_values(activation) if values is None else values
    low, high = input_bounds(activation, values.dtype)
    return _scale_values(values, low.unsqueeze(1), high.unsqueeze(1))


def input_bounds(activation: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Each input's smallest and largest value over the whole layer output, two ``(B,)`` in ``dtype``.

    What :func:`scaled_neuron_values` scales by; apart, so that a caller can read a layer output
    once and scale its neuron values later (:func:`scale_neuron_values`; the coverage callback scales
    a whole epoch at once).

    Example:
        >>> import torch
        >>> input_bounds(torch.tensor([[[0.0, 2.0], [4.0, 1.0]]]), torch.float32)
        (tensor([0.]), tensor([4.]))
    """
    flat = activation.flatten(1)
    return flat.amin(dim=1).to(dtype), flat.amax(dim=1).to(dtype)  # ~6x faster than aminmax


def _scale_values(values: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """``(B, N)`` neuron values min-max scaled by their input's ``low``/``high``: ``(B, 1)``, or ``(B, N)`` spread.

    Element-wise only, so scaling one layer or batch at a time, or all side by side, gives the same bits.
    """
    span = high - low
    scaled = (values - low) / span.clamp(min=torch.finfo(values.dtype).tiny)
    # a constant output scales to 0; a NaN span (NaN in the output) stays NaN so checks can see it
    return torch.where(span > 0, scaled, span * 0)


def scale_neuron_values(values: Mapping[str, Tensor], bounds: Mapping[str, tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    """NC's values of several layers: each layer's ``(B, N)`` values min-max scaled by its inputs' bounds.

    ``bounds[name]`` is ``(low, high)``, two ``(B,)`` from :func:`input_bounds` of that layer's output.
    Scaling is element-wise, so the layers are scaled side by side in one go when they share a batch
    and dtype, with the bits of scaling each layer alone.

    Example:
        >>> import torch
        >>> activation = torch.tensor([[0.0, 2.0, 4.0], [1.0, 1.0, 1.0]])
        >>> scaled = scale_neuron_values({"fc": activation}, {"fc": input_bounds(activation, torch.float32)})
        >>> torch.equal(scaled["fc"], scaled_neuron_values(activation))
        True
    """
    if len({(v.shape[0], v.dtype) for v in values.values()}) != 1:  # one by one: the metric refuses other inputs
        return {name: _scale_values(values[name], low[:, None], high[:, None]) for name, (low, high) in bounds.items()}
    sizes = [values[name].shape[1] for name in bounds]

    def spread(which: int) -> Tensor:  # (B, total neurons): each input's bound under each of the layer's neurons
        return torch.cat([b[which][:, None].expand(-1, n) for b, n in zip(bounds.values(), sizes, strict=True)], 1)

    flat = torch.cat([values[name] for name in bounds], dim=1)
    return dict(zip(bounds, _scale_values(flat, spread(0), spread(1)).split(sizes, dim=1), strict=True))


def _check_threshold(threshold: float) -> None:
    probability("threshold", threshold)


def _check_k(k: int, name: str = "k") -> None:
    positive_int(name, k)


# ---- per-layer hit counts (the states of the metrics) ------------------------------------------


def _nc_hits(values: Tensor, threshold: float) -> Tensor:
    """Inputs whose scaled value exceeds ``threshold``, per neuron: ``(N,)``."""
    return (values > threshold).sum(dim=0)


def _kmnc_hits(values: Tensor, bounds: NeuronRange, k: int) -> Tensor:
    """Inputs falling in each of the ``k`` sections of ``[low, high]``, per neuron: ``(N, k)``."""
    low, high = bounds.low.to(values), bounds.high.to(values)
    neurons = values.shape[1]
    width = (high - low).clamp(min=torch.finfo(values.dtype).tiny)
    # ((values - low) / width * k).floor().clamp(0, k - 1), in place on one temporary
    section = (values - low).div_(width).mul_(k).floor_().clamp_(0, k - 1)
    cell = section.long().add_(torch.arange(0, neurons * k, k, device=values.device))
    inside = (values >= low) & (values <= high)
    cell = torch.where(inside, cell, neurons * k)  # outside [low, high]: a discard bin
    return torch.bincount(cell.flatten(), minlength=neurons * k + 1)[:-1].view(neurons, k)


def _upper_hits(values: Tensor, high: Tensor) -> Tensor:
    """Inputs above ``high``, per neuron: ``(N,)``."""
    return (values > high.to(values)).sum(dim=0)


def _boundary_hits(values: Tensor, bounds: NeuronRange) -> tuple[Tensor, Tensor]:
    """Inputs above ``high`` and below ``low``, per neuron: two ``(N,)``."""
    return _upper_hits(values, bounds.high), (values < bounds.low.to(values)).sum(dim=0)


def _top_k_layer_hits(layers: list[Tensor], k: int) -> Tensor:
    """Inputs for which each neuron is among its layer's ``k`` largest, layers side by side: ``(ΣN_l,)``.

    ``layers`` holds each layer's ``(B, N_l)`` values; one count over all of them.
    """
    picked, start = [], 0
    for values in layers:
        picked.append(values.topk(min(k, values.shape[1]), dim=1).indices.flatten() + start)
        start += values.shape[1]
    return torch.bincount(torch.cat(picked), minlength=start)


def _ratio(covered: Tensor, total: int) -> Tensor:
    return covered.sum().double() / total if total else torch.tensor(0.0, dtype=torch.float64)


# ---- functional twins: coverage of a set of inputs in one call ---------------------------------


def _checked_values(
    activations: Mapping[str, Tensor], ranges: Mapping[str, NeuronRange] | None = None, scaled: bool = False
) -> dict[str, Tensor]:
    """Each layer's ``(B, N)`` neuron values (min-max ``scaled`` per input), after one NaN check of all layers.

    With ``ranges`` (already checked), each layer's number of neurons must match its range.
    """
    _check_activations(activations)
    read = scaled_neuron_values if scaled else neuron_values
    values = {name: read(a) for name, a in activations.items()}
    for name, v in values.items():
        if ranges is not None and v.shape[1] != len(ranges[name].low):
            raise ValueError(
                f"ranges: layer {name!r} has {len(ranges[name].low)} neurons, the activations {v.shape[1]}"
            )
    batches = {v.shape[0] for v in values.values()}
    if len(batches) != 1:
        raise ValueError(f"activations: expected every layer to hold the same inputs, got batch sizes {batches}")
    _check_finite_values(torch.cat(list(values.values()), dim=1))
    return values


def neuron_coverage(activations: Mapping[str, Tensor], threshold: float = 0.2) -> Tensor:
    """DeepTest neuron coverage: neurons whose min-max scaled value exceeds ``threshold`` for some input.

    Args:
        activations: ``{layer: output}`` for the same inputs, ``(B, N)`` or ``(B, C, ...)``.
        threshold: in ``[0, 1]``.

    Example:
        >>> import torch
        >>> neuron_coverage({"fc": torch.tensor([[0.0, 1.0, 0.1], [0.0, 2.0, 1.0]])})  # 0.1/1 and 1/2
        tensor(0.6667, dtype=torch.float64)
    """
    _check_threshold(threshold)
    hits = [_nc_hits(v, threshold) for v in _checked_values(activations, scaled=True).values()]
    return _ratio(torch.cat(hits) > 0, sum(len(h) for h in hits))


def k_multisection_coverage(
    activations: Mapping[str, Tensor], ranges: Mapping[str, NeuronRange], k: int = 10
) -> Tensor:
    """KMNC(k): sections of ``[low, high]`` hit, over ``k``·neurons.

    Example:
        >>> import torch
        >>> r = {"fc": NeuronRange(torch.zeros(2), torch.ones(2))}
        >>> k_multisection_coverage({"fc": torch.tensor([[0.1, 0.9], [0.2, 1.5]])}, r, k=4)
        tensor(0.2500, dtype=torch.float64)
    """
    _check_k(k)
    ranges = _check_ranges(ranges, _check_activations(activations))
    values = _checked_values(activations, ranges)
    hits = [_kmnc_hits(v, ranges[name], k) for name, v in values.items()]
    return _ratio(torch.cat(hits) > 0, sum(h.numel() for h in hits))


def neuron_boundary_coverage(activations: Mapping[str, Tensor], ranges: Mapping[str, NeuronRange]) -> Tensor:
    """NBC: ``(#neurons above high + #neurons below low) / (2·#neurons)``.

    Example:
        >>> import torch
        >>> r = {"fc": NeuronRange(torch.zeros(2), torch.ones(2))}
        >>> neuron_boundary_coverage({"fc": torch.tensor([[-0.5, 0.5], [2.0, 0.5]])}, r)
        tensor(0.5000, dtype=torch.float64)
    """
    ranges = _check_ranges(ranges, _check_activations(activations))
    pairs = [_boundary_hits(v, ranges[name]) for name, v in _checked_values(activations, ranges).items()]
    upper = torch.cat([p[0] for p in pairs])
    lower = torch.cat([p[1] for p in pairs])
    return _ratio(torch.cat([upper > 0, lower > 0]), 2 * len(upper))


def strong_neuron_activation_coverage(activations: Mapping[str, Tensor], ranges: Mapping[str, NeuronRange]) -> Tensor:
    """SNAC: ``#neurons with a value above high / #neurons``.

    Example:
        >>> import torch
        >>> r = {"fc": NeuronRange(torch.zeros(2), torch.ones(2))}
        >>> strong_neuron_activation_coverage({"fc": torch.tensor([[-0.5, 0.5], [2.0, 0.5]])}, r)
        tensor(0.5000, dtype=torch.float64)
    """
    ranges = _check_ranges(ranges, _check_activations(activations))
    values = _checked_values(activations, ranges)
    upper = torch.cat([_upper_hits(v, ranges[name].high) for name, v in values.items()])
    return _ratio(upper > 0, len(upper))


def top_k_neuron_coverage(activations: Mapping[str, Tensor], k: int = 2) -> Tensor:
    """TKNC(k): neurons among their layer's top ``k`` for some input, over all neurons.

    Example:
        >>> import torch
        >>> top_k_neuron_coverage({"fc": torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])}, k=1)
        tensor(0.5000, dtype=torch.float64)
    """
    _check_k(k)
    values = _checked_values(activations)
    hits = _top_k_layer_hits(list(values.values()), k)
    return _ratio(hits > 0, len(hits))


def output_impartiality(preds: Tensor, num_classes: int) -> Tensor:
    """Normalised entropy of the predicted-class histogram: 1 when every class is predicted equally.

    Args:
        preds: predicted labels ``(B,)`` or logits ``(B, K)``.
        num_classes: ``K`` (at least 2).

    Example:
        >>> import torch
        >>> output_impartiality(torch.tensor([0, 1, 2, 3]), 4), output_impartiality(torch.tensor([1, 1]), 4)
        (tensor(1., dtype=torch.float64), tensor(0., dtype=torch.float64))
    """
    return _impartiality(_class_counts(preds, num_classes))


def _class_counts(preds: Tensor, num_classes: int) -> Tensor:
    positive_int("num_classes", num_classes, minimum=2)
    check_tensor("preds", preds)
    if preds.ndim == 2:
        if preds.shape[1] != num_classes:
            raise ValueError(f"preds: expected logits (B, {num_classes}), got shape {tuple(preds.shape)}")
        return torch.bincount(preds.argmax(dim=1), minlength=num_classes)
    if preds.ndim != 1:
        raise ValueError(f"preds: expected labels (B,) or logits (B, K), got shape {tuple(preds.shape)}")
    return torch.bincount(check_labels("preds", preds, num_classes=num_classes).long(), minlength=num_classes)


def _impartiality(counts: Tensor) -> Tensor:
    total = counts.sum()
    if total == 0:
        raise ValueError("OutputImpartiality: no predictions were added")
    p = counts.double() / total
    entropy = torch.where(p > 0, p * p.reciprocal().log(), 0.0).sum()  # Σ p·log(1/p), never -0.0
    return entropy / torch.log(torch.tensor(float(len(counts)), dtype=torch.float64))


def activation_jaccard_distance(set_a: Tensor | Mapping[str, Tensor], set_b: Tensor | Mapping[str, Tensor]) -> Tensor:
    """``1 − |A ∩ B| / |A ∪ B|`` of the neurons two input sets activate (DeepTest RQ2).

    Args:
        set_a: boolean mask of activated neurons, or ``{layer: mask}`` (same layers in ``set_b``).
        set_b: the same for the other input set.

    Returns:
        The distance in ``[0, 1]``; 0 when both sets are empty.

    Example:
        >>> import torch
        >>> activation_jaccard_distance(torch.tensor([True, True, False]), torch.tensor([True, False, True]))
        tensor(0.6667, dtype=torch.float64)
    """
    if isinstance(set_a, Mapping) or isinstance(set_b, Mapping):
        if not (isinstance(set_a, Mapping) and isinstance(set_b, Mapping)) or set_a.keys() != set_b.keys():
            raise ValueError("set_a and set_b: expected masks of the same layers")
        names = list(set_a)
        set_a = torch.cat([set_a[name].flatten() for name in names])
        set_b = torch.cat([set_b[name].flatten() for name in names])
    check_tensor("set_a", set_a)
    check_tensor("set_b", set_b)
    if set_a.shape != set_b.shape:
        raise ValueError(f"set_a and set_b: expected the same shape, got {tuple(set_a.shape)} and {tuple(set_b.shape)}")
    a, b = set_a.bool(), set_b.bool()
    union = (a | b).sum()
    if union == 0:
        return torch.tensor(0.0, dtype=torch.float64)
    return 1 - (a & b).sum().double() / union
