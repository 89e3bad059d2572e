"""Perceptual quality of test cases against their seeds, per test case: −MSE, PSNR or SSIM (HDA, SPEC §4).

HDA's second fitness term and its quality report score each test case ``x'`` against its seed
``x`` with one of three measures (higher is closer): ``−MSE``, PSNR (dB, data range 1) and SSIM
(Gaussian window 11, σ 1.5), the last two by torchmetrics' batched functionals. PSNR of a test
case equal to its seed is infinite; it is capped at :data:`PSNR_CAP` dB so that fitness stays
finite.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

from dlguard._validation import check_tensor, one_of

__all__ = ["PERCEPTUAL_MEASURES", "PSNR_CAP", "perceptual_quality"]

PerceptualMeasure = Literal["mse", "psnr", "ssim"]
PERCEPTUAL_MEASURES: tuple[str, ...] = ("mse", "psnr", "ssim")
PSNR_CAP = 100.0
"""PSNR (dB) reported for a test case equal to its seed (where PSNR is infinite)."""


def check_measure(measure: object, ndim: int | None = None) -> str:
    """``measure`` is one of :data:`PERCEPTUAL_MEASURES`; SSIM needs images ``(B, C, H, W)``."""
    measure = one_of("perceptual", measure, PERCEPTUAL_MEASURES)
    if measure == "ssim" and ndim is not None and ndim != 4:
        raise ValueError(
            f"perceptual: 'ssim' needs images (B, C, H, W), got inputs with {ndim} dimensions; use 'mse' or 'psnr'"
        )
    return measure


def perceptual_quality(tests: Tensor, seeds: Tensor, measure: PerceptualMeasure = "mse") -> Tensor:
    """Quality ``q(x', x)`` of each test case against its seed, ``(B,)``; higher is closer.

    Args:
        tests: ``(B, ...)`` test cases in ``[0, 1]``.
        seeds: ``(B, ...)`` their seeds (same shape).
        measure: ``"mse"`` (``−MSE``), ``"psnr"`` (dB, capped at :data:`PSNR_CAP`) or ``"ssim"``
            (images ``(B, C, H, W)`` of at least 11x11 only).

    Example:
        >>> seeds = torch.full((2, 1, 16, 16), 0.5)
        >>> tests = seeds + torch.tensor([0.0, 0.1]).view(2, 1, 1, 1)
        >>> [round(float(q), 3) for q in perceptual_quality(tests, seeds, "mse")]
        [-0.0, -0.01]
        >>> [round(float(q), 1) for q in perceptual_quality(tests, seeds, "psnr")]
        [100.0, 20.0]
    """
    check_tensor("tests", tests, floating=True)
    if seeds.shape != tests.shape:
        raise ValueError(f"seeds: expected the shape of tests {tuple(tests.shape)}, got {tuple(seeds.shape)}")
    check_measure(measure, tests.ndim)
    seeds = seeds.to(device=tests.device, dtype=tests.dtype)
    if measure == "mse":
        return -(tests - seeds).square().flatten(1).mean(dim=1)
    if measure == "psnr":
        dims = tuple(range(1, tests.ndim))
        psnr = peak_signal_noise_ratio(tests, seeds, data_range=1.0, reduction="none", dim=dims)
        return torch.nan_to_num(psnr, posinf=PSNR_CAP).clamp_max(PSNR_CAP)
    return structural_similarity_index_measure(tests, seeds, data_range=1.0, reduction="none")
