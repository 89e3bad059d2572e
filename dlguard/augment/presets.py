"""Named property lists: which perturbations, at which severities, a callback applies when told a name.

DeepTest's Table 4 was written for 640x480 road frames: zooms up to 6x, shifts of 100 pixels and
brightness steps of 100/255 are ordinary there, but on a 32x32 image they leave no object to
label. A metamorphic relation replays each violation with its source's label, so its
transformations must keep the label; :func:`label_preserving_properties` keeps every limit
relative to the image (shifts and blur widths as fractions of its side) and small enough that a
person would still give the source's label, at any image size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from torch import Tensor

from dlguard.augment.functional._params import by_level
from dlguard.augment.functional.blur import gaussian_blur
from dlguard.augment.functional.geometric import rotation, scaling, shearing, translation
from dlguard.augment.functional.photometric import brightness_scale, brightness_shift, contrast, reduced_contrast
from dlguard.augment.functional.resolution import pixelate
from dlguard.augment.properties import Property, deeptest_properties, default_properties

__all__ = [
    "PROPERTY_PRESETS",
    "capture_properties",
    "exposure_properties",
    "label_preserving_properties",
    "property_preset",
]


def _translation_of_side(images: Tensor, fraction: Tensor) -> Tensor:
    """A shift right and down by ``fraction`` of the image's width and height."""
    return translation(images, fraction * images.shape[-1], fraction * images.shape[-2])


def _gaussian_blur_of_side(images: Tensor, fraction: Tensor) -> Tensor:
    """Gaussian blur of ``σ = fraction ·`` the image's shorter side (kernel ``2·⌈3σ⌉ + 1``, at least 3)."""
    side = min(images.shape[-2:])

    def blur(rows: Tensor, value: float) -> Tensor:
        sigma = value * side
        return gaussian_blur(rows, max(3, 2 * math.ceil(3 * sigma) + 1), sigma=sigma)

    return by_level(images, fraction, blur)


def label_preserving_properties() -> list[Property]:
    """DeepTest's transformations with limits relative to the image, small enough to keep the label.

    Translation by 2-10 % of the side, zoom 1.05-1.2x, shear 0.05-0.25, rotation 3-15°, contrast
    1.1-1.5x, brightness +0.02-0.10 (of the ``[0, 1]`` range), Gaussian blur of ``σ`` 1-3 % of the
    side, and fog and rain at severities 1 and 2 (of 5): 36 transformed copies of each input, against
    the 80 of DeepTest's table (:func:`~dlguard.augment.deeptest_properties`, preset ``"deeptest_roads"``).
    Every limit scales with the image, so a 32x32 digit and a 224x224 photo get the same relative
    change. All need images ``(B, C, H, W)`` in ``[0, 1]``; fog and rain are keyed.

    Example:
        >>> [(p.name, p.levels[-1]) for p in label_preserving_properties()]  # doctest: +NORMALIZE_WHITESPACE
        [('translation', 0.1), ('scale', 1.2), ('shear', 0.25), ('rotation', 15.0), ('contrast', 1.5),
         ('brightness', 0.1), ('gaussian_blur', 0.03), ('fog', 2.0), ('rain', 2.0)]
        >>> sum(len(p.levels) for p in label_preserving_properties())
        36
    """
    weather = {p.name: p for p in deeptest_properties() if p.name in ("fog", "rain")}
    return [
        Property("translation", _translation_of_side, (0.02, 0.04, 0.06, 0.08, 0.1), deterministic=True),
        Property("scale", scaling, (1.05, 1.1, 1.15, 1.2), deterministic=True),
        Property("shear", shearing, (0.05, 0.1, 0.15, 0.2, 0.25), deterministic=True),
        Property("rotation", rotation, (3.0, 6.0, 9.0, 12.0, 15.0), deterministic=True),
        Property("contrast", contrast, (1.1, 1.2, 1.3, 1.4, 1.5), deterministic=True),
        Property("brightness", brightness_shift, (0.02, 0.04, 0.06, 0.08, 0.1), deterministic=True),
        Property("gaussian_blur", _gaussian_blur_of_side, (0.01, 0.02, 0.03), deterministic=True),
        replace(weather["fog"], levels=(1.0, 2.0)),
        replace(weather["rain"], levels=(1.0, 2.0)),
    ]


