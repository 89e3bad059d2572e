"""Named perturbations with increasing severity levels: what robustness sweeps iterate (SPEC §2, §5)."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from numbers import Real

import torch
from torch import Tensor

from dlguard._random import keyed_normal
from dlguard._validation import check_tensor
from dlguard._validation import value_range as check_value_range
from dlguard.augment.functional._params import check_keys
from dlguard.augment.functional.blur import bilateral_blur, box_blur, gaussian_blur, median_blur
from dlguard.augment.functional.geometric import rotation, scaling, shearing, translation
from dlguard.augment.functional.photometric import brightness_scale, brightness_shift, contrast, gaussian_noise
from dlguard.augment.functional.weather import (
    FOG_DENSITY,
    RAIN_BLUR,
    RAIN_DARKENING,
    RAIN_DROPS,
    RAIN_LENGTH,
    fog,
    plasma_field,
    rain,
    rain_streaks,
)

__all__ = ["Property", "check_properties", "check_property_inputs", "deeptest_properties", "default_properties"]

_NOISE_SALT = 0x6E6F_6973  # the noise property's draw site, combined with each severity's bits


@dataclass(frozen=True)
class Property:
    """A perturbation ``apply`` and its severity ``levels``, mildest first.

    ``level`` reaches ``apply`` as a ``(B,)`` tensor of values from ``levels`` (one per input), so a
    sweep can apply every severity to its copy of the batch in one call. Three fields tell a caller
    (a robustness sweep, a guide) how the property may be called:

    - ``keyed``: ``apply(inputs, level, keys)`` receives per-input integer keys ``(B,)``, or
      ``None``, and draws its randomness from the keys when given
      (:func:`~dlguard._random.keyed_normal`, :func:`~dlguard._random.keyed_uniform`), so an input
      is perturbed alike whatever batch, epoch or process it is in; without keys it draws from the
      global RNG. An unkeyed property is called ``apply(inputs, level)`` and ignores keys.
    - ``needs_images``: the property works on images ``(B, C, H, W)`` only (geometric, blur,
      weather); ``False`` for one that takes any tensor ``(B, ...)``, e.g. 1-D signals
      ``(B, C, T)`` (additive noise, multiplicative brightness; SPEC §0).
    - ``value_range``: the range the inputs must lie in (and outputs are clamped to), ``None`` for
      unbounded values.
    - ``deterministic``: an unkeyed property that draws no random numbers (rotation, brightness, the
      blurs). An unkeyed property that is not deterministic draws from the global RNG, so its numbers
      under DDP differ from one process's; callbacks warn about it at set-up when several processes run.

    The built-in properties hold module-level functions (or ``functools.partial`` of them), so
    they pickle (DDP ``spawn``); a custom property pickles when its ``apply`` does.

    Args:
        name: the property's name (a key of the robustness results).
        apply: ``apply(inputs, level)``, or ``apply(inputs, level, keys)`` when ``keyed``.
        levels: finite severity values in increasing order.
        keyed: whether ``apply`` takes keys (see above).
        needs_images: whether ``apply`` needs images ``(B, C, H, W)``.
        value_range: ``(low, high)`` of the inputs, or ``None``.
        deterministic: whether an unkeyed ``apply`` draws no random numbers.

    Example:
        >>> import torch
        >>> from dlguard.augment.functional import brightness_scale
        >>> dim = Property("dim", brightness_scale, levels=(0.9, 0.5))
        Traceback (most recent call last):
        ...
        ValueError: levels: expected severities in increasing order for 'dim', got (0.9, 0.5)
        >>> bright = Property("bright", brightness_scale, levels=(1.5, 2.0))
        >>> bright(torch.full((2, 1, 1, 1), 0.25), torch.tensor([1.5, 2.0])).flatten().tolist()
        [0.375, 0.5]
    """

    name: str
    apply: Callable[..., Tensor]
    levels: tuple[float, ...]
    keyed: bool = False
    needs_images: bool = True
    value_range: tuple[float, float] | None = (0.0, 1.0)
    deterministic: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty property name, got {self.name!r}")
        if not callable(self.apply):
            raise ValueError(f"apply: expected a callable for {self.name!r}, got {type(self.apply).__name__}")
        levels = tuple(self.levels)
        if not levels:
            raise ValueError(f"levels: expected at least one severity level for {self.name!r}")
        if not all(isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) for v in levels):
            raise ValueError(f"levels: expected finite severities for {self.name!r}, got {levels}")
        if any(b <= a for a, b in pairwise(levels)):
            raise ValueError(f"levels: expected severities in increasing order for {self.name!r}, got {levels}")
        for flag in ("keyed", "needs_images", "deterministic"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag}: expected True or False for {self.name!r}, got {getattr(self, flag)!r}")
        object.__setattr__(self, "levels", tuple(float(v) for v in levels))
        object.__setattr__(self, "value_range", check_value_range("value_range", self.value_range))

    def __call__(self, images: Tensor, level: Tensor | float, keys: Tensor | None = None) -> Tensor:
        """Apply at ``level`` (one value, or one per input) to ``images`` ``(B, C, H, W)`` (or ``(B, ...)``).

        ``keys`` (``(B,)`` integers) fix a keyed property's random draws per input; an unkeyed
        property ignores them.
        """
        check_tensor("images", images)
        if self.needs_images and images.ndim != 4:
            raise ValueError(
                f"images: property {self.name!r} needs images (B, C, H, W), got shape {tuple(images.shape)}; "
                "properties with needs_images=False take any tensor (B, ...), e.g. 'noise' and 'brightness' "
                "of default_properties() (value_range=None for unbounded signals)"
            )
        level = torch.as_tensor(level, dtype=images.dtype, device=images.device)
        if level.ndim == 0:
            level = level.expand(len(images))
        elif level.shape != (len(images),):
            raise ValueError(f"level: expected one value or shape ({len(images)},), got {tuple(level.shape)}")
        if not self.keyed:
            return self.apply(images, level)
        if keys is not None:
            keys = check_keys(keys, len(images)).to(images.device)
        return self.apply(images, level, keys)

    @property
    def draws_globally(self) -> bool:
        """Whether the property draws random numbers from the global RNG (unkeyed and not deterministic)."""
        return not self.keyed and not self.deterministic


def check_properties(properties: object, name: str = "properties") -> list[Property]:
    """A non-empty list of :class:`Property` with distinct names (one property alone is a list of one).

    Raises:
        ValueError: naming ``name``, for anything else.

    Example:
        >>> [p.name for p in check_properties(default_properties()[1])]
        ['rotation']
        >>> check_properties([])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: properties: expected a non-empty list of dlguard.augment.Property (e.g. ...), got []
    """
    if isinstance(properties, Property):
        properties = [properties]
    if isinstance(properties, str) or not isinstance(properties, Sequence) or not properties:
        raise ValueError(
            f"{name}: expected a non-empty list of dlguard.augment.Property (e.g. default_properties()), "
            f"got {properties!r}"
        )
    wrong = [type(p).__name__ for p in properties if not isinstance(p, Property)]
    if wrong:
        raise ValueError(f"{name}: expected dlguard.augment.Property items, got {wrong}")
    names = [p.name for p in properties]
    if len(set(names)) != len(names):
        raise ValueError(f"{name}: expected distinct property names, got {names}")
    return list(properties)


def check_property_inputs(properties: Sequence[Property], inputs: Tensor, name: str = "properties") -> None:
    """``inputs`` ``(B, ...)`` fit every property: images ``(B, C, H, W)`` where one needs them.

    Example:
        >>> import torch
        >>> check_property_inputs(default_properties(), torch.zeros(2, 1, 50))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: properties: 'rotation' needs images (B, C, H, W) but the inputs have shape (2, 1, 50); ...
    """
    for prop in properties:
        if prop.needs_images and inputs.ndim != 4:
            raise ValueError(
                f"{name}: {prop.name!r} needs images (B, C, H, W) but the inputs have shape {tuple(inputs.shape)}; "
                "for other tensors use properties that take any shape (needs_images=False, e.g. noise and "
                "brightness of default_properties(value_range=None))"
            )


def _level_salt(site: int, value: float) -> int:
    """A salt fixed by a draw site and a severity (its float32 bits: alike for float32 and float64 levels)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return (bits ^ site) & 0x7FFF_FFFF  # below 2**31: keyed_normal's two streams 2·salt, 2·salt + 1 stay distinct


