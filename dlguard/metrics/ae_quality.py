"""Quality of generated test cases and their AEs as a torchmetrics metric (HDA, the paper's Tables 2 and 7)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from dlguard.metrics.functional.ae_quality import (
    AE_QUALITY_MEASURES,
    AEQualityResult,
    _ae_quality_compute,
    _ae_quality_update,
    check_perceptual,
)

__all__ = ["AEQuality"]


class AEQuality(Metric):
    """AE proportion, and mean prediction loss ``J``, ``L∞`` distance ``ε``, SSIM and PSNR over the AEs.

    A test case ``x'`` of a seed ``x`` with label ``y`` is an adversarial example (AE) when
    ``J = max_{j≠y} z_j − z_y ≥ 0`` on the model's logits ``z = f(x')``; see
    :func:`~dlguard.metrics.functional.ae_quality.ae_quality` for the definitions.

    ``update(logits, target, tests, seeds)`` takes logits ``(N, K)`` of the test cases, their seeds'
    labels ``(N,)``, the test cases ``(N, ...)`` and their seeds (same shape, values in ``[0, 1]``).
    ``compute()`` returns an :class:`~dlguard.metrics.functional.ae_quality.AEQualityResult`
    (float64 scalars; means over the AEs are NaN when there is none). States are sums (test cases,
    AEs, and over the AEs ``Σ J``, ``Σ ε``, ``Σ SSIM``, ``Σ PSNR``) reduced by ``sum``, so N
    processes report what one process reports for the same test cases (up to float64 rounding).

    Args:
        perceptual: measures to compute, a subset of ``("ssim", "psnr")``; the others are NaN. SSIM
            scores images ``(N, C, H, W)`` of at least 11x11 only and is NaN for other inputs.
        validate_args: check the values of every update (NaN, label range: a host sync each); a caller
            feeding its own checked outputs (the HDA callback, from the GA's run) passes ``False``.

    Example:
        >>> import torch
        >>> seeds = torch.full((4, 1, 16, 16), 0.5)
        >>> tests = seeds + torch.tensor([0.1, -0.05, 0.02, 0.0]).view(4, 1, 1, 1)
        >>> logits = torch.tensor([[0.0, 2.0], [1.0, 1.0], [3.0, 0.0], [1.0, 0.0]])  # J = 2, 0, -3, -1
        >>> metric = AEQuality(perceptual=("psnr",))
        >>> metric.update(logits[:3], torch.zeros(3, dtype=torch.long), tests[:3], seeds[:3])
        >>> metric.update(logits[3:], torch.zeros(1, dtype=torch.long), tests[3:], seeds[3:])
        >>> result = metric.compute()
        >>> float(result.ae_proportion), float(result.prediction_loss), round(float(result.epsilon), 4)
        (0.5, 1.0, 0.075)
        >>> round(float(result.psnr), 2), bool(result.ssim.isnan())
        (23.01, True)
    """

    is_differentiable = False
    higher_is_better: bool | None = None  # more AEs and higher J: stronger tests; higher SSIM/PSNR: subtler ones
    full_state_update = False

    count: Tensor
    ae_count: Tensor
    loss_sum: Tensor
    epsilon_sum: Tensor
    ssim_sum: Tensor
    psnr_sum: Tensor

    def __init__(
        self, perceptual: Sequence[str] = AE_QUALITY_MEASURES, validate_args: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.perceptual = check_perceptual(perceptual)
        self.validate_args = validate_args
        for name in ("count", "ae_count"):
            self.add_state(name, torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        for name in ("loss_sum", "epsilon_sum", "ssim_sum", "psnr_sum"):
            self.add_state(name, torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logits: Tensor, target: Tensor, tests: Tensor, seeds: Tensor) -> None:
        """Add ``N`` test cases: logits ``(N, K)``, seed labels ``(N,)``, test cases and seeds ``(N, ...)``."""
        sums = _ae_quality_update(logits, target, tests, seeds, self.perceptual, self.validate_args)
        device = self.count.device
        self.count += sums[0].to(device)
        self.ae_count += sums[1].to(device)
        self.loss_sum += sums[2].to(device, self.loss_sum.dtype)
        self.epsilon_sum += sums[3].to(device, self.epsilon_sum.dtype)
        self.ssim_sum += sums[4].to(device, self.ssim_sum.dtype)
        self.psnr_sum += sums[5].to(device, self.psnr_sum.dtype)

    def compute(self) -> AEQualityResult:
        """The proportion and means over every test case added."""
        return _ae_quality_compute(
            self.count, self.ae_count, self.loss_sum, self.epsilon_sum, self.ssim_sum, self.psnr_sum
        )
