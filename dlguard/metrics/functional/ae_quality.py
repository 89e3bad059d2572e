"""Quality of generated test cases and the adversarial examples among them (HDA, the paper's Tables 2 and 7).

Over test cases ``x'`` generated around seeds ``x`` (label ``y``), with prediction loss
``J = max_{j≠y} z_j − z_y`` (:func:`~dlguard.metrics.functional.hda.prediction_loss`; ``J ≥ 0`` ⇔
adversarial example, AE):

- AE proportion: the share of test cases with ``J ≥ 0``;
- prediction loss: the mean ``J`` over the AEs (their adversarial strength);
- ``ε``: the mean ``L∞`` distance ``‖x' − x‖_∞`` over the AEs;
- SSIM and PSNR: the means of :func:`~dlguard.metrics.functional.perceptual.perceptual_quality`
  over the AEs (data range 1, PSNR capped at ``PSNR_CAP``).

Means over the AEs are NaN when there is none. Every quantity is a sum over test cases divided by
a count, so the module metric (:class:`~dlguard.metrics.ae_quality.AEQuality`) keeps sums that
reduce by ``sum`` across processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dlguard._validation import check_labels, check_logits, check_tensor, check_values
from dlguard.metrics.functional.hda import prediction_loss
from dlguard.metrics.functional.perceptual import perceptual_quality

__all__ = ["AE_QUALITY_MEASURES", "AEQualityResult", "ae_quality"]

AE_QUALITY_MEASURES: tuple[str, ...] = ("ssim", "psnr")
"""Perceptual measures :func:`ae_quality` can report."""
_SSIM_WINDOW = 11  # torchmetrics' default Gaussian window: SSIM needs images at least this large


@dataclass
class AEQualityResult:
    """Quality of a set of generated test cases (scalar tensors)."""

    ae_proportion: Tensor
    """Share of test cases that are AEs (``J ≥ 0``)."""
    prediction_loss: Tensor
    """Mean ``J`` over the AEs (NaN without AEs)."""
    epsilon: Tensor
    """Mean ``L∞`` distance between an AE and its seed (NaN without AEs)."""
    ssim: Tensor
    """Mean SSIM of the AEs against their seeds (NaN without AEs, when not asked for, or for non-images)."""
    psnr: Tensor
    """Mean PSNR (dB) of the AEs against their seeds (NaN without AEs or when not asked for)."""
    count: Tensor
    """Number of test cases."""


def check_perceptual(perceptual: object) -> tuple[str, ...]:
    """``perceptual`` as a tuple of names from :data:`AE_QUALITY_MEASURES` (a single name is allowed)."""
    names = (perceptual,) if isinstance(perceptual, str) else perceptual
    if not isinstance(names, Sequence) or not all(name in AE_QUALITY_MEASURES for name in names):
        raise ValueError(f"perceptual: expected names from {AE_QUALITY_MEASURES}, got {perceptual!r}")
    return tuple(dict.fromkeys(names))


def _ssim_applies(tests: Tensor) -> bool:
    """SSIM scores images ``(B, C, H, W)`` at least as large as its window; anything else gets NaN."""
    return tests.ndim == 4 and min(tests.shape[-2:]) >= _SSIM_WINDOW


def _ae_quality_update(
    logits: Tensor,
    target: Tensor,
    tests: Tensor,
    seeds: Tensor,
    perceptual: Sequence[str] = AE_QUALITY_MEASURES,
    validate_args: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Sums over a batch: test cases, AEs, and over the AEs ``Σ J``, ``Σ ε``, ``Σ SSIM``, ``Σ PSNR`` (float64).

    A measure not asked for (or SSIM of non-images) sums NaN per AE, so its mean is NaN.
    ``validate_args=False`` skips the checks that read values (NaN, label range).
    """
    perceptual = check_perceptual(perceptual)
    check_tensor("tests", tests, min_ndim=2, floating=True)
    if seeds.shape != tests.shape:
        raise ValueError(f"seeds: expected the shape of tests {tuple(tests.shape)}, got {tuple(seeds.shape)}")
    check_tensor("seeds", seeds, floating=True)
    batch = len(tests)
    check_tensor("logits", logits, floating=True)
    check_logits("logits", logits, batch, hint=" (one row per test case)")
    if validate_args:
        check_labels("target", target, batch)
        for name, value in (("logits", logits), ("tests", tests), ("seeds", seeds)):
            check_values(name, value, None)
    elif tuple(target.shape) != (batch,):
        raise ValueError(f"target: expected labels of shape ({batch},), got {tuple(target.shape)}")

    loss = prediction_loss(logits, target.to(logits.device))
    adversarial = loss >= 0
    mask = adversarial.to(tests.device)
    ae_tests, ae_seeds = tests[mask], seeds.to(tests.device)[mask]
    epsilon = (ae_tests - ae_seeds).abs().flatten(1).amax(dim=1)
    sums = []
    for measure in AE_QUALITY_MEASURES:
        if not len(ae_tests):
            total = torch.zeros((), dtype=torch.float64, device=tests.device)
        elif measure in perceptual and (measure != "ssim" or _ssim_applies(tests)):
            total = perceptual_quality(ae_tests, ae_seeds, measure).double().sum()
        else:
            total = torch.full((), float("nan"), dtype=torch.float64, device=tests.device)
        sums.append(total.to(logits.device))
    return (
        torch.tensor(batch, dtype=torch.long, device=logits.device),
        adversarial.sum(),
        loss[adversarial].double().sum(),
        epsilon.double().sum().to(logits.device),
        *sums,
    )


