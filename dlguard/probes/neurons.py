"""Which layers hold neurons, how their outputs read as neurons, and their ranges on training data."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from dlguard.metrics.functional.coverage import NeuronRange, neuron_values
from dlguard.probes._outputs import _first_tensor
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.capture import capture_activations
from dlguard.probes.evaluation import evaluation
from dlguard.probes.layers import LayerSpec, resolve_layers, select_layers

__all__ = ["NEURON_LAYER_TYPES", "neuron_layers", "neuron_output", "profile_neuron_ranges"]

NEURON_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.RNNBase)
"""Layers whose outputs coverage counts with ``layers="auto"``: dense, convolution, recurrent."""


def neuron_layers(model: nn.Module, layers: LayerSpec | str = "auto") -> dict[str, nn.Module]:
    """``"auto"``: every layer of :data:`NEURON_LAYER_TYPES`; otherwise the named layers.

    Raises:
        ValueError: when nothing matches or a name is unknown; the message lists the layers.
    """
    if isinstance(layers, str) and layers == "auto":
        return select_layers(model, types=NEURON_LAYER_TYPES)
    return resolve_layers(model, layers)


def neuron_output(module: nn.Module, output: Any) -> Tensor:
    """The output as coverage reads it: a neuron per time step and unit for recurrent layers.

    ``output`` is what the layer returned (for ``LSTM``/``GRU`` the ``(output, state)`` tuple, whose
    per-step output is read). Recurrent ``(B, T, H)`` (or sequence-first ``(T, B, H)``) becomes
    ``(B, T·H)``; other outputs are returned unchanged.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> gru = nn.GRU(3, 4)  # sequence-first
        >>> neuron_output(gru, gru(torch.rand(5, 2, 3))[0]).shape
        torch.Size([2, 20])
    """
    output = _first_tensor(output)
    if not isinstance(module, nn.RNNBase):
        return output
    if isinstance(output, PackedSequence) or output.ndim != 3:
        raise ValueError("activations: recurrent layers need batched, unpacked sequences (B, T, H) or (T, B, H)")
    return (output if module.batch_first else output.transpose(0, 1)).flatten(1)


def _inputs(batch: Any) -> Tensor:
    return batch[0] if isinstance(batch, tuple | list) else batch


def profile_neuron_ranges(
    model: nn.Module | ModelAdapter,
    dataloader: Iterable[Any],
    layers: LayerSpec | str = "auto",
    *,
    max_batches: int | None = None,
    batch_inputs: Callable[[Any], Tensor] | None = None,
) -> dict[str, NeuronRange]:
    """Per-neuron ``low``/``high`` of ``layers`` over ``dataloader``, in one batched pass.

    The ranges KMNC, NBC and SNAC need (DeepGauge profiles them on the training data). The model
    runs in eval mode on its own device, under ``no_grad``, and is left exactly as found.

    Args:
        model: the network, or a :class:`~dlguard.probes.ModelAdapter` whose ``preprocess`` maps the
            loader's inputs to what the model sees (the same as during validation).
        dataloader: batches of inputs, or of ``(inputs, ...)`` tuples.
        layers: ``"auto"`` or a layer spec (see :func:`neuron_layers`).
        max_batches: stop after this many batches.
        batch_inputs: reads the inputs out of a batch (default: the batch itself, or its first
            element), e.g. :meth:`dlguard.data.BatchAccessor.inputs` for dict batches.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
        >>> ranges = profile_neuron_ranges(net, [torch.rand(8, 2), torch.rand(8, 2)])
        >>> list(ranges), ranges["0"].low.shape, bool((ranges["0"].low <= ranges["0"].high).all())
        (['0', '2'], torch.Size([3]), True)
    """
    adapter = ModelAdapter.wrap(model)
    model = adapter.model
    read = batch_inputs or _inputs
    selected = neuron_layers(model, layers)
    low: dict[str, Tensor] = {}
    high: dict[str, Tensor] = {}
    seen = 0
    with evaluation(model), torch.no_grad(), capture_activations(model, selected) as acts:
        for index, batch in enumerate(dataloader):
            if max_batches is not None and index >= max_batches:
                break
            model(adapter.prepare(read(batch)))
            seen += 1
            for name, outputs in acts.items():
                values = torch.cat([neuron_values(neuron_output(selected[name], out)).float() for out in outputs])
                outputs.clear()
                batch_low, batch_high = values.amin(dim=0), values.amax(dim=0)
                low[name] = torch.minimum(low[name], batch_low) if name in low else batch_low
                high[name] = torch.maximum(high[name], batch_high) if name in high else batch_high
    if not seen:
        raise ValueError("dataloader: yielded no batch to profile neuron ranges on")
    return {name: NeuronRange(low[name], high[name]) for name in selected}
