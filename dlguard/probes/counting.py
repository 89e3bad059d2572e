"""Counting the inputs a model runs: what a measurement spent, in forward passes of one input."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

__all__ = ["ForwardCount", "batch_rows", "count_forward_passes"]


def batch_rows(value: Any) -> int:
    """Rows of the first tensor in ``value`` (a tensor, or tuples, lists and dicts of them); 0 when none.

    Example:
        >>> import torch
        >>> batch_rows({"image": torch.zeros(8, 3, 4, 4), "label": torch.zeros(8)}), batch_rows([3, "a"])
        (8, 0)
    """
    if isinstance(value, Tensor):
        return int(value.shape[0]) if value.ndim else 1
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        rows = batch_rows(item)
        if rows:
            return rows
    return 0


@dataclass
class ForwardCount:
    """Inputs run through a model: ``inputs`` rows in ``calls`` calls."""

    inputs: int = 0
    calls: int = 0


@contextmanager
def count_forward_passes(model: nn.Module) -> Iterator[ForwardCount]:
    """Count the inputs every call of ``model`` runs (rows of its first tensor argument), until exit.

    A forward pre-hook on ``model`` itself: calls of its submodules are not counted again, a pass
    that stops inside the network (a D-Score mutant) counts once, and the hook is removed on exit,
    also after an exception.

    Example:
        >>> import torch
        >>> net = torch.nn.Linear(2, 2)
        >>> with count_forward_passes(net) as count:
        ...     _ = net(torch.zeros(5, 2)), net(torch.zeros(3, 2))
        >>> count.inputs, count.calls, len(net._forward_pre_hooks)
        (8, 2, 0)
    """
    count = ForwardCount()

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        count.inputs += batch_rows(args) or batch_rows(kwargs)
        count.calls += 1

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield count
    finally:
        handle.remove()
