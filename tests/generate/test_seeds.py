"""HDA seed selection (SPEC §4): indicators against analytic values and brute force, ranking by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms import Normalize

from dlguard.generate.seeds import gradient_indicator, seed_scores, select_seeds, separation_indicator
from dlguard.probes.adapter import ModelAdapter
from tests.probes.fingerprint import assert_unchanged, fingerprint


def _cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Dropout(0.3), nn.Flatten(), nn.Linear(3 * 4 * 4, 4)
    )


# --- S_grad ---------------------------------------------------------------------------------------------------------


def test_gradient_indicator_of_a_linear_model_is_analytic() -> None:
    torch.manual_seed(0)
    net = nn.Linear(5, 3).double()
    x, y = torch.rand(8, 5, dtype=torch.float64), torch.randint(0, 3, (8,))
    with torch.no_grad():
        p = torch.softmax(net(x), dim=1)
    expected = ((p - F.one_hot(y, 3).double()) @ net.weight).abs().amax(dim=1)  # ‖Wᵀ(softmax − onehot)‖_∞
    torch.testing.assert_close(gradient_indicator(net, x, y, max_batch=3), expected, rtol=1e-12, atol=1e-15)


def test_gradient_indicator_matches_a_per_input_autograd_loop() -> None:
    net = _cnn()
    net.train()  # the indicator runs the model in eval mode: BatchNorm's running statistics, no dropout
    torch.manual_seed(1)
    x, y = torch.rand(7, 1, 6, 6), torch.randint(0, 4, (7,))
    reference = []
    net.eval()
    for xi, yi in zip(x, y, strict=True):
        xi = xi[None].clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(F.cross_entropy(net(xi), yi[None]), xi)
        reference.append(gradient.abs().max())
    net.train()
    torch.testing.assert_close(gradient_indicator(net, x, y, max_batch=3), torch.stack(reference))


def test_gradient_indicator_honours_preprocess_and_works_under_inference_mode() -> None:
    torch.manual_seed(2)
    net = nn.Sequential(nn.Flatten(), nn.Linear(36, 4))
    normalize = Normalize((0.1307,), (0.3081,))
    x, y = torch.rand(5, 1, 6, 6), torch.tensor([0, 1, 2, 3, 0])
    expected = gradient_indicator(nn.Sequential(normalize, net), x, y)
    assert torch.equal(gradient_indicator(ModelAdapter(net, preprocess=normalize), x, y), expected)
    # the pixel-space gradient is the normalised-space gradient divided by std: not the same numbers
    assert not torch.allclose(gradient_indicator(net, normalize(x), y), expected)
    with torch.inference_mode():
        xi, yi = x.clone(), y.clone()
        assert torch.equal(gradient_indicator(ModelAdapter(net, preprocess=normalize), xi, yi), expected)
    with torch.no_grad():
        assert torch.equal(gradient_indicator(nn.Sequential(normalize, net), x, y), expected)


# --- S_sep ----------------------------------------------------------------------------------------------------------


def _brute_force_separation(logits: Tensor, target: Tensor, ref_logits: Tensor, ref_target: Tensor) -> Tensor:
    out = []
    for i in range(len(logits)):
        best = math.inf
        for j in range(len(ref_logits)):
            if int(ref_target[j]) != int(target[i]):
                best = min(best, max(abs(float(a) - float(b)) for a, b in zip(logits[i], ref_logits[j], strict=True)))
        out.append(best)
    return torch.tensor(out, dtype=logits.dtype)


def test_separation_indicator_matches_a_double_loop() -> None:
    net = _cnn(3).double()
    torch.manual_seed(4)
    x, y = torch.rand(9, 1, 6, 6, dtype=torch.float64), torch.randint(0, 3, (9,))
    ref, ref_y = torch.rand(6, 1, 6, 6, dtype=torch.float64), torch.tensor([0, 0, 1, 1, 0, 1])
    net.eval()
    with torch.no_grad():
        logits, ref_logits = net(x), net(ref)
    net.train()
    expected_self = _brute_force_separation(logits, y, logits, y)
    torch.testing.assert_close(separation_indicator(net, x, y, max_batch=4), expected_self, rtol=1e-12, atol=1e-14)
    expected = _brute_force_separation(logits, y, ref_logits, ref_y)
    assert torch.isinf(expected[y == 2]).sum() == 0  # label 2 has references of other labels
    got = separation_indicator(net, x, y, reference=ref, reference_target=ref_y, max_batch=2)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


def test_separation_indicator_is_inf_without_a_reference_of_another_label() -> None:
    net = nn.Flatten()
    x, y = torch.tensor([[0.0, 0.0], [0.1, 0.3], [1.0, 1.0]]), torch.tensor([0, 0, 1])
    ref, ref_y = torch.tensor([[0.5, 0.5]]), torch.tensor([1])
    got = separation_indicator(net, x, y, reference=ref, reference_target=ref_y)
    torch.testing.assert_close(got, torch.tensor([0.5, 0.4, math.inf]))
    assert torch.isinf(separation_indicator(net, x[:2], y[:2])).all()  # a single label: nothing to separate from
    empty = separation_indicator(net, x, y, reference=ref[:0], reference_target=ref_y[:0])
    assert torch.isinf(empty).all() and empty.shape == (3,)


# --- scores and selection -------------------------------------------------------------------------------------------


def test_scores_are_density_times_minmax_in_log_space() -> None:
    p = torch.tensor([0.9, 0.8, 0.1, 0.06], dtype=torch.float64)
    s = torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.float64)
    high = seed_scores(p.log(), s, "high").exp()
    torch.testing.assert_close(high, p * torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64))
    low = seed_scores(p.log(), s, "low").exp()
    torch.testing.assert_close(low, p * torch.tensor([1.0, 0.75, 0.5, 0.0], dtype=torch.float64))


def test_a_uniform_indicator_ranks_by_density_alone() -> None:
    log_p = torch.tensor([-3.0, -1.0, -2.0, -5.0])
    for vulnerability in ("high", "low"):
        assert torch.equal(seed_scores(log_p, torch.full((4,), 7.0), vulnerability), log_p)
        assert select_seeds(log_p, torch.full((4,), 7.0), 2, vulnerability=vulnerability).tolist() == [1, 2]


def test_infinite_separation_is_least_vulnerable() -> None:
    log_p = torch.zeros(4)
    s_sep = torch.tensor([0.2, math.inf, 0.2, 0.2])  # finite values uniform: they all score 1, inf scores 0
    assert seed_scores(log_p, s_sep, "low").exp().tolist() == [1.0, 0.0, 1.0, 1.0]
    s_sep = torch.tensor([0.2, math.inf, 0.6, 0.4])
    torch.testing.assert_close(seed_scores(log_p, s_sep, "low").exp(), torch.tensor([1.0, 0.0, 0.0, 0.5]))


def test_selection_ranks_by_the_product_with_a_known_density() -> None:
    log_p = torch.tensor([0.9, 0.8, 0.1, 0.06, 0.5]).log()
    s_grad = torch.tensor([1.0, 2.0, 3.0, 5.0, 9.0])
    # all candidates: minmax = (0, 1/8, 2/8, 4/8, 1) → products (0, .1, .025, .03, .5)
    assert select_seeds(log_p, s_grad, 5).tolist() == [4, 1, 3, 2, 0]
    # without the last (misclassified): minmax = (0, 1/4, 1/2, 1) → products (0, .2, .05, .06)
    correct = torch.tensor([True, True, True, True, False])
    assert select_seeds(log_p, s_grad, 3, correct=correct).tolist() == [1, 3, 2]
    # densities that underflow exp (a 32-d KDE) rank the same
    assert select_seeds(log_p - 5000.0, s_grad, 3, correct=correct).tolist() == [1, 3, 2]


def test_ties_are_broken_by_keys_else_by_index() -> None:
    log_p, indicator = torch.zeros(5), torch.tensor([1.0, 3.0, 3.0, 3.0, 2.0])
    assert select_seeds(log_p, indicator, 3).tolist() == [1, 2, 3]
    assert select_seeds(log_p, indicator, 3, tie_break=torch.tensor([0, 9, 2, 5, 1])).tolist() == [2, 3, 1]
    assert select_seeds(log_p, indicator, 5, tie_break=torch.tensor([0, 9, 2, 5, 1])).tolist() == [2, 3, 1, 4, 0]


def test_selection_finds_planted_fragile_inputs() -> None:
    # two classes, logits (t·x₀, −t·x₀): label 0 is right for x₀ > 0; near x₀ = 0 the CE gradient is
    # large (softmax ≈ 1/2), far from it the model is confident and the gradient vanishes
    net = nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[20.0, 0.0, 0.0], [-20.0, 0.0, 0.0]]))
    x = torch.full((12, 3), 0.9)
    planted = [2, 7, 10]
    x[planted, 0] = torch.tensor([0.02, 0.01, 0.03])
    x[5, 0] = 0.0  # a tie: misclassified-or-not is ambiguous, excluded below as incorrect
    y = torch.zeros(12, dtype=torch.long)
    with torch.no_grad():
        logits = net(x)
    correct = logits.argmax(1) == y
    correct[5] = False
    s_grad = gradient_indicator(net, x, y)
    assert s_grad[5] > s_grad[planted].max()  # the most fragile is excluded as incorrect
    seeds = select_seeds(torch.zeros(12), s_grad, 3, correct=correct)
    assert sorted(seeds.tolist()) == planted
    assert seeds.tolist() == [7, 2, 10]  # closest to the boundary first


# --- the model is left as found ------------------------------------------------------------------------------------


def test_indicators_leave_the_model_exactly_as_found() -> None:
    net = _cnn(5)
    net.train()
    net[0].bias.requires_grad_(False)
    net[5].register_forward_hook(lambda module, args, out: None)
    before = fingerprint(net)
    x, y = torch.rand(6, 1, 6, 6), torch.tensor([0, 1, 2, 3, 0, 1])
    gradient_indicator(net, x, y, max_batch=4)
    separation_indicator(net, x, y, max_batch=4)
    assert_unchanged(net, before)
    assert all(p.grad is None for p in net.parameters())


class _Fails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.calls = _cnn(6), 0
        self.inner.train()

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("planted failure")
        return self.inner(x)


@pytest.mark.parametrize("indicator", [gradient_indicator, separation_indicator])
def test_the_model_is_restored_after_an_exception(indicator) -> None:
    net = _Fails()
    before = fingerprint(net)
    with pytest.raises(RuntimeError, match="planted failure"):
        indicator(net, torch.rand(6, 1, 6, 6), torch.tensor([0, 1, 2, 3, 0, 1]), max_batch=3)
    assert_unchanged(net, before)


# --- errors ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_invalid_k_is_rejected(k: object) -> None:
    with pytest.raises(ValueError, match="k:"):
        select_seeds(torch.zeros(3), torch.ones(3), k)  # type: ignore[arg-type]


def test_more_seeds_than_candidates_warns_and_takes_all() -> None:
    correct = torch.tensor([True, False, True])
    with pytest.warns(UserWarning, match=r"k = 5.*only 2 candidates"):
        seeds = select_seeds(torch.zeros(3), torch.tensor([1.0, 2.0, 3.0]), 5, correct=correct)
    assert seeds.tolist() == [2, 0]


def test_bad_selection_arguments_name_themselves() -> None:
    log_p, s = torch.zeros(3), torch.ones(3)
    with pytest.raises(ValueError, match="correct"):
        select_seeds(log_p, s, 1, correct=torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="correct"):
        select_seeds(log_p, s, 1, correct=torch.ones(3))
    with pytest.raises(ValueError, match="indicator"):
        select_seeds(log_p, torch.ones(4), 1)
    with pytest.raises(ValueError, match="indicator"):
        select_seeds(log_p, torch.tensor([1.0, math.nan, 2.0]), 1)
    with pytest.raises(ValueError, match="log_density"):
        select_seeds(torch.tensor([0.0, math.nan, 0.0]), s, 1)
    with pytest.raises(ValueError, match="log_density"):
        seed_scores(torch.tensor([0.0, math.inf, 0.0]), s)
    with pytest.raises(ValueError, match="log_density"):
        seed_scores(torch.zeros(3, 1), s)
    with pytest.raises(ValueError, match="vulnerability"):
        seed_scores(log_p, s, "medium")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tie_break"):
        select_seeds(log_p, s, 1, tie_break=torch.arange(4))
    with pytest.raises(ValueError, match="reference_target"):
        separation_indicator(nn.Flatten(), torch.rand(3, 2), torch.tensor([0, 1, 0]), reference=torch.rand(2, 2))
    with pytest.raises(ValueError, match="inputs"):
        gradient_indicator(nn.Flatten(), torch.full((3, 2), math.nan), torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="inputs"):
        separation_indicator(nn.Flatten(), torch.ones(3, 2, dtype=torch.long), torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="target"):
        gradient_indicator(nn.Flatten(), torch.rand(3, 2), torch.tensor([0, 1]))
