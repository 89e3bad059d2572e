"""FGSM and PGD (SPEC §4 baselines) against analytic steps and an independent loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms import Normalize

from dlguard.generate.attacks import fgsm, pgd
from dlguard.probes.adapter import ModelAdapter
from tests.probes.fingerprint import assert_unchanged, fingerprint


def _linear(classes: int = 3, features: int = 4, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(features, classes).double()


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _probe_model() -> nn.Module:
    """Train mode, BatchNorm statistics, a frozen parameter and a hook: everything a probe must restore."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 3))
    net.train()
    net[1].bias.requires_grad_(False)
    net[5].register_forward_hook(lambda module, args, out: None)
    return net


def test_fgsm_is_the_analytic_sign_step_of_a_linear_model() -> None:
    net = _linear()
    x = torch.rand(6, 4, dtype=torch.float64) * 0.6 + 0.2  # far from the box: no clipping at eps 0.05
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        p = torch.softmax(net(x), dim=1)
    gradient = (p - F.one_hot(y, 3).double()) @ net.weight  # rows of Wᵀ(softmax − onehot)
    expected = x + 0.05 * gradient.sign()
    assert torch.allclose(fgsm(net, x, y, eps=0.05), expected, rtol=0, atol=1e-15)


def test_fgsm_clips_to_the_unit_box() -> None:
    net = _linear()
    x = torch.tensor([[0.0, 1.0, 0.05, 0.95]], dtype=torch.float64)
    y = torch.tensor([1])
    with torch.no_grad():
        p = torch.softmax(net(x), dim=1)
    step = ((p - F.one_hot(y, 3).double()) @ net.weight).sign()
    expected = (x + 0.3 * step).clamp(0, 1)
    adversarial = fgsm(net, x, y, eps=0.3)
    assert torch.equal(adversarial, expected)
    assert adversarial.min() >= 0 and adversarial.max() <= 1


def _reference_pgd(
    net: nn.Module, x: Tensor, y: Tensor, eps: float, step: float, steps: int, start: Tensor | None
) -> Tensor:
    """One input at a time, torch.func.grad, projection as two sequential clamps."""
    rows = []
    for xi, yi in zip(x, y, strict=True):
        net.eval()

        def loss(z: Tensor, yi: Tensor = yi) -> Tensor:
            return F.cross_entropy(net(z[None]), yi[None])

        current = xi.clone() if start is None else xi + start[len(rows)]
        current = torch.minimum(torch.maximum(current, xi - eps), xi + eps).clamp(0, 1)
        for _ in range(steps):
            current = current + step * torch.func.grad(loss)(current).sign()
            current = torch.minimum(torch.maximum(current, xi - eps), xi + eps).clamp(0, 1)
        rows.append(current.detach())
    return torch.stack(rows)


@pytest.mark.parametrize("random_start", [False, True])
def test_pgd_equals_an_independent_loop(random_start: bool) -> None:
    net = _mlp()
    torch.manual_seed(1)
    x, y = torch.rand(7, 1, 3, 4, dtype=torch.float64), torch.randint(0, 3, (7,))
    generator = torch.Generator().manual_seed(5)
    adversarial = pgd(net, x, y, eps=0.1, step=0.01, steps=12, random_start=random_start, generator=generator)
    start = None
    if random_start:
        start = (2 * torch.rand(x.shape, generator=torch.Generator().manual_seed(5), dtype=x.dtype) - 1) * 0.1
    expected = _reference_pgd(net, x, y, 0.1, 0.01, 12, start)
    assert torch.equal(adversarial, expected)
    # batching and the random start do not depend on max_batch
    generator = torch.Generator().manual_seed(5)
    split = pgd(net, x, y, eps=0.1, step=0.01, steps=12, random_start=random_start, generator=generator, max_batch=3)
    assert torch.equal(split, adversarial)


def test_pgd_beats_fgsm_and_flips_mnist_digits() -> None:
    from dlguard.zoo import pretrained
    from tests.quick import mnist_validation

    x, y = mnist_validation(64)
    net = pretrained("mnist_a")
    fast, projected = fgsm(net, x, y, eps=0.1), pgd(net, x, y, eps=0.1)
    wide = pgd(net, x, y, eps=0.2, step=0.04, steps=10)
    for adversarial, eps in ((fast, 0.1), (projected, 0.1), (wide, 0.2)):
        assert (adversarial - x).abs().max() <= eps + 1e-6
        assert adversarial.min() >= 0 and adversarial.max() <= 1
    with torch.no_grad():
        accuracy = {name: (net(a).argmax(1) == y).float().mean() for name, a in (("clean", x), ("fgsm", fast))}
        accuracy |= {
            "pgd": (net(projected).argmax(1) == y).float().mean(),
            "wide": (net(wide).argmax(1) == y).float().mean(),
        }
        loss_fgsm, loss_pgd = F.cross_entropy(net(fast), y), F.cross_entropy(net(projected), y)
    # measured: clean 0.98, FGSM 0.77, PGD 0.67 at eps 0.1 (this LeNet is fairly robust there), PGD 0.09 at 0.2
    assert accuracy["clean"] > 0.95
    assert loss_pgd > loss_fgsm and accuracy["pgd"] < accuracy["fgsm"]
    assert accuracy["pgd"] < 0.8
    assert accuracy["wide"] < 0.25


