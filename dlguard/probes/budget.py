"""How many inputs go through a model in one forward pass: a memory budget for the largest layer output."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dlguard.probes.capture import capture_activations

__all__ = ["ACTIVATION_BUDGET", "default_max_batch"]

ACTIVATION_BUDGET = {"cuda": 2 << 30, "cpu": 8 << 20}
"""Bytes of the largest layer output of one forward pass, by device type."""


def default_max_batch(model: nn.Module, inputs: Tensor, layers: dict[str, nn.Module] | None = None) -> int:
    """Rows per forward pass that keep the largest output of ``layers`` within :data:`ACTIVATION_BUDGET`.

    The budget is 8 MiB on CPU and 2 GiB on CUDA. Measured with ``benchmarks/dscore.py`` on 2 CPU
    cores (4 MiB L2): the fastest pass size tracks activation size, about 128 rows for ``mnist_b``
    (86 KB per image at ``conv1``) and 512 for ``mnist_a`` (14 KB), which this budget reproduces;
    larger passes are memory-bound and slower per image. A GPU gains from the largest batch that fits.
    Runs the model once on one input (the caller puts it in eval mode, without gradients).

    Args:
        model: the network.
        inputs: ``(B, ...)`` inputs as the model takes them (after any ``preprocess``).
        layers: the layers whose outputs count; default every leaf layer.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 26 * 26, 10))
        >>> default_max_batch(net, torch.zeros(1, 1, 28, 28)) == (8 << 20) // (8 * 26 * 26 * 4)
        True
    """
    if len(inputs) == 0:
        return 1
    if layers is None:  # every leaf layer (the model itself when it has no submodules)
        layers = {name: m for name, m in model.named_modules() if next(m.children(), None) is None}
    with capture_activations(model, layers) as acts, torch.no_grad():
        model(inputs[:1])
    sizes = [t[0].numel() * t[0].element_size() for outputs in acts.values() for t in outputs if t.ndim]
    budget = ACTIVATION_BUDGET["cuda" if inputs.device.type == "cuda" else "cpu"]
    return max(1, budget // max(sizes, default=1))
