from __future__ import annotations

import math

import pytest
import torch

from dlguard.metrics import DScore
from dlguard.metrics.functional import d_score, g_bound

# The D-Score paper, n = 3: Table III (deletion mutants), Table IV (translated sets), Table V.
TABLES = {
    "MMB": (
        0.9908,
        [.9901, .9564, .9859, .9792, .7943, .9542, .9893, .8816, .9860],
        [.2103, .4185, .2963, .5620, .9639, .6280, .3001, .4218, .1003],
        (0.2758, 0.9527, 0.6769),
    ),
    "CM": (
        0.7966,
        [.7735, .7576, .7775, .7609, .7104, .7615, .7708, .7556, .7760],
        [.4231, .4861, .4090, .5122, .6240, .5088, .4429, .5511, .4528],
        (0.1290, 0.7812, 0.6522),
    ),
}  # fmt: skip


@pytest.mark.parametrize("model", list(TABLES))
def test_reproduces_table_v(model: str) -> None:
    baseline, deletion, translation, (v_robust, v_fitness, score) = TABLES[model]
    result = d_score(baseline, torch.tensor(deletion), torch.tensor(translation), num_classes=10)
    assert float(result.v_robust) == pytest.approx(v_robust, abs=1e-3)
    assert float(result.v_fitness) == pytest.approx(v_fitness, abs=1e-3)
    assert float(result.d_score) == pytest.approx(score, abs=1e-3)


def test_distributions_by_hand_for_n_2() -> None:
    # â = 0.8; losses 0, 0.2, 0.1, 0.1 -> f̃ = 0, .5, .25, .25; a = .2, .2, .4, .2 -> ã = .2, .2, .4, .2
    result = d_score(0.8, [0.8, 0.6, 0.7, 0.7], [0.2, 0.2, 0.4, 0.2], num_classes=2)
    torch.testing.assert_close(result.feature_distribution, torch.tensor([0, 0.5, 0.25, 0.25], dtype=torch.float64))
    torch.testing.assert_close(result.attention_distribution, torch.tensor([0.2, 0.2, 0.4, 0.2], dtype=torch.float64))
    fitness = 0.8 - math.sqrt(0.2**2 + 0.3**2 + 0.15**2 + 0.05**2) / 4
    robust = (
        math.sqrt(0.25**2 + 0.25**2 + 0 + 0) + math.sqrt(0.05**2 * 3 + 0.15**2) + math.sqrt(0.6**2 * 3 + 0.4**2)
    ) / 4
    assert float(result.v_fitness) == pytest.approx(fitness)
    assert float(result.v_robust) == pytest.approx(robust)
    g = 2 * math.sqrt(3) / 8 + 0.5 * 0.5
    assert float(result.g_n) == pytest.approx(g) and g_bound(2, 2) == pytest.approx(g)
    assert float(result.augment_probability) == pytest.approx(min(robust / g, 1.0))


def test_no_loss_gives_uniform_feature_distribution() -> None:
    result = d_score(0.5, [0.6] * 9, [0.0] * 9, num_classes=10)
    torch.testing.assert_close(result.feature_distribution, torch.full((9,), 1 / 9, dtype=torch.float64))
    torch.testing.assert_close(result.attention_distribution, torch.full((9,), 1 / 9, dtype=torch.float64))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1.2, [0.5] * 4, [0.5] * 4), "baseline_accuracy: expected accuracies in \\[0, 1\\]"),
        ((0.5, [0.5] * 4, [0.5, 0.5, 0.5, -0.1]), "translation_accuracy: expected accuracies"),
        ((0.5, [0.5] * 4, [0.5] * 9), "expected the same length"),
        ((0.5, [0.5] * 8, [0.5] * 8), "n² accuracies with n >= 2"),
        ((0.5, [0.5], [0.5]), "n² accuracies with n >= 2"),
        ((0.5, [0.5, float("nan"), 0.5, 0.5], [0.5] * 4), "deletion_accuracy: contains NaN"),
    ],
)
def test_bad_accuracies(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        d_score(*args, num_classes=10)


def test_g_bound_rejects_bad_grid() -> None:
    with pytest.raises(ValueError, match="n: expected an integer grid size of at least 2"):
        g_bound(1, 10)


def random_logits(seed: int, batch: int = 40, n: int = 3, k: int = 5) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, k, (batch,), generator=gen)
    return (
        torch.randn(batch, k, generator=gen) + 2 * torch.nn.functional.one_hot(target, k),
        torch.randn(n * n, batch, k, generator=gen) + torch.nn.functional.one_hot(target, k),
        torch.randn(n * n, batch, k, generator=gen),
        target,
    )


def test_metric_counts_match_a_direct_computation_and_any_split() -> None:
    baseline, mutants, translated, target = random_logits(0)
    whole = DScore(n=3, num_classes=5)
    whole.update(baseline, mutants, translated, target)
    split = DScore(n=3, num_classes=5)
    for idx in (slice(0, 13), slice(13, 40)):
        split.update(baseline[idx], mutants[:, idx], translated[:, idx], target[idx])
    expected = d_score(
        (baseline.argmax(1) == target).double().mean(),
        torch.stack([(m.argmax(1) == target).double().mean() for m in mutants]),
        torch.stack([(m.argmax(1) == target).double().mean() for m in translated]),
        num_classes=5,
    )
    for got in (whole.compute(), split.compute()):
        for name in ("d_score", "v_robust", "v_fitness", "feature_distribution"):
            torch.testing.assert_close(getattr(got, name), getattr(expected, name))


def test_metric_rejects_bad_shapes_and_empty_state() -> None:
    baseline, mutants, translated, target = random_logits(1)
    metric = DScore(n=2, num_classes=5)
    with pytest.raises(ValueError, match="mutant_logits: expected n² = 4 mutants, got 9"):
        metric.update(baseline, mutants, translated, target)
    with pytest.raises(ValueError, match="target: expected shape \\(40,\\)"):
        DScore(n=3, num_classes=5).update(baseline, mutants, translated, target[:3])
    with pytest.raises(ValueError, match="no probe inputs"):
        metric.compute()
    with pytest.raises(ValueError, match="n: expected"):
        DScore(n=1, num_classes=5)


def test_plot_draws_two_n_by_n_heatmaps() -> None:
    metric = DScore(n=3, num_classes=5)
    metric.update(*random_logits(2))
    _, axes = metric.plot()
    assert axes[0].images[0].get_array().shape == (3, 3) and axes[1].images[0].get_array().shape == (3, 3)
