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
    with pytest.raises(ValueError, match="target: expected labels of shape \\(40,\\)"):
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


def test_plot_draws_into_the_given_axes() -> None:
    from matplotlib.figure import Figure

    metric = DScore(n=2, num_classes=5)
    baseline, mutants, translated, target = random_logits(3, n=2)
    metric.update(baseline, mutants, translated, target)
    result = metric.compute()
    figure = Figure()
    given = figure.subplots(2, 2).flat  # draw into the bottom row of a larger figure
    bottom = [given[2], given[3]]
    got_figure, got_axes = metric.plot(result, ax=bottom)
    assert got_figure is figure and list(got_axes) == bottom
    torch.testing.assert_close(
        torch.as_tensor(bottom[0].images[0].get_array()).flatten(), result.feature_distribution, check_dtype=False
    )
    torch.testing.assert_close(
        torch.as_tensor(bottom[1].images[0].get_array()).flatten(), result.attention_distribution, check_dtype=False
    )
    assert not given[0].images and not given[1].images
    with pytest.raises(ValueError, match="ax: expected a sequence of 2 matplotlib Axes"):
        metric.plot(result, ax=given[0])
    with pytest.raises(ValueError, match="ax: expected a sequence of 2 matplotlib Axes of one figure"):
        metric.plot(result, ax=[given[0], Figure().subplots()])


def test_update_rejects_labels_outside_the_logits() -> None:
    baseline, mutants, translated, target = random_logits(4)  # K = 5
    for bad in (torch.where(target == 0, 5, target), torch.where(target == 0, -1, target)):
        metric = DScore(n=3, num_classes=5)
        with pytest.raises(ValueError, match=r"target: expected labels in \[0, 5\)"):
            metric.update(baseline, mutants, translated, bad)
        assert int(metric.total) == 0  # refused before anything was counted
    with pytest.raises(ValueError, match="target: expected integer class labels"):
        DScore(n=3, num_classes=5).update(baseline, mutants, translated, target.float())


@pytest.mark.parametrize("num_classes", [3, 10])
def test_update_rejects_logits_of_another_width(num_classes: int) -> None:
    # a smaller num_classes used to change g(n), and so the guide's p, without a word
    metric = DScore(n=3, num_classes=num_classes)
    with pytest.raises(ValueError, match=f"num_classes: is {num_classes} but the logits have 5 classes"):
        metric.update(*random_logits(5))


def test_result_carries_the_accuracies_it_was_computed_from() -> None:
    deletion, translation = [0.8, 0.6, 0.7, 0.7], [0.2, 0.2, 0.4, 0.2]
    result = d_score(0.8, deletion, translation, num_classes=2)
    assert result._fields[-3:] == ("baseline_accuracy", "deletion_accuracy", "translation_accuracy")
    assert result.baseline_accuracy.shape == () and result.baseline_accuracy.dtype == torch.float64
    assert float(result.baseline_accuracy) == 0.8
    torch.testing.assert_close(result.deletion_accuracy, torch.tensor(deletion, dtype=torch.float64))
    torch.testing.assert_close(result.translation_accuracy, torch.tensor(translation, dtype=torch.float64))

    baseline, mutants, translated, target = random_logits(6)
    metric = DScore(n=3, num_classes=5)
    metric.update(baseline, mutants, translated, target)
    got = metric.compute()
    assert float(got.baseline_accuracy) == pytest.approx(float((baseline.argmax(1) == target).double().mean()))
    expected = [float((m.argmax(1) == target).double().mean()) for m in mutants]
    assert got.deletion_accuracy.tolist() == pytest.approx(expected)
    expected = [float((m.argmax(1) == target).double().mean()) for m in translated]
    assert got.translation_accuracy.tolist() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: g_bound(3, 1), "num_classes: expected an integer of at least 2"),
        (lambda: g_bound(3, 2.5), "num_classes: expected an integer"),
        (lambda: d_score("high", [0.5] * 4, [0.5] * 4, 10), "baseline_accuracy: expected accuracies"),
        (
            lambda: d_score(True, [0.5] * 4, [0.5] * 4, 10),
            "baseline_accuracy: expected accuracies in \\[0, 1\\], got bool",
        ),
        (lambda: DScore(n=3, num_classes=5).update([0.0], None, None, None), "baseline_logits: expected a tensor"),
        (
            lambda: DScore(n=3, num_classes=5).update(torch.zeros(2, 5), [0.0], torch.zeros(9, 2, 5), torch.ones(2)),
            "mutant_logits: expected a tensor",
        ),
    ],
)
def test_bad_arguments_name_themselves(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
