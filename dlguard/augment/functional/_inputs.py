"""Input checks of the functional ops, and a scope in which they skip every read of tensor values.

Structural checks (tensor, floating point, number of dimensions, parameter shapes) cost nothing and
always run. Checks that read values (pixel range, NaN, negative ``σ``) cost reductions and, on a
GPU, a host sync each: a caller that applies ops on every training batch validates once, when its
state changes, then runs the ops inside :func:`values_trusted` (see
:class:`~dlguard.augment.ErrorGuidedAugmentation`, :class:`~dlguard.augment.RandomFog`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from torch import Tensor

from dlguard._validation import check_images, check_tensor, check_values

_READ_VALUES: ContextVar[bool] = ContextVar("dlguard_augment_read_values", default=True)


@contextmanager
def values_trusted() -> Iterator[None]:
    """Within this scope the functional ops skip the checks that read tensor values (no host sync)."""
    token = _READ_VALUES.set(False)
    try:
        yield
    finally:
        _READ_VALUES.reset(token)


def reads_values() -> bool:
    """Whether value checks run here (``False`` inside :func:`values_trusted`)."""
    return _READ_VALUES.get()


def check_image_input(images: Tensor, name: str = "images") -> None:
    """A float ``(B, C, H, W)`` batch in ``[0, 1]`` without NaN (the value part skipped when trusted)."""
    if reads_values() or not isinstance(images, Tensor) or images.ndim == 0:
        check_images(images, name)
    else:  # an empty view goes through the same structural checks, with the same messages, and reads nothing
        check_images(images[:0], name)


def check_any_input(values: Tensor, bounds: tuple[float, float] | None, name: str = "images") -> None:
    """A float ``(B, ...)`` tensor; without NaN and inside ``bounds`` when ``bounds`` is given and not trusted."""
    check_tensor(name, values, floating=True)
    if bounds is not None and reads_values():
        check_values(name, values, bounds)
