"""Random photometric augmentations that kornia lacks or parametrises differently."""

from __future__ import annotations

from typing import Any

import torch
from kornia.augmentation import IntensityAugmentationBase2D
from torch import Tensor

from dlguard.augment.functional.photometric import brightness_scale, brightness_shift, gaussian_noise

__all__ = ["RandomBrightnessScale", "RandomBrightnessShift", "RandomNoise"]


class _RangeAugmentation(IntensityAugmentationBase2D):
    """Draws one value per sample uniformly from ``value_range`` into ``params[key]``."""

    key = "value"

    def __init__(self, value_range: tuple[float, float], p: float, same_on_batch: bool, keepdim: bool) -> None:
        low, high = value_range
        if low > high:
            raise ValueError(f"{self.key}: expected a range (low, high) with low <= high, got {value_range}")
        super().__init__(p=p, same_on_batch=same_on_batch, keepdim=keepdim)
        self.value_range = (float(low), float(high))

    def generate_parameters(self, batch_shape: tuple[int, ...]) -> dict[str, Tensor]:
        batch = batch_shape[0]
        low, high = self.value_range
        draw = torch.rand(1 if self.same_on_batch else batch, device=self.device, dtype=self.dtype)
        return {self.key: (low + (high - low) * draw).expand(batch)}


class RandomBrightnessShift(_RangeAugmentation):
    """DeepTest's additive brightness ``x + β``, ``β ~ U(shift)`` per sample.

    kornia's ``RandomBrightness`` adds the same shift but is parametrised as ``1 + β``; this takes
    the papers' ``β`` directly (DeepTest Table 4: 10/255 to 100/255).

    Example:
        >>> import torch
        >>> aug = RandomBrightnessShift(shift=(0.2, 0.2), p=1.0)
        >>> aug(torch.full((1, 1, 2, 2), 0.5)).unique()
        tensor([0.7000])
    """

    key = "beta"

    def __init__(
        self,
        shift: tuple[float, float] = (10 / 255, 100 / 255),
        p: float = 0.5,
        same_on_batch: bool = False,
        keepdim: bool = False,
    ) -> None:
        super().__init__(shift, p, same_on_batch, keepdim)

    def apply_transform(
        self, input: Tensor, params: dict[str, Tensor], flags: dict[str, Any], transform: Tensor | None = None
    ) -> Tensor:
        return brightness_shift(input, params["beta"].to(input))


class RandomBrightnessScale(_RangeAugmentation):
    """The framework's multiplicative brightness ``β·x``, ``β ~ U(scale)`` per sample (SPEC §5).

    Example:
        >>> import torch
        >>> aug = RandomBrightnessScale(scale=(1.5, 1.5), p=1.0)
        >>> aug(torch.full((1, 1, 2, 2), 0.4)).unique()
        tensor([0.6000])
    """

    key = "beta"

    def __init__(
        self,
        scale: tuple[float, float] = (0.5, 1.5),
        p: float = 0.5,
        same_on_batch: bool = False,
        keepdim: bool = False,
    ) -> None:
        if scale[0] < 0:
            raise ValueError(f"scale: expected non-negative factors, got {scale}")
        super().__init__(scale, p, same_on_batch, keepdim)

    def apply_transform(
        self, input: Tensor, params: dict[str, Tensor], flags: dict[str, Any], transform: Tensor | None = None
    ) -> Tensor:
        return brightness_scale(input, params["beta"].to(input))


class RandomNoise(_RangeAugmentation):
    """Gaussian noise ``x + N(0, σ²)`` with ``σ ~ U(sigma)`` per sample (kornia's has one fixed ``std``).

    The noise itself is part of the parameters, so ``aug(x, params=aug._params)`` replays it.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> aug = RandomNoise(sigma=(0.1, 0.1), p=1.0)
        >>> out = aug(torch.full((1, 1, 64, 64), 0.5))
        >>> round(float(out.std()), 2)
        0.1
    """

    key = "sigma"

    def __init__(
        self,
        sigma: tuple[float, float] = (0.0, 0.1),
        p: float = 0.5,
        same_on_batch: bool = False,
        keepdim: bool = False,
    ) -> None:
        if sigma[0] < 0:
            raise ValueError(f"sigma: expected non-negative standard deviations, got {sigma}")
        super().__init__(sigma, p, same_on_batch, keepdim)

    def generate_parameters(self, batch_shape: tuple[int, ...]) -> dict[str, Tensor]:
        params = super().generate_parameters(batch_shape)
        params["noise"] = torch.randn(batch_shape, device=self.device, dtype=self.dtype)
        return params

    def apply_transform(
        self, input: Tensor, params: dict[str, Tensor], flags: dict[str, Any], transform: Tensor | None = None
    ) -> Tensor:
        return gaussian_noise(input, params["sigma"].to(input), noise=params["noise"])