def capture_properties() -> list[Property]:
    """Degradations of the capture itself, none of them in DeepTest's set: a flat exposure, defocus, a coarse sensor.

    Contrast about each image's mean grey level lowered by 20-70 % (DeepTest's ``contrast`` only
    raises a gain ``α·x``), Gaussian blur of ``σ`` 2-6 % of the side (the label-preserving preset stops
    at 3 %), and pixelation to 75-40 % of the side: 10 transformed copies of each input. Limits scale
    with the image, as :func:`label_preserving_properties`' do. Pass it beside another preset, e.g. to
    the benchmark's robustness loop as ``--properties framework capture``. All need images
    ``(B, C, H, W)`` in ``[0, 1]`` and draw no random numbers.

    Example:
        >>> import torch
        >>> [(p.name, p.levels[-1]) for p in capture_properties()]
        [('reduced_contrast', 0.7), ('defocus', 0.06), ('low_resolution', 0.6)]
        >>> flat, _, coarse = capture_properties()
        >>> ramp = torch.linspace(0, 1, 8).expand(1, 1, 8, 8)  # a grey ramp, mean 0.5
        >>> [round(v, 3) for v in flat(ramp, 0.5)[0, 0, 0, ::7].tolist()]  # half the contrast about the mean
        [0.25, 0.75]
        >>> [round(v, 3) for v in coarse(ramp, 0.5)[0, 0, 0].tolist()]  # 8 pixels averaged to 4, each shown twice
        [0.071, 0.071, 0.357, 0.357, 0.643, 0.643, 0.929, 0.929]
    """
    return [
        Property("reduced_contrast", reduced_contrast, (0.2, 0.4, 0.6, 0.7), deterministic=True),
        Property("defocus", _gaussian_blur_of_side, (0.02, 0.04, 0.06), deterministic=True),
        Property("low_resolution", pixelate, (0.25, 0.5, 0.6), deterministic=True),
    ]


def _exposure_lowered(images: Tensor, reduction: Tensor | float) -> Tensor:
    """Every pixel scaled by ``1 - reduction``: less light on the sensor (the framework's ``β·x``, ``β < 1``)."""
    return brightness_scale(images, 1 - reduction)


def exposure_properties() -> list[Property]:
    """An underexposed capture: every pixel's value lowered by 20-70 %, ``(1 - r)·x``; 4 copies of each input.

    The papers' photometric changes only brighten (the framework's ``β·x`` with ``β`` 1.2-3.0,
    DeepTest's ``x + β`` and ``α·x`` with ``α > 1``) and :func:`capture_properties`' lowered contrast
    keeps each image's mean, so none of them shows a network a dark picture: an exposure too short,
    a dim room, a dusk. This is the framework's brightness
    (:func:`~dlguard.augment.functional.brightness_scale`) with ``β = 1 - r`` below 1. Pass it beside
    the others, e.g. ``--properties framework capture exposure``. Needs images ``(B, C, H, W)`` in
    ``[0, 1]`` and draws no random numbers.

    Example:
        >>> import torch
        >>> (dark,) = exposure_properties()
        >>> dark.name, dark.levels
        ('underexposure', (0.2, 0.4, 0.6, 0.7))
        >>> ramp = torch.linspace(0, 1, 5).expand(1, 1, 5, 5)
        >>> [round(v, 3) for v in dark(ramp, 0.6)[0, 0, 0].tolist()]  # 40 % of the light, black stays black
        [0.0, 0.1, 0.2, 0.3, 0.4]
    """
    return [Property("underexposure", _exposure_lowered, (0.2, 0.4, 0.6, 0.7), deterministic=True)]


PROPERTY_PRESETS: dict[str, Callable[[], list[Property]]] = {
    "label_preserving": label_preserving_properties,
    "deeptest_roads": deeptest_properties,
    "framework": default_properties,
    "capture": capture_properties,
    "exposure": exposure_properties,
}
"""Preset name -> the function making its property list (a fresh list each call)."""


def property_preset(name: object, argument: str = "properties") -> list[Property]:
    """The property list of preset ``name`` (:data:`PROPERTY_PRESETS`).

    - ``"label_preserving"``: :func:`label_preserving_properties`, limits relative to the image;
    - ``"deeptest_roads"``: :func:`~dlguard.augment.deeptest_properties`, DeepTest's Table 4 for
      640x480 road frames, plus fog and rain;
    - ``"framework"``: :func:`~dlguard.augment.default_properties`, the comprehensive framework's trio;
    - ``"capture"``: :func:`capture_properties`, lowered contrast, defocus and pixelation;
    - ``"exposure"``: :func:`exposure_properties`, an underexposed picture.

    Raises:
        ValueError: naming ``argument``, for a name that is not a preset.

    Example:
        >>> len(property_preset("deeptest_roads")), len(property_preset("label_preserving"))
        (12, 9)
        >>> property_preset("deeptest")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: properties: no preset named 'deeptest'; choose from ['label_preserving', 'deeptest_roads', ...
    """
    if not isinstance(name, str) or name not in PROPERTY_PRESETS:
        raise ValueError(
            f"{argument}: no preset named {name!r}; choose from {list(PROPERTY_PRESETS)} or pass a list of "
            "dlguard.augment.Property"
        )
    return PROPERTY_PRESETS[name]()
