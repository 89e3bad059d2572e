"""Argument checks shared across dlguard's packages.

Each check raises ``ValueError`` naming the argument and what was expected, before any work is
done (SPEC §0). Checks that read tensor values (range, NaN) cost a reduction and, on a GPU, a host
sync: callers run them once per measurement or when a state changes, never per training batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import TypeVar

import torch
from torch import Tensor

Option = TypeVar("Option", str, int)


def one_of(name: str, value: object, allowed: Sequence[Option]) -> Option:
    """The option of ``allowed`` that ``value`` equals, of the same kind (``True`` is not ``1``, ``"1"`` not ``1``)."""
    if isinstance(allowed, str) or not allowed:
        raise TypeError(f"one_of: expected a non-empty sequence of options for {name}, got {allowed!r}")
    kind = str if isinstance(allowed[0], str) else Integral
    if isinstance(value, kind) and not isinstance(value, bool):
        for option in allowed:
            if value == option:
                return option
    raise ValueError(f"{name}: expected one of {tuple(allowed)}, got {value!r}")


def positive_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an ``int`` of at least ``minimum`` (``bool`` is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name}: expected an integer of at least {minimum}, got {value!r}")
    return int(value)


def optional_positive_int(name: str, value: object, minimum: int = 1) -> int | None:
    """``None``, or ``value`` as an ``int`` of at least ``minimum`` (``max_batch=None``: a memory budget)."""
    return None if value is None else positive_int(name, value, minimum)


def check_budget(budget: object) -> int | float | None:
    """A callback's ``budget``: a positive ``int`` (passes), a positive finite ``float`` (a multiple), or ``None``."""
    if budget is None:
        return None
    if isinstance(budget, Integral) and not isinstance(budget, bool) and budget >= 1:
        return int(budget)
    if isinstance(budget, float) and math.isfinite(budget) and budget > 0:
        return budget
    raise ValueError(
        "budget: expected a positive int (forward passes per measurement), a positive float (a multiple of the "
        f"probe loader's inputs) or None, got {budget!r}"
    )


def probability(name: str, value: object) -> float:
    """``value`` as a ``float`` in ``[0, 1]`` (NaN rejected)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name}: expected a value in [0, 1], got {value!r}")
    return float(value)


def finite_float(name: str, value: object) -> float:
    """``value`` as a finite ``float``."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


