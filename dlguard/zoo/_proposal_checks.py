"""Argument checks shared by the proposal step and the detector that runs it."""

from __future__ import annotations

from numbers import Real

from torch import Tensor


def _check_levels(levels: object) -> tuple[float, ...]:
    try:
        values = tuple(levels)  # type: ignore[arg-type]
    except TypeError:
        values = ()
    if not values or not all(isinstance(v, Real) and not isinstance(v, bool) and 0.0 < v < 1.0 for v in values):
        raise ValueError(f"levels: expected a non-empty sequence of thresholds in (0, 1), got {levels!r}")
    return tuple(float(v) for v in values)


def _check_dilations(dilations: object) -> tuple[int, ...]:
    try:
        values = tuple(dilations)  # type: ignore[arg-type]
    except TypeError:
        values = ()
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ValueError(f"dilations: expected a non-empty sequence of kernel sides >= 1, got {dilations!r}")
    return tuple(values)


def _check_image(name: str, image: object) -> Tensor:
    if not isinstance(image, Tensor):
        raise ValueError(f"{name}: expected a tensor image (C, H, W), got {type(image).__name__}")
    if image.ndim != 3 or image.shape[1] < 1 or image.shape[2] < 1:
        raise ValueError(f"{name}: expected an image (C, H, W), got shape {tuple(image.shape)}")
    if not image.is_floating_point():
        raise ValueError(f"{name}: expected floating-point values in [0, 1], got {image.dtype}")
    return image
