"""Per-sample parameters: a scalar for the whole batch, or one value per image."""

from __future__ import annotations

import torch
from torch import Tensor


def per_sample(name: str, value: Tensor | float, batch: int, like: Tensor) -> Tensor:
    """``value`` as a ``(B,)`` tensor on ``like``'s device and dtype; a clear error for a wrong length."""
    tensor = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if tensor.ndim == 0:
        return tensor.expand(batch)
    if tensor.shape != (batch,):
        raise ValueError(f"{name}: expected a scalar or shape ({batch},), got {tuple(tensor.shape)}")
    return tensor