def _noise(images: Tensor, level: Tensor, keys: Tensor | None, *, value_range: tuple[float, float] | None) -> Tensor:
    """Gaussian noise of ``σ = level``; keyed: each input's noise fixed by its key and the severity."""
    if keys is None:
        return gaussian_noise(images, level, value_range=value_range)
    noise: Tensor | None = None
    # one host sync; a sweep applies one severity per call, so this is usually one draw
    for value in level.unique().tolist():
        draws = keyed_normal(keys, tuple(images.shape[1:]), _level_salt(_NOISE_SALT, value), images.dtype)
        rows = (level == value).reshape(-1, *([1] * (images.ndim - 1)))
        noise = draws if noise is None else torch.where(rows, draws, noise)
    return gaussian_noise(images, level, noise=noise, value_range=value_range)


def _fog(images: Tensor, level: Tensor, keys: Tensor | None) -> Tensor:
    field = plasma_field(len(images), *images.shape[-2:], device=images.device, keys=keys)
    depth = 0.35 + 0.65 * field
    density = torch.tensor(FOG_DENSITY, dtype=images.dtype, device=images.device)[level.long() - 1]
    return fog(images, depth.to(images), density, 0.9)


def _rain(images: Tensor, level: Tensor, keys: Tensor | None) -> Tensor:
    index = level.long() - 1
    height = images.shape[-2]

    def pick(values: Sequence[float]) -> Tensor:
        return torch.tensor(values, dtype=images.dtype, device=images.device)[index]

    angle = torch.zeros_like(level) + 10.0
    length = (pick(RAIN_LENGTH) * height).clamp(min=2)
    streaks = rain_streaks(len(images), *images.shape[-2:], pick(RAIN_DROPS), length, angle, keys=keys)
    return rain(images, streaks, 0.8, pick(RAIN_DARKENING), pick(RAIN_BLUR))


