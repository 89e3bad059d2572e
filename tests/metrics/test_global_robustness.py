from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch

from dlguard.metrics.functional.hda import empirical_global_robustness
from dlguard.metrics.global_robustness import EmpiricalGlobalRobustness, _log_sum_exp


def seeds(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits of ``n`` test cases, their seeds' labels and log densities in [-6, 6]."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 4, (n,), generator=gen)
    logits = torch.randn(n, 4, generator=gen)
    logits[torch.arange(n), target] += 0.8  # about two thirds correct
    log_density = torch.empty(n).uniform_(-6.0, 6.0, generator=gen)
    return logits, target, log_density


def plain_reference(logits: torch.Tensor, target: torch.Tensor, log_density: torch.Tensor) -> float:
    """``Σ 1[correct]·p / Σ p`` with plain ``exp`` in float64 (valid only where nothing underflows)."""
    p = log_density.double().exp()
    correct = (logits.argmax(1) == target).double()
    return float((correct * p).sum() / p.sum())


def test_three_seeds_by_hand() -> None:
    # weights 0.5, 0.3, 0.2; the second seed's test case is misclassified: 0.5 + 0.2 = 0.7
    log_p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64).log()
    preds, target = torch.tensor([1, 2, 0]), torch.tensor([1, 0, 0])
    metric = EmpiricalGlobalRobustness()
    metric.update(preds[:1], target[:1], log_p[:1])
    metric.update(preds[1:], target[1:], log_p[1:])
    assert float(metric.compute()) == pytest.approx(0.7, abs=1e-12)
    assert int(metric.count) == 3
    assert float(empirical_global_robustness(preds, target, log_p)) == pytest.approx(0.7, abs=1e-12)
    # unnormalised weights 5, 3, 2 (log scale shifted by log 10) give the same value; float32 rounds log 0.3 etc.
    assert float(empirical_global_robustness(preds, target, log_p + math.log(10))) == pytest.approx(0.7, abs=1e-12)
    assert float(empirical_global_robustness(preds, target, log_p.float())) == pytest.approx(0.7, abs=1e-6)


def test_logits_batches_match_plain_exp_reference() -> None:
    logits, target, log_density = seeds()
    expected = plain_reference(logits, target, log_density)
    assert 0.2 < expected < 0.95  # neither trivial value
    metric = EmpiricalGlobalRobustness()
    for part in (slice(0, 3), slice(3, 4), slice(4, 29), slice(29, 40)):  # uneven batches
        metric.update(logits[part], target[part], log_density[part])
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-12)
    assert metric.compute().dtype == torch.float64
    functional = empirical_global_robustness(logits, target, log_density)
    assert functional.dtype == torch.float32
    assert float(functional) == pytest.approx(expected, rel=1e-6)
    assert float(empirical_global_robustness(logits.argmax(1), target, log_density)) == pytest.approx(
        expected, rel=1e-6
    )


@pytest.mark.parametrize("shift", [-300.0, -1000.0, 800.0])
def test_shifted_log_densities_give_the_same_value(shift: float) -> None:
    """Only ratios of densities matter; plain exp underflows (or overflows) where log space does not."""
    logits, target, log_density = seeds()
    shifted = log_density.double() + shift
    shifted[17:] = shifted[17:].float().double()  # the second batch comes in float32: compare with its rounding
    expected = plain_reference(logits, target, shifted - shift)
    if shift < 0:
        assert float(shifted.float().exp().sum()) == 0.0  # exp underflows float32 at -300 ...
    if abs(shift) > 750:
        assert math.isnan(plain_reference(logits, target, shifted))  # ... and float64 (0/0 at -1000, inf/inf at 800)
    metric = EmpiricalGlobalRobustness()
    metric.update(logits[:17], target[:17], shifted[:17])
    metric.update(logits[17:], target[17:], shifted[17:].float())
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-12)
    assert float(empirical_global_robustness(logits, target, shifted)) == pytest.approx(expected, rel=1e-12)


def test_zero_weights_and_empty_metric() -> None:
    preds, target = torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1])
    log_p = torch.tensor(
        [float("-inf"), 0.0, math.log(3.0)], dtype=torch.float64
    )  # weights 0, 1, 3: the misclassified one weighs 1/4
    metric = EmpiricalGlobalRobustness()
    metric.update(preds, target, log_p)
    assert float(metric.compute()) == pytest.approx(0.75, abs=1e-12)
    nothing = EmpiricalGlobalRobustness()
    nothing.update(preds, target, torch.full((3,), float("-inf")))
    assert math.isnan(float(nothing.compute()))
    assert math.isnan(float(empirical_global_robustness(preds, target, torch.full((3,), float("-inf")))))
    with pytest.warns(UserWarning, match="before the ``update``"), pytest.raises(ValueError, match="no seeds"):
        EmpiricalGlobalRobustness().compute()


def test_forward_merge_state_and_pickle_use_log_sum_exp() -> None:
    logits, target, log_density = seeds()
    log_density = log_density.double() - 900.0
    expected = plain_reference(logits, target, log_density + 900.0)
    metric = EmpiricalGlobalRobustness()
    batch_value = metric(logits[:10], target[:10], log_density[:10])  # forward: the batch alone ...
    assert float(batch_value) == pytest.approx(plain_reference(logits[:10], target[:10], log_density[:10] + 900.0))
    metric(logits[10:25], target[10:25], log_density[10:25])  # ... and accumulates
    other = pickle.loads(pickle.dumps(EmpiricalGlobalRobustness()))  # the reduction is picklable
    other.update(logits[25:], target[25:], log_density[25:])
    if hasattr(metric, "merge_state"):  # torchmetrics >= 1.4 (the floor, 1.3, merges only across processes)
        metric.merge_state(copy.deepcopy(other))
        assert float(metric.compute()) == pytest.approx(expected, rel=1e-12)
        assert int(metric.count) == 40
    else:
        metric.update(logits[25:], target[25:], log_density[25:])
        assert float(metric.compute()) == pytest.approx(expected, rel=1e-12)
    stacked = torch.tensor([-1000.0, -1000.0 + math.log(3.0), float("-inf")], dtype=torch.float64)
    assert float(_log_sum_exp(stacked)) == pytest.approx(-1000.0 + math.log(4.0), rel=1e-15)
    metric.reset()
    assert float(metric.log_total) == float("-inf") and int(metric.count) == 0


@pytest.mark.parametrize(
    ("preds", "target", "log_density", "name"),
    [
        (torch.tensor([0, 1]), torch.tensor([0, 1, 1]), torch.zeros(2), "target"),
        (torch.tensor([0, 1]), torch.tensor([0, 1]), torch.zeros(3), "log_density"),
        (torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([0.0, float("nan")]), "log_density"),
        (torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([0, 1]), "log_density"),  # integers
        (torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), torch.zeros(2), "preds"),  # float labels
        (torch.zeros(3, 2), torch.tensor([0, 1]), torch.zeros(2), "target"),  # logits of 3 rows, 2 labels
        (torch.zeros(2, 2, 2), torch.tensor([0, 1]), torch.zeros(2), "preds"),
        (torch.tensor([0, 1]), torch.tensor([0.0, 1.0]), torch.zeros(2), "target"),
    ],
)
def test_bad_input_names_the_argument(
    preds: torch.Tensor, target: torch.Tensor, log_density: torch.Tensor, name: str
) -> None:
    with pytest.raises(ValueError, match=f"^{name}:"):
        EmpiricalGlobalRobustness().update(preds, target, log_density)
    with pytest.raises(ValueError, match=f"^{name}:"):
        empirical_global_robustness(preds, target, log_density)
