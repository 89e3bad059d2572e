"""Recording layer outputs during forward passes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

from dlguard.probes._outputs import _first_tensor
from dlguard.probes._state import _remove_all
from dlguard.probes.layers import LayerSpec, resolve_layers

__all__ = ["capture_activations"]


@contextmanager
def capture_activations(
    model: nn.Module, layers: LayerSpec, *, detach: bool = True
) -> Iterator[dict[str, list[Tensor]]]:
    """Record the outputs of ``layers`` for every forward pass made inside the block.

    The hooks only read; the forward passes are the caller's (run them under
    :func:`~dlguard.probes.evaluation` when they must not touch BatchNorm statistics). On exit,
    also after an exception, every hook is removed.

    Args:
        model: the network.
        layers: a name, names, or ``{name: module}`` from :func:`~dlguard.probes.select_layers`.
        detach: store detached tensors (default); ``False`` keeps them in the autograd graph.

    Yields:
        ``{layer name: [output of pass 1, output of pass 2, ...]}``; for layers returning a tuple
        (``LSTM``, ``GRU``) the first element, the per-step output, is recorded. Clear the lists
        to free memory between batches.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> with capture_activations(net, ["0", "2"]) as acts:
        ...     _ = net(torch.zeros(5, 3))
        >>> [tuple(t.shape) for t in acts["0"]], len(net[0]._forward_hooks)
        ([(5, 4)], 0)
    """
    resolved = resolve_layers(model, layers)
    records: dict[str, list[Tensor]] = {name: [] for name in resolved}
    handles = []
    try:
        for name, module in resolved.items():

            def hook(_m: nn.Module, _i: Any, output: Any, name: str = name) -> None:
                tensor = _first_tensor(output)
                records[name].append(tensor.detach() if detach else tensor)

            handles.append(module.register_forward_hook(hook))
        yield records
    finally:
        _remove_all(handles)