def default_properties(value_range: tuple[float, float] | None = (0.0, 1.0)) -> list[Property]:
    """The comprehensive framework's trio (SPEC §5), each with five increasing severities.

    Gaussian noise ``σ``, rotation ``θ`` in degrees, multiplicative brightness ``β`` (brighter
    with severity). Noise and brightness take any tensor ``(B, ...)`` (``needs_images=False``): with
    ``value_range`` they check their inputs against it and clamp to it, with ``None`` neither
    (signals are not pixels). Rotation needs images ``(B, C, H, W)`` in ``[0, 1]``. Noise is keyed:
    given per-input keys, each input's noise at each severity is fixed by its key, the same in every
    epoch and process.

    Args:
        value_range: range of the inputs of noise and brightness, or ``None`` for unbounded values.

    Example:
        >>> [(p.name, p.levels[0], p.levels[-1]) for p in default_properties()]
        [('noise', 0.02, 0.3), ('rotation', 5.0, 45.0), ('brightness', 1.2, 3.0)]
        >>> [(p.keyed, p.needs_images) for p in default_properties()]
        [(True, False), (False, True), (False, False)]
        >>> import torch
        >>> noise = default_properties(value_range=None)[0]
        >>> signals = torch.randn(4, 2, 100)  # 1-D signals (B, C, T), not pixels
        >>> torch.equal(noise(signals, 0.1, keys=torch.arange(4))[2:], noise(signals[2:], 0.1, keys=torch.arange(2, 4)))
        True
    """
    bounds = check_value_range("value_range", value_range)
    return [
        Property(
            "noise",
            partial(_noise, value_range=bounds),
            (0.02, 0.05, 0.1, 0.2, 0.3),
            keyed=True,
            needs_images=False,
            value_range=bounds,
        ),
        Property("rotation", rotation, (5.0, 10.0, 20.0, 30.0, 45.0), deterministic=True),
        Property(
            "brightness",
            partial(brightness_scale, value_range=bounds),
            (1.2, 1.5, 2.0, 2.5, 3.0),
            needs_images=False,
            value_range=bounds,
            deterministic=True,
        ),
    ]


