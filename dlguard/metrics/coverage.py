"""Neuron coverage and the DeepGauge criteria as torchmetrics metrics (SPEC §2)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from dlguard._validation import positive_int
from dlguard.metrics.functional.coverage import (
    NeuronRange,
    _boundary_hits,
    _check_finite_values,
    _check_k,
    _check_range,
    _check_threshold,
    _class_counts,
    _impartiality,
    _kmnc_hits,
    _nc_hits,
    _top_k_layer_hits,
    _upper_hits,
    neuron_values,
    scaled_neuron_values,
)

__all__ = [
    "KMultisectionCoverage",
    "NeuronBoundaryCoverage",
    "NeuronCoverage",
    "OutputImpartiality",
    "StrongNeuronActivationCoverage",
    "TopKNeuronCoverage",
]

_PROFILE_HINT = (
    "profile them once on training data: ranges = dlguard.probes.profile_neuron_ranges(model, train_loader, layers)"
)


class _LayerCoverage(Metric):
    """Per-neuron hit counts of several layers in one flat ``sum``-reduced state per kind of hit.

    Subclasses name their states (``_states``), how many slots each neuron has (``_slots``) and
    how the layers' ``(B, N)`` values turn into hits (``_hits``). ``update`` checks the values of
    all layers side by side for NaN once per batch.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    _states: tuple[str, ...] = ("hits",)
    _slots = 1

    def __init__(self, layer_sizes: Mapping[str, int], per_layer: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(layer_sizes, Mapping) or not layer_sizes:
            raise ValueError(f"layer_sizes: expected a non-empty {{layer: number of neurons}}, got {layer_sizes!r}")
        for name, size in layer_sizes.items():
            positive_int(f"layer_sizes[{name!r}]", size)
        if not isinstance(per_layer, bool):
            raise ValueError(f"per_layer: expected a bool, got {per_layer!r}")
        self.layer_sizes = {name: int(size) for name, size in layer_sizes.items()}
        self.per_layer = per_layer
        bounds, start = {}, 0
        for name, size in self.layer_sizes.items():
            bounds[name] = (start, start + size)
            start += size
        self._bounds = bounds
        for state in self._states:
            self.add_state(state, torch.zeros(start * self._slots, dtype=torch.long), dist_reduce_fx="sum")
        # each layer's last neuron and number of slots, so that compute finds every layer's ratio in a few ops,
        # however many layers; plain integers, not buffers: set_dtype(torch.float64) casts every buffer
        self._last = [stop - 1 for _, stop in bounds.values()]
        self._layer_slots = [(stop - first) * self._slots * len(self._states) for first, stop in bounds.values()]

    def _values(self, name: str, activation: Tensor) -> Tensor:
        return neuron_values(activation)

    @abstractmethod
    def _hits(self, values: list[Tensor], flat: Tensor) -> tuple[Tensor, ...]:
        """Hits of every state from each layer's ``(B, N)`` values in layer order, or all of them side by side."""

    def update(self, activations: Mapping[str, Tensor]) -> None:
        """Add a batch: ``{layer: output}`` with every layer given at construction, the same inputs in each.

        Raises:
            ValueError: on a missing or unknown layer, a layer of another width, different batch
                sizes, or NaN activations.
        """
        if not isinstance(activations, Mapping):
            raise ValueError(f"activations: expected {{layer: output}}, got {type(activations).__name__}")
        missing = self.layer_sizes.keys() - activations.keys()
        unknown = activations.keys() - self.layer_sizes.keys()
        if missing or unknown:
            raise ValueError(
                f"activations: expected the layers {list(self.layer_sizes)}, missing {sorted(missing)}, "
                f"unknown {sorted(unknown)}"
            )
        values = []
        for name, size in self.layer_sizes.items():
            layer_values = self._values(name, activations[name])
            if layer_values.shape[1] != size:
                raise ValueError(
                    f"activations: layer {name!r} has {layer_values.shape[1]} neurons, "
                    f"expected {size} as at construction"
                )
            values.append(layer_values)
        if len({v.shape[0] for v in values}) != 1:
            raise ValueError(
                f"activations: expected every layer to hold the same inputs, got batch sizes "
                f"{ {name: v.shape[0] for name, v in zip(self.layer_sizes, values, strict=True)} }"
            )
        # the element-wise criteria run once on all layers side by side: few ops per batch, one check
        flat = torch.cat(values, dim=1)
        _check_finite_values(flat)
        for state, hits in zip(self._states, self._hits(values, flat), strict=True):
            getattr(self, state).add_(hits.flatten())

    def _covered(self) -> Tensor:
        """``(total neurons, slots)``: whether each neuron slot was ever hit."""
        return torch.cat([getattr(self, s).view(-1, self._slots) > 0 for s in self._states], dim=1)

    def covered(self) -> dict[str, Tensor]:
        """``{layer: (N, slots) boolean}`` of this process's states (not synced)."""
        covered = self._covered()
        return {name: covered[start:stop] for name, (start, stop) in self._bounds.items()}

    def compute(self) -> Tensor | dict[str, Tensor]:
        """The coverage ratio; with ``per_layer=True`` ``{"all": ratio, layer: ratio, ...}``."""
        covered = self._covered()
        total = covered.sum().double() / covered.numel()
        if not self.per_layer:
            return total
        last = torch.tensor(self._last, device=covered.device)
        ends = covered.sum(dim=1).cumsum(dim=0)[last]  # slots covered up to each layer's end
        slots = torch.tensor(self._layer_slots, device=covered.device, dtype=torch.float64)
        layers = ends.diff(prepend=ends.new_zeros(1)).double() / slots
        return {"all": total} | dict(zip(self._bounds, layers.unbind(), strict=True))


class NeuronCoverage(_LayerCoverage):
    """DeepTest neuron coverage: share of neurons whose scaled value exceeds ``threshold`` for some input.

    Each input's whole layer output is min-max scaled to ``[0, 1]`` (all zeros when constant), then
    a conv channel's value is its spatial mean. A neuron counts as covered once any input covers it.

    Args:
        layer_sizes: ``{layer: number of neurons}``, in the order the layers are reported.
        threshold: in ``[0, 1]`` (DeepTest: 0.2).
        scale: ``False`` when ``update`` receives ``(B, N)`` values already scaled per input (the
            coverage callback scales while reading activations, to read them once).
        per_layer: also report each layer's coverage.

    Example:
        >>> import torch
        >>> nc = NeuronCoverage({"conv": 2, "fc": 3}, threshold=0.4)
        >>> nc.update({"conv": torch.tensor([[[[0.0, 4.0]], [[1.0, 1.0]]]]), "fc": torch.tensor([[0.0, 1.0, 3.0]])})
        >>> nc.compute()  # conv scaled by 4: channel means 0.5, 0.25; fc scaled by 3: 0, 1/3, 1
        tensor(0.4000, dtype=torch.float64)
    """

    def __init__(
        self,
        layer_sizes: Mapping[str, int],
        threshold: float = 0.2,
        scale: bool = True,
        per_layer: bool = False,
        **kwargs: Any,
    ) -> None:
        _check_threshold(threshold)
        if not isinstance(scale, bool):
            raise ValueError(f"scale: expected a bool, got {scale!r}")
        super().__init__(layer_sizes, per_layer, **kwargs)
        self.threshold, self.scale = threshold, scale

    def _values(self, name: str, activation: Tensor) -> Tensor:
        return scaled_neuron_values(activation) if self.scale else neuron_values(activation)

    def _hits(self, values: list[Tensor], flat: Tensor) -> tuple[Tensor, ...]:
        return (_nc_hits(flat, self.threshold),)


class _RangeCoverage(_LayerCoverage):
    """A criterion that needs per-neuron ``low``/``high`` profiled on training data."""

    def __init__(self, ranges: Mapping[str, NeuronRange] | None = None, per_layer: bool = False, **kwargs: Any) -> None:
        if ranges is None:
            raise ValueError(f"ranges: {type(self).__name__} needs per-neuron ranges; {_PROFILE_HINT}")
        if not isinstance(ranges, Mapping) or not ranges:
            raise ValueError(f"ranges: expected a non-empty {{layer: NeuronRange(low, high)}}, got {ranges!r}")
        ranges = {name: _check_range(name, bounds) for name, bounds in ranges.items()}
        super().__init__({name: len(bounds[0]) for name, bounds in ranges.items()}, per_layer, **kwargs)
        # all layers' ranges side by side, in layer order, moved with the metric
        self.register_buffer("low", torch.cat([low.detach().float() for low, _ in ranges.values()]), persistent=False)
        self.register_buffer(
            "high", torch.cat([high.detach().float() for _, high in ranges.values()]), persistent=False
        )

    @property
    def bounds(self) -> NeuronRange:
        """Every neuron's ``low``/``high``, layers side by side."""
        return NeuronRange(self.low, self.high)


class KMultisectionCoverage(_RangeCoverage):
    """KMNC(k): sections of each neuron's ``[low, high]`` that some input hit, over ``k``·neurons.

    Args:
        ranges: ``{layer: NeuronRange(low, high)}`` from :func:`~dlguard.probes.profile_neuron_ranges`.
        k: sections per neuron (``>= 1``).
        per_layer: also report each layer's coverage.

    Example:
        >>> import torch
        >>> kmnc = KMultisectionCoverage({"fc": NeuronRange(torch.zeros(2), torch.ones(2))}, k=4)
        >>> kmnc.update({"fc": torch.tensor([[0.1, 0.9], [0.2, 1.5]])})  # sections 0, 3 and 0 hit
        >>> kmnc.compute()
        tensor(0.2500, dtype=torch.float64)
    """

    def __init__(
        self, ranges: Mapping[str, NeuronRange] | None = None, k: int = 10, per_layer: bool = False, **kwargs: Any
    ) -> None:
        _check_k(k)
        self._slots = k
        super().__init__(ranges, per_layer, **kwargs)
        self.k = k

    def _hits(self, values: list[Tensor], flat: Tensor) -> tuple[Tensor, ...]:
        return (_kmnc_hits(flat, self.bounds, self.k),)


class NeuronBoundaryCoverage(_RangeCoverage):
    """NBC: ``(#neurons above high + #neurons below low) / (2·#neurons)``.

    Example:
        >>> import torch
        >>> nbc = NeuronBoundaryCoverage({"fc": NeuronRange(torch.zeros(2), torch.ones(2))})
        >>> nbc.update({"fc": torch.tensor([[-0.5, 0.5], [2.0, 0.5]])})
        >>> nbc.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    _states = ("upper", "lower")

    def _hits(self, values: list[Tensor], flat: Tensor) -> tuple[Tensor, ...]:
        return _boundary_hits(flat, self.bounds)


class StrongNeuronActivationCoverage(_RangeCoverage):
    """SNAC: ``#neurons with a value above high / #neurons``.

    Example:
        >>> import torch
        >>> snac = StrongNeuronActivationCoverage({"fc": NeuronRange(torch.zeros(2), torch.ones(2))})
        >>> snac.update({"fc": torch.tensor([[-0.5, 0.5], [2.0, 0.5]])})
        >>> snac.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    def _hits(self, values: list[Tensor], flat: Tensor) -> tuple[Tensor, ...]:
        return (_upper_hits(flat, self.high),)


class TopKNeuronCoverage(_LayerCoverage):
    """TKNC(k): neurons that were among their layer's ``k`` most active for some input.

    Example:
        >>> import torch
        >>> tknc = TopKNeuronCoverage({"fc": 4}, k=1)
        >>> tknc.update({"fc": torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])})
        >>> tknc.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    def __init__(self, layer_sizes: Mapping[str, int], k: int = 2, per_layer: bool = False, **kwargs: Any) -> None:
        _check_k(k)
        super().__init__(layer_sizes, per_layer, **kwargs)
        self.k = k

    def _hits(self, values: list[Tensor], flat: Tensor) -> tuple[Tensor, ...]:
        return (_top_k_layer_hits(values, self.k),)


class OutputImpartiality(Metric):
    """Normalised entropy of the predicted-class histogram (1 = every class predicted equally often).

    Higher coverage is known to bias predictions towards a few classes; this tracks that.

    Example:
        >>> import torch
        >>> metric = OutputImpartiality(num_classes=4)
        >>> metric.update(torch.tensor([0, 1, 2, 3, 0, 1]))
        >>> round(float(metric.compute()), 4)
        0.9591
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    counts: Tensor

    def __init__(self, num_classes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        positive_int("num_classes", num_classes, minimum=2)
        self.num_classes = num_classes
        self.add_state("counts", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor) -> None:
        """Add predicted labels ``(B,)`` or logits ``(B, K)``."""
        self.counts += _class_counts(preds, self.num_classes).to(self.counts.device)

    def compute(self) -> Tensor:
        """The normalised entropy in ``[0, 1]``."""
        return _impartiality(self.counts)
