"""Replacing layer outputs during forward passes (the base of mutation operators)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from dlguard.probes._state import _ModelState, _remove_all
from dlguard.probes.layers import LayerSpec, resolve_layers

__all__ = ["intervene"]


@contextmanager
def intervene(model: nn.Module, layers: LayerSpec, fn: Callable[[str, Any], Any]) -> Iterator[nn.Module]:
    """Replace each selected layer's output by ``fn(name, output)`` inside the block.

    Region deletion (D-Score) and other mutation operators are built on this. On exit, also after
    an exception, the hooks are removed and every buffer is restored, so forward passes of the
    mutated model cannot leave BatchNorm statistics behind (SPEC §0).

    Args:
        model: the network.
        layers: a name, names, or ``{name: module}`` from :func:`~dlguard.probes.select_layers`.
        fn: called with the layer's name and output; returns the output to use instead.

    Yields:
        The same ``model``, now mutated.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> with intervene(net, "0", lambda name, out: torch.zeros_like(out)):
        ...     net(torch.ones(1, 2))
        tensor([[0., 0.]])
    """
    resolved = resolve_layers(model, layers)
    state = _ModelState(model)
    handles = []
    try:
        for name, module in resolved.items():

            def hook(_m: nn.Module, _i: Any, output: Any, name: str = name) -> Any:
                return fn(name, output)

            handles.append(module.register_forward_hook(hook))
        yield model
    finally:
        _remove_all(handles)
        state.restore()
