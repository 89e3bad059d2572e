"""Padding translation towards a grid region as a kornia augmentation."""

from __future__ import annotations

from typing import Any

import torch
from kornia.augmentation import GeometricAugmentationBase2D
from torch import Tensor

from dlguard._validation import check_translation
from dlguard.augment.functional.padding import pad_resize_matrix
from dlguard.augment.functional.translate import pad_to_region

__all__ = ["RegionTranslate"]


class RegionTranslate(GeometricAugmentationBase2D):
    """Push images towards a region of an ``n x n`` grid (D-Score's translation, SPEC §1).

    Each image goes to ``region`` (0-based, row-major), or to a region drawn uniformly per sample
    when ``region`` is ``None``; the op is :func:`~dlguard.augment.functional.pad_to_region`
    (zero padding in steps of ``⌊side/t⌋``, antialiased resize). The transformation matrix is
    exact, so boxes and keypoints follow.

    Args:
        n: grid size (``>= 2``).
        region: fixed region in ``0..n²−1``, or ``None`` for a random one per sample.
        t: padding step divisor (``> 1``).
        p: probability of applying the translation.
        same_on_batch: one random region for the whole batch.
        keepdim: keep a ``(C, H, W)`` input unbatched.

    Example:
        >>> import torch
        >>> aug = RegionTranslate(n=3, region=8, t=2, p=1.0)
        >>> dot = torch.zeros(1, 1, 30, 30); dot[..., 15, 15] = 1
        >>> divmod(int(aug(dot).flatten().argmax()), 30)  # bottom-right third
        (22, 22)
    """

    def __init__(
        self,
        n: int,
        region: int | None = None,
        t: int = 5,
        p: float = 1.0,
        same_on_batch: bool = False,
        keepdim: bool = False,
    ) -> None:
        check_translation(n, t)
        if region is not None and not 0 <= region < n * n:
            raise ValueError(f"region: expected a region in 0..{n * n - 1} or None, got {region}")
        super().__init__(p=p, same_on_batch=same_on_batch, keepdim=keepdim)
        self.n, self.region, self.t = n, region, t

    def generate_parameters(self, batch_shape: tuple[int, ...]) -> dict[str, Tensor]:
        batch = batch_shape[0]
        if self.region is not None:
            return {"region": torch.full((batch,), self.region, device=self.device, dtype=torch.long)}
        draws = torch.randint(0, self.n * self.n, (1 if self.same_on_batch else batch,), device=self.device)
        return {"region": draws.expand(batch)}

    def compute_transformation(self, input: Tensor, params: dict[str, Tensor], flags: dict[str, Any]) -> Tensor:
        height, width = input.shape[-2:]
        region = params["region"].to(input.device)
        step_h, step_w = height // self.t, width // self.t
        total = torch.ones_like(region, dtype=input.dtype) * (self.n - 1)
        return pad_resize_matrix(
            height,
            width,
            total * step_w,
            total * step_h,
            (region % self.n).to(input.dtype) * step_w,
            (region // self.n).to(input.dtype) * step_h,
        )

    def apply_transform(
        self, input: Tensor, params: dict[str, Tensor], flags: dict[str, Any], transform: Tensor | None = None
    ) -> Tensor:
        return pad_to_region(input, self.n, params["region"].to(input.device), self.t)