def test_model_left_exactly_as_found() -> None:
    net = _probe_model()
    before = fingerprint(net)
    x, y = torch.rand(5, 1, 3, 4), torch.tensor([0, 1, 2, 0, 1])
    fgsm(net, x, y, eps=0.1)
    pgd(net, x, y, eps=0.1, step=0.04, steps=3, random_start=True)
    assert_unchanged(net, before)
    assert all(p.grad is None for p in net.parameters())


class _Fails(nn.Module):
    def __init__(self, after: int) -> None:
        super().__init__()
        self.inner, self.calls, self.after = _probe_model(), 0, after

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        if self.calls > self.after:
            raise RuntimeError("planted failure")
        return self.inner(x)


def test_model_left_exactly_as_found_after_an_exception() -> None:
    net = _Fails(after=2)
    before = fingerprint(net)
    with pytest.raises(RuntimeError, match="planted failure"):
        pgd(net, torch.rand(4, 1, 3, 4), torch.tensor([0, 1, 2, 0]), eps=0.1, step=0.02, steps=5)
    assert_unchanged(net, before)


def test_works_under_no_grad_and_inference_mode() -> None:
    net = _mlp()
    torch.manual_seed(2)
    x, y = torch.rand(4, 1, 3, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    expected_fgsm, expected_pgd = fgsm(net, x, y, eps=0.1), pgd(net, x, y, eps=0.1, step=0.02, steps=5)
    with torch.no_grad():
        assert torch.equal(pgd(net, x, y, eps=0.1, step=0.02, steps=5), expected_pgd)
    with torch.inference_mode():
        xi, yi = x.clone(), y.clone()  # inference tensors, as trainer.validate hands them over
        assert torch.equal(fgsm(net, xi, yi, eps=0.1), expected_fgsm)
        assert torch.equal(pgd(net, xi, yi, eps=0.1, step=0.02, steps=5), expected_pgd)


def test_preprocess_applies_after_the_perturbation() -> None:
    torch.manual_seed(3)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    normalize = Normalize((0.1307,), (0.3081,))
    x, y = torch.rand(6, 1, 3, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    adapter = ModelAdapter(net, preprocess=normalize)
    composed = nn.Sequential(normalize, net)
    assert torch.equal(
        pgd(adapter, x, y, eps=0.1, step=0.03, steps=4), pgd(composed, x, y, eps=0.1, step=0.03, steps=4)
    )
    assert torch.equal(fgsm(adapter, x, y, eps=0.1), fgsm(composed, x, y, eps=0.1))
    assert (
        pgd(adapter, x, y, eps=0.1, step=0.03, steps=4) - x
    ).abs().max() <= 0.1 + 1e-6  # the radius is in pixel space


def test_output_keeps_the_inputs_device_and_dtype() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))  # float32
    x = torch.rand(3, 1, 3, 4, dtype=torch.float64)
    adversarial = pgd(net, x, torch.tensor([0, 1, 2]), eps=0.05, step=0.02, steps=3)
    assert adversarial.dtype == torch.float64 and adversarial.device == x.device
    assert not adversarial.requires_grad
    assert pgd(net, x[:0], torch.zeros(0, dtype=torch.long), eps=0.05).shape == (0, 1, 3, 4)


@pytest.mark.parametrize("eps", [0, -0.1, 1.5, float("nan"), True, "0.1"])
def test_eps_outside_the_radius_range_is_rejected(eps: object) -> None:
    net, x, y = _linear(), torch.rand(2, 4, dtype=torch.float64), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="eps"):
        fgsm(net, x, y, eps=eps)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps"):
        pgd(net, x, y, eps=eps)  # type: ignore[arg-type]


def test_bad_arguments_name_themselves() -> None:
    net, x, y = _linear(), torch.rand(2, 4, dtype=torch.float64), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="step"):
        pgd(net, x, y, eps=0.1, step=0)
    with pytest.raises(ValueError, match="steps"):
        pgd(net, x, y, eps=0.1, steps=0)
    with pytest.raises(ValueError, match="max_batch"):
        pgd(net, x, y, eps=0.1, max_batch=0)
    with pytest.raises(ValueError, match="generator"):
        pgd(net, x, y, eps=0.1, random_start=True, generator=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inputs"):
        fgsm(net, x + 1, y, eps=0.1)
    with pytest.raises(ValueError, match="target"):
        fgsm(net, x, torch.tensor([0, 1, 2]), eps=0.1)
    with pytest.raises(ValueError, match="output_transform"):
        fgsm(nn.Flatten(0), x, y, eps=0.1)


def test_a_pgd_that_cannot_reach_eps_warns() -> None:
    net, x, y = _linear(), torch.rand(2, 4, dtype=torch.float64), torch.tensor([0, 1])
    with pytest.warns(UserWarning, match=r"step \* steps.*10"):
        pgd(net, x, y, eps=0.1, step=2 / 255, steps=10)  # the paper's reference code: 0.078 < 0.1
