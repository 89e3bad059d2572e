"""RandomFog and RandomRain: kornia augmentations with five severities, drawn per sample."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import torch
from kornia.augmentation import IntensityAugmentationBase2D
from torch import Tensor

from dlguard.augment.functional._inputs import values_trusted
from dlguard.augment.functional.weather import (
    FOG_DENSITY,
    RAIN_BLUR,
    RAIN_DARKENING,
    RAIN_DROPS,
    RAIN_LENGTH,
    _streak_maps,
    fog,
    plasma_field,
    rain,
)

__all__ = ["RandomFog", "RandomRain"]


def _check_severity(severity: int | tuple[int, int]) -> tuple[int, int]:
    low, high = (severity, severity) if isinstance(severity, int) else severity
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high <= 5):
        raise ValueError(f"severity: expected an integer in 1..5 or a range (low, high) within it, got {severity!r}")
    return low, high


class _WeatherBase(IntensityAugmentationBase2D):
    # severity tables kept as (non-persistent) buffers: they follow the module to its device, so no
    # call copies them from the host
    _tables: ClassVar[tuple[tuple[str, tuple[float, ...]], ...]] = ()

    def __init__(
        self,
        severity: int | tuple[int, int] = (1, 5),
        p: float = 0.5,
        same_on_batch: bool = False,
        keepdim: bool = False,
    ) -> None:
        super().__init__(p=p, same_on_batch=same_on_batch, keepdim=keepdim)
        self.severity = _check_severity(severity)
        for name, values in self._tables:
            self.register_buffer(name, torch.tensor(values), persistent=False)

    def _pick(self, table: str, severity: Tensor) -> Tensor:
        """The severity table ``table`` at each sample's severity (1-5)."""
        return getattr(self, table).to(device=self.device, dtype=self.dtype)[severity - 1]

    def _uniform(self, batch: int, low: float, high: float) -> Tensor:
        draw = torch.rand(1 if self.same_on_batch else batch, device=self.device, dtype=self.dtype)
        return (low + (high - low) * draw).expand(batch)

    @staticmethod
    def _value_checks(input: Tensor) -> AbstractContextManager[None]:
        """Range/NaN checks on CPU inputs (cheap, no device); none on an accelerator (a host sync per call)."""
        return nullcontext() if input.device.type == "cpu" else values_trusted()

    def _severities(self, batch: int) -> Tensor:
        low, high = self.severity
        draw = torch.randint(low, high + 1, (1 if self.same_on_batch else batch,), device=self.device)
        return draw.expand(batch)


class RandomFog(_WeatherBase):
    """Fog by atmospheric scattering over a smooth random depth field (SPEC §2), batched on the device.

    Per sample: a plasma-fractal depth ``0.35 + 0.65·field``, a density set by the severity (1-5,
    jittered by ±10 %) and a near-white airlight ``A ~ U(0.82, 0.95)``. Differentiable in the image;
    parameters (including each depth map) replay with ``aug(x, params=aug._params)``.

    Input checks: on the CPU (the usual place, a DataLoader worker) every call checks that the
    images are float ``(B, C, H, W)`` in ``[0, 1]`` without NaN. On an accelerator only the shape and
    dtype are checked: the range check costs two reductions and a host sync, too much for every
    training batch; validate the data once upstream (e.g. ``dlguard._validation.check_images``).

    Args:
        severity: 1-5, or a range ``(low, high)`` drawn per sample.
        p: probability of applying fog to an image.
        same_on_batch: one draw for the whole batch.
        keepdim: keep a ``(C, H, W)`` input unbatched (e.g. in a DataLoader worker).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> aug = RandomFog(severity=3, p=1.0)
        >>> out = aug(torch.zeros(2, 3, 16, 16))
        >>> out.shape, bool(out.min() > 0.3)  # black scene now mostly airlight
        (torch.Size([2, 3, 16, 16]), True)
    """

    _tables = (("fog_density", FOG_DENSITY),)

    def generate_parameters(self, batch_shape: tuple[int, ...]) -> dict[str, Tensor]:
        batch, height, width = batch_shape[0], batch_shape[-2], batch_shape[-1]
        severity = self._severities(batch)
        field = plasma_field(1 if self.same_on_batch else batch, height, width, device=self.device)
        return {
            "severity": severity,
            "depth": (0.35 + 0.65 * field).expand(batch, 1, height, width).to(self.dtype),
            "density": self._pick("fog_density", severity) * self._uniform(batch, 0.9, 1.1),
            "airlight": self._uniform(batch, 0.82, 0.95),
        }

    def apply_transform(
        self, input: Tensor, params: dict[str, Tensor], flags: dict[str, Any], transform: Tensor | None = None
    ) -> Tensor:
        with self._value_checks(input):
            return fog(input, params["depth"], params["density"], params["airlight"])