def _ae_quality_compute(
    count: Tensor, ae_count: Tensor, loss_sum: Tensor, epsilon_sum: Tensor, ssim_sum: Tensor, psnr_sum: Tensor
) -> AEQualityResult:
    """Proportion and means from the sums of :func:`_ae_quality_update` (float64 scalars)."""
    if int(count) == 0:
        raise ValueError("AEQuality: no test cases were added")
    aes = ae_count.double()

    def over_aes(total: Tensor) -> Tensor:
        return total / aes if int(ae_count) > 0 else torch.full_like(total, float("nan"))

    return AEQualityResult(
        ae_proportion=aes / count.double(),
        prediction_loss=over_aes(loss_sum),
        epsilon=over_aes(epsilon_sum),
        ssim=over_aes(ssim_sum),
        psnr=over_aes(psnr_sum),
        count=count.clone(),
    )


def ae_quality(
    logits: Tensor, target: Tensor, tests: Tensor, seeds: Tensor, perceptual: Sequence[str] = AE_QUALITY_MEASURES
) -> AEQualityResult:
    """AE proportion, and the prediction loss, ``L∞`` distance, SSIM and PSNR of the AEs among test cases.

    A test case ``x'`` of seed ``x`` with label ``y`` is an AE when ``J = max_{j≠y} z_j − z_y ≥ 0``
    on the model's logits ``z = f(x')``. Means are over the AEs only, as in the paper's Tables 2 and 7.

    Args:
        logits: ``(N, K)`` the model's logits on the test cases.
        target: ``(N,)`` the labels of their seeds.
        tests: ``(N, ...)`` test cases, values in ``[0, 1]`` (PSNR uses data range 1).
        seeds: ``(N, ...)`` the seed of each test case (same shape; repeat a seed for its several test cases).
        perceptual: measures to compute, a subset of ``("ssim", "psnr")``; the others are NaN. SSIM
            scores images ``(N, C, H, W)`` of at least 11x11 only and is NaN for other inputs.

    Returns:
        :class:`AEQualityResult` of float64 scalars (``count`` an integer).

    Raises:
        ValueError: naming the argument, for shapes that do not match, NaN, or no test case.

    Example:
        >>> seeds = torch.full((4, 1, 16, 16), 0.5)
        >>> tests = seeds + torch.tensor([0.1, -0.05, 0.02, 0.0]).view(4, 1, 1, 1)
        >>> logits = torch.tensor([[0.0, 2.0], [1.0, 1.0], [3.0, 0.0], [1.0, 0.0]])  # J = 2, 0, -3, -1
        >>> result = ae_quality(logits, torch.zeros(4, dtype=torch.long), tests, seeds)
        >>> float(result.ae_proportion), float(result.prediction_loss), round(float(result.epsilon), 4)
        (0.5, 1.0, 0.075)
        >>> round(float(result.psnr), 2)  # (20 dB + 26.02 dB) / 2
        23.01
    """
    return _ae_quality_compute(*_ae_quality_update(logits, target, tests, seeds, perceptual))