def value_range(name: str, bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    """``None`` or a finite ``(low, high)`` with ``low < high``."""
    if bounds is None:
        return None
    try:
        low, high = (finite_float(name, b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected None or finite (low, high), got {bounds!r}") from None
    if not low < high:
        raise ValueError(f"{name}: expected low < high, got {bounds!r}")
    return low, high


def check_grid(n: object) -> int:
    """D-Score's grid size ``n >= 2``."""
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 2:
        raise ValueError(f"n: expected an integer grid size of at least 2, got {n!r}")
    return int(n)


def check_translation(n: object, t: object) -> None:
    """Grid size ``n`` and padding divisor ``t > 1`` of D-Score's padding translation (SPEC §1)."""
    check_grid(n)
    if isinstance(t, bool) or not isinstance(t, Integral) or t < 2:
        raise ValueError(f"t: expected an integer greater than 1, got {t!r}")


def check_tensor(name: str, value: object, *, min_ndim: int = 1, floating: bool = False) -> Tensor:
    """A tensor of at least ``min_ndim`` dimensions (floating point when asked)."""
    if not isinstance(value, Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(value).__name__}")
    if value.ndim < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dimensions, got shape {tuple(value.shape)}")
    if floating and not value.is_floating_point():
        raise ValueError(f"{name}: expected floating-point values, got {value.dtype}")
    return value


def check_values(name: str, values: Tensor, bounds: tuple[float, float] | None = (0.0, 1.0), hint: str = "") -> None:
    """No NaN, and every value inside ``bounds`` when given (two reductions, one host sync).

    ``hint`` is appended to the out-of-range message: where the bounds come from and how to change them.
    """
    if values.numel() == 0:
        return
    if not values.is_floating_point():
        return
    low, high = values.amin(), values.amax()  # a NaN anywhere makes both NaN
    if torch.isnan(low) or torch.isnan(high):
        raise ValueError(f"{name}: contains NaN")
    if bounds is not None and (low < bounds[0] or high > bounds[1]):
        raise ValueError(
            f"{name}: expected values in [{bounds[0]:g}, {bounds[1]:g}], got values in [{float(low):.4g}, "
            f"{float(high):.4g}]" + (f"; {hint}" if hint else "")
        )


def check_images(
    images: Tensor, name: str = "images", bounds: tuple[float, float] | None = (0.0, 1.0), values: bool = True
) -> None:
    """A float ``(B, C, H, W)`` batch without NaN, inside ``bounds`` (pixel space by default, SPEC §0).

    ``values=False`` checks the type and shape only (no host sync): for callers that checked the values.
    """
    check_tensor(name, images, floating=True)
    if images.ndim != 4:
        raise ValueError(f"{name}: expected images (B, C, H, W), got shape {tuple(images.shape)}")
    if values:
        check_values(name, images, bounds)


def check_labels(name: str, target: object, batch: int | None = None, num_classes: int | None = None) -> Tensor:
    """Integer class labels ``(B,)``, none negative, below ``num_classes`` when given (one or two reductions)."""
    if not isinstance(target, Tensor):
        raise ValueError(f"{name}: expected a tensor of integer class labels, got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ValueError(f"{name}: expected integer class labels, got {target.dtype}")
    expected = "(B,)" if batch is None else f"({batch},)"
    if target.ndim != 1 or (batch is not None and target.shape[0] != batch):
        raise ValueError(f"{name}: expected labels of shape {expected}, got {tuple(target.shape)}")
    if target.numel() and num_classes is not None:
        low, high = int(target.min()), int(target.max())
        if low < 0 or high >= num_classes:
            raise ValueError(f"{name}: expected labels in [0, {num_classes}), got labels in [{low}, {high}]")
    elif target.numel() and int(target.min()) < 0:
        raise ValueError(f"{name}: expected class labels of 0 or more, got {int(target.min())}")
    return target


def check_combine(combine: object, num_classes: int) -> None:
    """``combine`` is a callable of two label tensors; one marked ``labels_are_digits`` needs 10 classes."""
    if not callable(combine):
        raise ValueError(f"combine: expected a callable of two label tensors, got {type(combine).__name__}")
    if getattr(combine, "labels_are_digits", False) and num_classes != 10:
        raise ValueError(
            f"combine: {getattr(combine, '__name__', 'it')} adds labels as digits 0-9, but num_classes is "
            f"{num_classes}; pass a combine that fits the labels (e.g. combine=torch.add when their sum is meaningful)"
        )


def check_logits(name: str, logits: object, batch: int, num_classes: int | None = None, hint: str = "") -> Tensor:
    """Model outputs of shape ``(B, K)`` (and ``K = num_classes`` when given)."""
    if not isinstance(logits, Tensor) or logits.ndim != 2 or logits.shape[0] != batch:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"{name}: expected logits of shape ({batch}, K), got {shape}{hint}")
    if num_classes is not None and logits.shape[1] != num_classes:
        raise ValueError(
            f"num_classes: is {num_classes} but the model's outputs have {logits.shape[1]} classes; "
            "pass the width of the logits (or leave num_classes unset)"
        )
    return logits


def check_object_images(name: str, images: object) -> Tensor:
    """Floating ``(B, C, H, W)`` images in ``[0, 1]`` with ``C`` in ``{1, 3}``."""
    images = check_tensor(name, images, floating=True)
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"{name}: expected images (B, C, H, W) with C in {{1, 3}}, got shape {tuple(images.shape)}")
    check_values(name, images)
    return images


def check_object_masks(name: str, masks: object, images: Tensor) -> Tensor:
    """Bool ``(B, H, W)`` object masks of ``images``, none empty."""
    expected = (images.shape[0], *images.shape[2:])
    if not isinstance(masks, Tensor) or masks.dtype != torch.bool or tuple(masks.shape) != expected:
        got = f"{masks.dtype} {tuple(masks.shape)}" if isinstance(masks, Tensor) else type(masks).__name__
        raise ValueError(f"{name}: expected a bool tensor (B, H, W) = {expected} matching the images, got {got}")
    if len(masks):
        empty = (~masks.flatten(1).any(1)).nonzero().flatten()
        if len(empty):
            raise ValueError(
                f"{name}: the mask of image {int(empty[0])} is empty (no object); every image needs its object "
                f"marked ({len(empty)} empty in all)"
            )
    return masks
