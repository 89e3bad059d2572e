"""Running a model the way probes do: eval mode, parameter gradients off."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from dlguard.probes._state import _ModelState

__all__ = ["evaluation", "is_probing", "model_device"]

_PROBING: ContextVar[int] = ContextVar("dlguard_probing", default=0)


def is_probing() -> bool:
    """Whether a dlguard probe is running a model right now (inside :func:`evaluation`).

    Observers of a training run's own forward passes (the coverage callback) use it to ignore the
    forward passes other dlguard callbacks make to measure the model in the same epoch.
    """
    return _PROBING.get() > 0


@contextmanager
def evaluation(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode with ``requires_grad=False`` on every parameter.

    Gradients with respect to *inputs* still flow (attacks and gradient indicators need them).
    On exit, also after an exception, every module's train/eval flag, every parameter's
    ``requires_grad`` and every buffer are restored exactly.

    Yields:
        The same ``model``.

    Example:
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
        >>> with evaluation(net):
        ...     net.training, net[0].weight.requires_grad
        (False, False)
        >>> net.training, net[0].weight.requires_grad
        (True, True)
    """
    state = _ModelState(model)
    token = _PROBING.set(_PROBING.get() + 1)
    try:
        model.eval()
        model.requires_grad_(False)
        yield model
    finally:
        _PROBING.reset(token)
        state.restore()


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU for a model with neither)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")
