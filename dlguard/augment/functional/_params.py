"""Per-sample parameters (a scalar for the whole batch, or one value per input) and per-input keys."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dlguard.augment.functional._inputs import reads_values


def per_sample(name: str, value: Tensor | float, batch: int, like: Tensor) -> Tensor:
    """``value`` as a ``(B,)`` tensor on ``like``'s device and dtype; a clear error for a wrong length or NaN.

    NaN and infinity are refused where values are read (not inside
    :func:`~dlguard.augment.functional._inputs.values_trusted`): no perturbation has a meaning for them,
    and the range checks after this one (``< 0``, ``> 1``) let NaN through.
    """
    tensor = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if reads_values() and not torch.isfinite(tensor).all():
        raise ValueError(f"{name}: expected finite values, got {tensor[~torch.isfinite(tensor)].unique()[:5].tolist()}")
    if tensor.ndim == 0:
        return tensor.expand(batch)
    if tensor.shape != (batch,):
        raise ValueError(f"{name}: expected a scalar or shape ({batch},), got {tuple(tensor.shape)}")
    return tensor


def check_keys(keys: object, batch: int, name: str = "keys") -> Tensor:
    """Integer keys ``(B,)``, one per input (see :mod:`dlguard._random`); shape and dtype only, no value read."""
    if not isinstance(keys, Tensor):
        raise ValueError(f"{name}: expected an integer tensor of shape ({batch},), got {type(keys).__name__}")
    if keys.is_floating_point() or keys.is_complex() or keys.dtype == torch.bool or keys.shape != (batch,):
        raise ValueError(f"{name}: expected integer keys of shape ({batch},), got {keys.dtype} {tuple(keys.shape)}")
    return keys


def by_level(images: Tensor, level: Tensor, op: Callable[[Tensor, float], Tensor]) -> Tensor:
    """``op(images[rows], value)`` for each distinct value of ``level`` ``(B,)``, in place of those rows.

    One host sync for the batch (a sweep applies one level per call); for ops whose parameter must be
    a Python number (a kernel or image size).
    """
    out = torch.empty_like(images)
    for value in level.unique().tolist():
        rows = (level == value).to(images.device)
        out[rows] = op(images[rows], value)
    return out
