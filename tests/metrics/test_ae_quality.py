from __future__ import annotations

import math
from dataclasses import astuple

import pytest
import torch

from dlguard.metrics.ae_quality import AEQuality
from dlguard.metrics.functional.ae_quality import AEQualityResult, ae_quality

C1, C2 = 0.01**2, 0.03**2  # SSIM's constants for data range 1


def constant_cases() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Five constant 16x16 images 0.5 shifted by a constant (float64: SSIM's variances cancel exactly in float32
    only up to ~1e-7, which C2 = 9e-4 turns into ~1e-5); labels 0; J = 2, 0, -3, 0.5, -1."""
    seeds = torch.full((5, 1, 16, 16), 0.5, dtype=torch.float64)
    shifts = torch.tensor([0.1, -0.05, 0.3, 0.2, 0.0], dtype=torch.float64)
    tests = seeds + shifts.view(5, 1, 1, 1)
    logits = torch.tensor([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.5], [1.0, 0.0, 0.0]])
    return logits, torch.zeros(5, dtype=torch.long), tests, seeds


def ssim_of_constants(a: float, b: float) -> float:
    """SSIM of two constant images: variances and covariance vanish, only the luminance term is left."""
    return (2 * a * b + C1) / (a * a + b * b + C1) * (C2 / C2)


def test_constant_images_by_hand() -> None:
    logits, target, tests, seeds = constant_cases()
    result = ae_quality(logits, target, tests, seeds)
    # AEs: the first (J 2, shift 0.1), second (J 0: a tie counts) and fourth (J 0.5, shift 0.2)
    assert int(result.count) == 5
    assert float(result.ae_proportion) == pytest.approx(3 / 5)
    assert float(result.prediction_loss) == pytest.approx((2 + 0 + 0.5) / 3)
    assert float(result.epsilon) == pytest.approx((0.1 + 0.05 + 0.2) / 3, rel=1e-12)
    psnr = [-20 * math.log10(d) for d in (0.1, 0.05, 0.2)]  # PSNR of a constant shift d: 10·log10(1/d²)
    assert float(result.psnr) == pytest.approx(sum(psnr) / 3, rel=1e-6)  # torchmetrics: float32 inside
    ssim = [ssim_of_constants(0.5, 0.5 + d) for d in (0.1, -0.05, 0.2)]
    assert float(result.ssim) == pytest.approx(sum(ssim) / 3, rel=1e-9)
    assert 0.9 < float(result.ssim) < 0.99
    assert result.ssim.dtype == torch.float64


def test_no_ae_means_are_nan_and_measures_can_be_left_out() -> None:
    logits, target, tests, seeds = constant_cases()
    none = ae_quality(logits[[2, 4]], target[[2, 4]], tests[[2, 4]], seeds[[2, 4]])
    assert float(none.ae_proportion) == 0.0 and int(none.count) == 2
    assert all(math.isnan(float(v)) for v in (none.prediction_loss, none.epsilon, none.ssim, none.psnr))
    bare = ae_quality(logits, target, tests, seeds, perceptual=())
    assert math.isnan(float(bare.ssim)) and math.isnan(float(bare.psnr))
    assert float(bare.epsilon) == pytest.approx(0.35 / 3, rel=1e-12)
    only_psnr = ae_quality(logits, target, tests, seeds, perceptual="psnr")
    assert math.isnan(float(only_psnr.ssim)) and not math.isnan(float(only_psnr.psnr))


def test_signals_get_psnr_and_epsilon_but_no_ssim() -> None:
    """Any tensor input: 1-D signals (N, C, T) and small images have no SSIM (NaN), the rest is computed."""
    logits, target, _, _ = constant_cases()
    gen = torch.Generator().manual_seed(0)
    seeds = torch.rand(5, 2, 30, generator=gen) * 0.8
    tests = seeds + torch.rand(5, 2, 30, generator=gen) * 0.1
    result = ae_quality(logits, target, tests, seeds)
    ae = torch.tensor([0, 1, 3])
    assert math.isnan(float(result.ssim))
    expected_eps = (tests[ae] - seeds[ae]).abs().amax(dim=(1, 2)).double().mean()
    assert float(result.epsilon) == pytest.approx(float(expected_eps), rel=1e-6)
    mse = (tests[ae] - seeds[ae]).double().square().mean(dim=(1, 2))
    assert float(result.psnr) == pytest.approx(float((-10 * mse.log10()).mean()), rel=1e-5)
    small = ae_quality(logits, target, torch.full((5, 1, 8, 8), 0.6), torch.full((5, 1, 8, 8), 0.5))
    assert math.isnan(float(small.ssim)) and float(small.psnr) == pytest.approx(20.0, rel=1e-5)


def test_metric_over_uneven_batches_equals_functional() -> None:
    gen = torch.Generator().manual_seed(1)
    seeds = torch.rand(23, 1, 12, 12, generator=gen)
    tests = (seeds + (torch.rand(23, 1, 12, 12, generator=gen) - 0.5) * 0.2).clamp(0, 1)
    logits = torch.randn(23, 4, generator=gen)
    target = torch.randint(0, 4, (23,), generator=gen)
    expected = ae_quality(logits, target, tests, seeds)
    assert 0 < float(expected.ae_proportion) < 1
    metric = AEQuality()
    for part in (slice(0, 1), slice(1, 9), slice(9, 23)):
        metric.update(logits[part], target[part], tests[part], seeds[part])
    result = metric.compute()
    assert isinstance(result, AEQualityResult)
    for got, want in zip(astuple(result), astuple(expected), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    metric.reset()
    with pytest.warns(UserWarning, match="before the ``update``"), pytest.raises(ValueError, match="no test cases"):
        metric.compute()


def _bad(**changes: object) -> dict[str, object]:
    logits, target, tests, seeds = constant_cases()
    return {"logits": logits, "target": target, "tests": tests, "seeds": seeds} | changes


@pytest.mark.parametrize(
    ("arguments", "name"),
    [
        (_bad(seeds=torch.zeros(5, 1, 16, 15)), "seeds"),
        (_bad(logits=torch.zeros(4, 3)), "logits"),
        (_bad(logits=torch.zeros(5, 3, dtype=torch.long)), "logits"),
        (_bad(target=torch.zeros(4, dtype=torch.long)), "target"),
        (_bad(target=torch.zeros(5)), "target"),
        (_bad(tests=torch.full((5, 1, 16, 16), float("nan"))), "tests"),
        (_bad(seeds=torch.full((5, 1, 16, 16), float("nan"))), "seeds"),
        (_bad(tests=torch.zeros(5)), "tests"),
        (_bad(perceptual=("ssim", "lpips")), "perceptual"),
    ],
)
def test_bad_input_names_the_argument(arguments: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}:"):
        ae_quality(**arguments)
    perceptual = arguments.pop("perceptual", ("ssim", "psnr"))
    with pytest.raises(ValueError, match=f"^{name}:"):
        AEQuality(perceptual).update(**arguments)