def _translation_fraction(images: Tensor, t: Tensor) -> Tensor:
    """DeepTest's translation ``t`` in pixels of 640x480 frames, as the same fraction of these images."""
    return translation(images, t / 640 * images.shape[-1], t / 480 * images.shape[-2])


def _shear_left(images: Tensor, s: Tensor) -> Tensor:
    return shearing(images, -s)


def _brightness_255(images: Tensor, beta: Tensor) -> Tensor:
    return brightness_shift(images, beta / 255)


def _with_kernel_size(images: Tensor, size: Tensor, *, blur: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    return blur(images, size.long())


def deeptest_properties() -> list[Property]:
    """DeepTest's transformations with its Table 4 parameter ranges (SPEC §2), plus fog and rain.

    Table 4 gives translation in pixels of 640x480 frames; here it is the same fraction of the
    image (``t/640`` of the width, ``t/480`` of the height). Brightness ``β`` is in 0-255 units,
    divided by 255; the bilateral filter's sigmas likewise. Shear severity grows with ``|s_x|``.
    Fog and rain levels are severities 1-5; both are keyed (given per-input keys, each input's fog
    field and rain drops are fixed by its key). All need images ``(B, C, H, W)`` in ``[0, 1]``.

    Example:
        >>> [p.name for p in deeptest_properties()]  # doctest: +NORMALIZE_WHITESPACE
        ['translation', 'scale', 'shear', 'rotation', 'contrast', 'brightness', 'box_blur', 'gaussian_blur',
         'median_blur', 'bilateral_blur', 'fog', 'rain']
    """
    return [
        Property("translation", _translation_fraction, tuple(float(t) for t in range(10, 101, 10)), deterministic=True),
        Property("scale", scaling, tuple(1.5 + 0.5 * i for i in range(10)), deterministic=True),
        Property("shear", _shear_left, tuple(round(0.1 * i, 1) for i in range(1, 11)), deterministic=True),
        Property("rotation", rotation, tuple(float(d) for d in range(3, 31, 3)), deterministic=True),
        Property("contrast", contrast, tuple(round(1.2 + 0.2 * i, 1) for i in range(10)), deterministic=True),
        Property("brightness", _brightness_255, tuple(float(b) for b in range(10, 101, 10)), deterministic=True),
        Property("box_blur", partial(_with_kernel_size, blur=box_blur), (3.0, 4.0, 5.0, 6.0), deterministic=True),
        Property("gaussian_blur", partial(_with_kernel_size, blur=gaussian_blur), (3.0, 5.0, 7.0), deterministic=True),
        Property("median_blur", partial(_with_kernel_size, blur=median_blur), (3.0, 5.0), deterministic=True),
        Property("bilateral_blur", partial(_with_kernel_size, blur=bilateral_blur), (9.0,), deterministic=True),
        Property("fog", _fog, (1.0, 2.0, 3.0, 4.0, 5.0), keyed=True),
        Property("rain", _rain, (1.0, 2.0, 3.0, 4.0, 5.0), keyed=True),
    ]