class RandomRain(_WeatherBase):
    """Rain: slanted streaks (sparse drops smeared by a rotated line kernel), blur and darkening.

    Per sample: drop density, streak length (a fraction of the height), darkening and blur set by
    the severity (1-5), a slant ``U(−20°, 20°)`` and streak brightness ``U(0.75, 0.9)``. Batched
    on the device (one scatter-add draws every image's streaks), differentiable in the
    image, replayable with ``aug(x, params=aug._params)``.

    Input checks: on the CPU (the usual place, a DataLoader worker) every call checks that the
    images are float ``(B, C, H, W)`` in ``[0, 1]`` without NaN. On an accelerator only the shape and
    dtype are checked: the range check costs two reductions and a host sync, too much for every
    training batch; validate the data once upstream (e.g. ``dlguard._validation.check_images``).

    Args:
        severity: 1-5, or a range ``(low, high)`` drawn per sample.
        p: probability of applying rain to an image.
        same_on_batch: one draw for the whole batch.
        keepdim: keep a ``(C, H, W)`` input unbatched (e.g. in a DataLoader worker).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> aug = RandomRain(severity=5, p=1.0)
        >>> out = aug(torch.full((2, 3, 64, 64), 0.3))
        >>> out.shape, bool(out.max() > 0.5)  # bright streaks over a dark scene
        (torch.Size([2, 3, 64, 64]), True)
    """

    _tables = (
        ("rain_drops", RAIN_DROPS),
        ("rain_length", RAIN_LENGTH),
        ("rain_darkening", RAIN_DARKENING),
        ("rain_blur", RAIN_BLUR),
    )

    def generate_parameters(self, batch_shape: tuple[int, ...]) -> dict[str, Tensor]:
        batch, height, width = batch_shape[0], batch_shape[-2], batch_shape[-1]
        severity = self._severities(batch)
        drawn = 1 if self.same_on_batch else batch
        # the largest drop count and streak of the severity range, known here: no host sync for the sizes
        low, high = self.severity
        drops = int(max(RAIN_DROPS[low - 1 : high]) * height * width) + 1
        half = math.ceil(max(max(RAIN_LENGTH[low - 1 : high]) * height, 2.0) / 2) + 1
        length = (self._pick("rain_length", severity) * height).clamp(min=2)
        angle = self._uniform(batch, -20.0, 20.0)
        density = self._pick("rain_drops", severity)
        streaks = _streak_maps(drawn, height, width, density[:drawn], length[:drawn], angle[:drawn], drops, half)
        return {
            "severity": severity,
            "streaks": streaks.expand(batch, 1, height, width),
            "brightness": self._uniform(batch, 0.75, 0.9),
            "darkening": self._pick("rain_darkening", severity),
            "blur_sigma": self._pick("rain_blur", severity),
        }

    def apply_transform(
        self, input: Tensor, params: dict[str, Tensor], flags: dict[str, Any], transform: Tensor | None = None
    ) -> Tensor:
        with self._value_checks(input):
            return rain(input, params["streaks"], params["brightness"], params["darkening"], params["blur_sigma"])
