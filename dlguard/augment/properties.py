"""Named perturbations with increasing severity levels: what robustness sweeps iterate (SPEC §2, §5)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dlguard.augment.functional.blur import bilateral_blur, box_blur, gaussian_blur, median_blur
from dlguard.augment.functional.geometric import rotation, scaling, shearing, translation
from dlguard.augment.functional.photometric import brightness_scale, brightness_shift, contrast, gaussian_noise
from dlguard.augment.functional.weather import fog, plasma_field, rain, rain_streaks
from dlguard.augment.weather import (
    _FOG_DENSITY,
    _RAIN_BLUR,
    _RAIN_DARKENING,
    _RAIN_DROPS,
    _RAIN_LENGTH,
)

__all__ = ["Property", "deeptest_properties", "default_properties"]


@dataclass(frozen=True)
class Property:
    """A perturbation ``apply(images, level)`` and its severity ``levels``, mildest first.

    ``level`` is a ``(B,)`` tensor of values from ``levels`` (one per image), so a sweep can apply
    every severity to its copy of the batch in one call.

    Example:
        >>> import torch
        >>> from dlguard.augment.functional import brightness_scale
        >>> dim = Property("dim", brightness_scale, levels=(0.9, 0.5))
        Traceback (most recent call last):
        ...
        ValueError: levels: expected severities in increasing order for 'dim', got (0.9, 0.5)
    """

    name: str
    apply: Callable[[Tensor, Tensor], Tensor]
    levels: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: expected a non-empty property name")
        if not self.levels:
            raise ValueError(f"levels: expected at least one severity level for {self.name!r}")
        if any(b <= a for a, b in zip(self.levels, self.levels[1:], strict=False)):
            raise ValueError(f"levels: expected severities in increasing order for {self.name!r}, got {self.levels}")

    def __call__(self, images: Tensor, level: Tensor | float) -> Tensor:
        """Apply at ``level`` (one value, or one per image)."""
        level = torch.as_tensor(level, dtype=images.dtype, device=images.device)
        return self.apply(images, level.expand(len(images)) if level.ndim == 0 else level)


def _fog(images: Tensor, level: Tensor) -> Tensor:
    depth = 0.35 + 0.65 * plasma_field(len(images), *images.shape[-2:], device=images.device)
    density = torch.tensor(_FOG_DENSITY, dtype=images.dtype, device=images.device)[level.long() - 1]
    return fog(images, depth.to(images), density, 0.9)


def _rain(images: Tensor, level: Tensor) -> Tensor:
    index = level.long() - 1
    height = images.shape[-2]

    def pick(values: Sequence[float]) -> Tensor:
        return torch.tensor(values, dtype=images.dtype, device=images.device)[index]

    angle = torch.zeros_like(level) + 10.0
    streaks = rain_streaks(
        len(images), *images.shape[-2:], pick(_RAIN_DROPS), (pick(_RAIN_LENGTH) * height).clamp(min=2), angle
    )
    return rain(images, streaks, 0.8, pick(_RAIN_DARKENING), pick(_RAIN_BLUR))


def default_properties() -> list[Property]:
    """The comprehensive framework's trio (SPEC §5), each with five increasing severities.

    Gaussian noise ``σ``, rotation ``θ`` in degrees, multiplicative brightness ``β`` (brighter
    with severity).

    Example:
        >>> [(p.name, p.levels[0], p.levels[-1]) for p in default_properties()]
        [('noise', 0.02, 0.3), ('rotation', 5.0, 45.0), ('brightness', 1.2, 3.0)]
    """
    return [
        Property("noise", lambda x, s: gaussian_noise(x, s), (0.02, 0.05, 0.1, 0.2, 0.3)),
        Property("rotation", rotation, (5.0, 10.0, 20.0, 30.0, 45.0)),
        Property("brightness", brightness_scale, (1.2, 1.5, 2.0, 2.5, 3.0)),
    ]


def deeptest_properties() -> list[Property]:
    """DeepTest's transformations with its Table 4 parameter ranges (SPEC §2), plus fog and rain.

    Table 4 gives translation in pixels of 640x480 frames; here it is the same fraction of the
    image (``t/640`` of the width, ``t/480`` of the height). Brightness ``β`` is in 0-255 units,
    divided by 255; the bilateral filter's sigmas likewise. Shear severity grows with ``|s_x|``.
    Fog and rain levels are severities 1-5.

    Example:
        >>> [p.name for p in deeptest_properties()]  # doctest: +NORMALIZE_WHITESPACE
        ['translation', 'scale', 'shear', 'rotation', 'contrast', 'brightness', 'box_blur', 'gaussian_blur',
         'median_blur', 'bilateral_blur', 'fog', 'rain']
    """

    def translate(x: Tensor, t: Tensor) -> Tensor:
        return translation(x, t / 640 * x.shape[-1], t / 480 * x.shape[-2])

    return [
        Property("translation", translate, tuple(float(t) for t in range(10, 101, 10))),
        Property("scale", scaling, tuple(1.5 + 0.5 * i for i in range(10))),
        Property("shear", lambda x, s: shearing(x, -s), tuple(round(0.1 * i, 1) for i in range(1, 11))),
        Property("rotation", rotation, tuple(float(d) for d in range(3, 31, 3))),
        Property("contrast", contrast, tuple(round(1.2 + 0.2 * i, 1) for i in range(10))),
        Property("brightness", lambda x, b: brightness_shift(x, b / 255), tuple(float(b) for b in range(10, 101, 10))),
        Property("box_blur", lambda x, k: box_blur(x, k.long()), (3.0, 4.0, 5.0, 6.0)),
        Property("gaussian_blur", lambda x, k: gaussian_blur(x, k.long()), (3.0, 5.0, 7.0)),
        Property("median_blur", lambda x, k: median_blur(x, k.long()), (3.0, 5.0)),
        Property("bilateral_blur", lambda x, k: bilateral_blur(x, k.long()), (9.0,)),
        Property("fog", _fog, (1.0, 2.0, 3.0, 4.0, 5.0)),
        Property("rain", _rain, (1.0, 2.0, 3.0, 4.0, 5.0)),
    ]
