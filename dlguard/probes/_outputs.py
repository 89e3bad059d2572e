"""How probes read what a layer returned, shared by activation capture and the neuron view."""

from __future__ import annotations

from typing import Any

from torch import Tensor


def _first_tensor(output: Any) -> Tensor:
    """The per-time-step output of a recurrent layer's ``(output, state)``; any other output unchanged."""
    return output[0] if isinstance(output, tuple | list) else output
