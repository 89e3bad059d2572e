from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from dlguard.generate.genetic import GAResult, _Chunk, _minmax, two_step_ga
from dlguard.metrics.functional.perceptual import perceptual_quality
from dlguard.probes.adapter import ModelAdapter
from tests.probes.fingerprint import assert_unchanged, fingerprint

SMALL = {"population": 32, "iterations": 6, "elite": 4}


class MeanScore(nn.Module):
    """Two classes: logit 1 is ``scale · (mean(x) − threshold)``, logit 0 is 0; so for label 0, ``J`` is logit 1."""

    def __init__(self, size: int, threshold: float, scale: float = 10.0) -> None:
        super().__init__()
        self.linear = nn.Linear(size, 2)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.weight[1] = scale / size
            self.linear.bias.copy_(torch.tensor([0.0, -scale * threshold]))

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.flatten(1))


class Constant(nn.Module):
    """The same logits for every input (a tie between two classes: ``J = 0`` for label 0)."""

    def __init__(self, logits: tuple[float, ...] = (0.0, 0.0)) -> None:
        super().__init__()
        self.register_buffer("logits", torch.tensor(logits))

    def forward(self, x: Tensor) -> Tensor:
        return self.logits.expand(len(x), -1)


def mlp(size: int = 16, classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(size, 12), nn.ReLU(), nn.Linear(12, classes))


def hand_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """``J`` written differently: the largest other logit by sorting, minus the label's."""
    out = []
    for row, label in zip(logits.tolist(), labels.tolist(), strict=True):
        true = row.pop(label)
        out.append(sorted(row)[-1] - true)
    return torch.tensor(out)


def assert_same(a: GAResult, b: GAResult) -> None:
    for name in ("examples", "found", "loss", "quality", "first_success", "ae_proportion"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0, equal_nan=True, msg=name)


def seeds_16(count: int, seed: int = 1) -> Tensor:
    return torch.rand(count, 1, 4, 4, generator=torch.Generator().manual_seed(seed))


def test_examples_in_ball_and_adversarial_recomputed_independently() -> None:
    net, seeds = mlp(), seeds_16(6)
    with torch.no_grad():
        labels = net(seeds).argmax(1)
    result = two_step_ga(net, seeds, labels, 0.3, num_best=5, population=40, iterations=15, elite=5)
    assert result.examples.shape == (6, 5, 1, 4, 4) and result.found.shape == (6, 5)
    assert result.found.any(), "a 0.3 ball should hold adversarial examples for a random MLP"
    flat = result.examples.flatten(2)
    distance = (flat - seeds.flatten(1)[:, None]).abs().amax(2)
    assert bool((distance[result.found] <= 0.3 + 1e-6).all())
    assert bool((flat >= 0).all() and (flat <= 1).all())
    with torch.no_grad():
        recomputed = hand_loss(net(result.examples.flatten(0, 1)), labels.repeat_interleave(5)).view(6, 5)
    assert bool((recomputed[result.found] >= 0).all())
    torch.testing.assert_close(result.loss[result.found], recomputed[result.found], rtol=0, atol=1e-5)
    mse = (result.examples - seeds[:, None]).square().flatten(2).mean(2)
    torch.testing.assert_close(result.quality[result.found], -mse[result.found], rtol=1e-5, atol=1e-7)
    # rows not found: the seed itself, NaN scores; found rows come first
    missing = ~result.found
    assert bool((result.examples[missing] == seeds[:, None].expand_as(result.examples)[missing]).all())
    assert bool(result.loss[missing].isnan().all() and result.quality[missing].isnan().all())
    assert bool((result.found.int().diff(dim=1) <= 0).all())
    assert torch.equal(result.success, result.found[:, 0]) and torch.equal(result.best, result.examples[:, 0])
    assert bool((result.ae_proportion[result.success] > 0).all())


class RowByRow(nn.Module):
    """``net`` one row at a time: a row's logits cannot depend on the size or company of its batch."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.net(row) for row in x.split(1)])


def test_deterministic_and_independent_of_chunking_and_batch_composition() -> None:
    # bit for bit is promised where a row's output does not depend on its batch; a batched MLP's logits
    # do on some processors (an Intel AVX-512 Xeon: other last bits for passes of 8 rows than of 120)
    net, seeds = RowByRow(mlp()), seeds_16(5)
    labels = torch.tensor([0, 1, 2, 0, 1])
    options = {"population": 24, "iterations": 8, "elite": 4, "num_best": 3}
    together = two_step_ga(net, seeds, labels, 0.2, **options)
    assert_same(together, two_step_ga(net, seeds, labels, 0.2, **options))
    alone = two_step_ga(net, seeds[2:3], labels[2:3], 0.2, **options)
    assert_same(alone, two_step_ga(net, seeds[2:3], labels[2:3], 0.2, **options))
    for name in ("examples", "loss", "first_success"):
        torch.testing.assert_close(getattr(alone, name), getattr(together, name)[2:3], rtol=0, atol=0, equal_nan=True)
    order = torch.tensor([4, 2, 0, 3, 1])
    shuffled = two_step_ga(net, seeds[order], labels[order], 0.2, **options)
    tiny = two_step_ga(net, seeds, labels, 0.2, **options, max_elements=24 * 16, max_batch=8)
    two_per_chunk = two_step_ga(net, seeds, labels, 0.2, **options, max_elements=2 * 24 * 16, max_batch=30)
    for other in (tiny, two_per_chunk):
        assert_same(together, other)
    for name in ("examples", "found", "loss", "quality", "first_success"):
        torch.testing.assert_close(
            getattr(shuffled, name), getattr(together, name)[order], rtol=0, atol=0, equal_nan=True
        )
    reseeded = two_step_ga(net, seeds, labels, 0.2, **options, seed=1)
    assert not torch.equal(reseeded.examples, together.examples)
    keyed = two_step_ga(net, seeds, labels, 0.2, **options, keys=torch.arange(5))
    assert not torch.equal(keyed.examples, together.examples)


def test_planted_boundary_within_reach_is_found_early_and_beyond_reach_never() -> None:
    seeds = torch.tensor([0.505, 0.49, 0.2]).view(3, 1, 1, 1).repeat(1, 1, 3, 3)
    labels = torch.zeros(3, dtype=torch.long)
    net = MeanScore(9, threshold=0.51)  # AE once the mean exceeds 0.51: 0.005 and 0.02 away; 0.31 for the last
    result = two_step_ga(net, seeds, labels, 0.1, population=60, iterations=25, elite=6, num_best=2)
    assert result.found.tolist() == [[True, True], [True, True], [False, False]]
    # 0.005 lies within the initial noise (σ 0.01); 0.02 takes a few iterations (7 seen)
    assert int(result.first_success[0]) == 0 and 0 < int(result.first_success[1]) <= 12
    assert int(result.first_success[2]) == -1 and float(result.ae_proportion[2]) == 0.0
    assert torch.equal(result.examples[2], seeds[2:3].expand(2, -1, -1, -1))
    assert bool(result.loss[2].isnan().all()) and bool(result.quality[2].isnan().all())
    assert bool((result.best[:2].flatten(1).mean(1) >= 0.51 - 1e-6).all())


def test_quality_term_trades_adversarial_strength_for_closeness() -> None:
    # adversarial everywhere, more so the brighter: F₂ (α = 1) pulls towards the seed, α = 0 away from it
    seeds, labels = torch.full((2, 1, 4, 4), 0.5), torch.zeros(2, dtype=torch.long)
    seeds[1] = 0.3
    net = MeanScore(16, threshold=0.0)
    options = {"population": 40, "iterations": 20, "elite": 5}
    closeness = two_step_ga(net, seeds, labels, 0.1, alpha=1.0, **options)
    strength = two_step_ga(net, seeds, labels, 0.1, alpha=0.0, **options)
    assert bool(closeness.success.all() and strength.success.all())
    assert bool((closeness.quality[:, 0] > strength.quality[:, 0]).all())
    assert bool((strength.loss[:, 0] > closeness.loss[:, 0]).all())
    assert torch.equal(closeness.first_success, torch.zeros(2, dtype=torch.long))


def test_switch_uses_strictly_positive_loss_and_uniform_fitness_is_safe() -> None:
    # a tie everywhere: J = 0, every individual is an AE (J ≥ 0) but none has J > 0, and minmax(J) is uniform
    seeds, labels = torch.full((1, 1, 4, 4), 0.5), torch.zeros(1, dtype=torch.long)
    options = {"population": 40, "iterations": 15, "elite": 5, "mutation_std": 0.02}
    first_step = two_step_ga(Constant(), seeds, labels, 0.1, switch=0.6, **options)  # F₁ only: no pressure at all
    second_step = two_step_ga(Constant(), seeds, labels, 0.1, switch=0.0, **options)  # F₂ from the start
    for result in (first_step, second_step):
        assert bool(result.success.all()) and int(result.first_success[0]) == 0
        assert float(result.loss[0, 0]) == 0.0 and math.isfinite(float(result.quality[0, 0]))
        assert float(result.ae_proportion[0]) == 1.0
    assert float(second_step.quality[0, 0]) > float(first_step.quality[0, 0])


def test_minmax_of_uniform_vector_is_zeros() -> None:
    scaled = _minmax(torch.tensor([[3.0, 3.0, 3.0], [1.0, 2.0, 5.0]]))
    assert scaled.tolist() == [[0.0, 0.0, 0.0], [0.0, 0.25, 1.0]]


def _breed(fitness: Tensor, population: Tensor, elite: int = 5, rate: float = 0.2) -> Tensor:
    options = {"radius": 1.0, "population": population.shape[1], "elite": elite, "mutation_rate": rate,
               "mutation_std": 0.003}  # fmt: skip
    seeds = torch.full((1, population.shape[2]), 0.5)
    chunk = _Chunk(ModelAdapter(nn.Identity()), seeds, torch.zeros(1), torch.zeros(1, 2), options)
    return chunk.breed(population, fitness, [torch.Generator().manual_seed(3)])


def test_one_breeding_step_keeps_the_elite_and_breeds_only_from_it() -> None:
    """Elite rows unchanged; every child element is some elite row's element at that place, or one of ~20 % mutated."""
    generator = torch.Generator().manual_seed(0)
    population = 0.3 + 0.4 * torch.rand(1, 60, 500, generator=generator)
    fitness = torch.rand(1, 60, generator=generator)
    bred = _breed(fitness, population)
    top = fitness[0].argsort(descending=True)[:5]
    assert bred.shape == population.shape
    assert torch.equal(bred[0, :5], population[0, top])  # the elite, best first, untouched
    children = bred[0, 5:]  # (55, 500)
    inherited = (children[:, None, :] == population[0, top][None]).any(dim=1)  # element equals an elite element
    assert abs(float((~inherited).float().mean()) - 0.2) < 0.02  # the rest: mutated elements (rate 0.2)
    mutated = ~inherited
    closest = (children[:, None, :] - population[0, top][None]).abs().amin(dim=1)
    assert float(closest[mutated].max()) < 0.003 * 6  # mutations are small Gaussian steps from a parent's value
    # a uniform fitness (a uniform population min-maxed to zeros) draws every elite row as a parent about equally:
    # without mutation, each of the 5 supplies about a fifth of the children's elements
    uniform = _breed(torch.zeros(1, 600), 0.3 + 0.4 * torch.rand(1, 600, 50, generator=generator), elite=5, rate=0.0)
    supplied = (uniform[0, 5:, None, :] == uniform[0, None, :5, :]).float().mean(dim=(0, 2))  # (5,) shares
    assert float(supplied.sum()) == pytest.approx(1.0)  # every element inherited, from exactly one elite row
    assert bool(((supplied > 0.15) & (supplied < 0.25)).all()), supplied.tolist()


@pytest.mark.parametrize("measure", ["mse", "psnr", "ssim"])
def test_each_perceptual_measure(measure: str) -> None:
    seeds, labels = torch.rand(2, 1, 12, 12, generator=torch.Generator().manual_seed(0)), torch.zeros(2).long()
    result = two_step_ga(MeanScore(144, 0.0), seeds, labels, 0.05, perceptual=measure, num_best=2, **SMALL)
    assert bool(result.found.all())
    expected = perceptual_quality(result.examples.flatten(0, 1), seeds.repeat_interleave(2, 0), measure)
    torch.testing.assert_close(result.quality.flatten(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("measure", ["mse", "psnr"])
def test_one_dimensional_signals(measure: str) -> None:
    signals, labels = torch.rand(3, 2, 10, generator=torch.Generator().manual_seed(0)), torch.zeros(3).long()
    result = two_step_ga(MeanScore(20, 0.0), signals, labels, 0.1, perceptual=measure, **SMALL)
    assert result.examples.shape == (3, 1, 2, 10) and bool(result.success.all())
    assert result.best.shape == (3, 2, 10)


def test_mnist_a_finds_adversarial_examples_for_most_least_robust_digits() -> None:
    from dlguard.data import MNISTDataModule
    from dlguard.zoo import pretrained

    net = pretrained("mnist_a")
    dm = MNISTDataModule()
    dm.setup()
    images = torch.stack([dm.val_set[i][0] for i in range(200)])
    labels = torch.tensor([dm.val_set[i][1] for i in range(200)])
    with torch.no_grad():
        margin = hand_loss(net(images), labels)
    margin[margin >= 0] = -math.inf  # correctly classified only; the 8 closest to a boundary (HDA's seed choice)
    chosen = margin.argsort(descending=True)[:8]
    result = two_step_ga(net, images[chosen], labels[chosen], 0.1, population=200, iterations=30)
    # with the SPEC's defaults (mutation σ 0.003) 5 of 8 are found in 30 iterations on torch 2.15, CPU
    assert int(result.success.sum()) >= 4
    with torch.no_grad():
        again = hand_loss(net(result.best[result.success]), labels[chosen][result.success])
    assert bool((again >= 0).all())
    assert bool(((result.best - images[chosen]).abs().amax((1, 2, 3)) <= 0.1 + 1e-6).all())


class Faulty(nn.Module):
    """Dropout and BatchNorm in train mode, a hook, frozen and trainable weights; raises on call ``fail_at``."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))
        self.body[1].weight.requires_grad_(False)
        self.body[4].register_forward_hook(lambda module, args, out: None)
        self.calls, self.fail_at = 0, fail_at

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("boom")
        assert not self.training and not torch.is_grad_enabled()
        return self.body(x)


def test_model_left_exactly_as_found_also_after_an_exception() -> None:
    net = Faulty().train()
    before = fingerprint(net)
    two_step_ga(net, seeds_16(2), torch.tensor([0, 1]), 0.1, **SMALL)
    assert_unchanged(net, before)
    failing = Faulty(fail_at=4).train()
    before = fingerprint(failing)
    with pytest.raises(RuntimeError, match="boom"):
        two_step_ga(failing, seeds_16(2), torch.tensor([0, 1]), 0.1, **SMALL)
    assert_unchanged(failing, before)


def test_works_inside_inference_mode() -> None:
    net, seeds, labels = mlp(), seeds_16(3), torch.tensor([0, 1, 2])
    plain = two_step_ga(net, seeds, labels, 0.2, **SMALL)
    with torch.inference_mode():
        inside = two_step_ga(net, seeds.clone(), labels.clone(), 0.2, **SMALL)
    assert_same(plain, inside)


class Normalize(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return (x - 0.5) / 0.25


def test_preprocess_applied_after_perturbing() -> None:
    net, seeds, labels = mlp(), seeds_16(3), torch.tensor([0, 1, 2])
    seen: list[Tensor] = []
    net[1].register_forward_pre_hook(lambda module, args: seen.append(args[0].min()))
    adapted = two_step_ga(ModelAdapter(net, preprocess=Normalize()), seeds, labels, 0.2, **SMALL)
    assert min(float(v) for v in seen) < 0  # the network got normalised inputs
    pixel_model = nn.Sequential(Normalize(), net)
    assert_same(adapted, two_step_ga(pixel_model, seeds, labels, 0.2, **SMALL))
    assert bool((adapted.examples >= 0).all())  # test cases stay in pixel space


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"radius": 0.0}, "radius"),
        ({"radius": 1.5}, "radius"),
        ({"population": 4, "elite": 4}, "population smaller than the elite"),
        ({"elite": 0}, "elite"),
        ({"num_best": 40}, "num_best"),
        ({"switch": 1.2}, "switch"),
        ({"mutation_rate": -0.1}, "mutation_rate"),
        ({"alpha": -1.0}, "alpha"),
        ({"perceptual": "lpips"}, "perceptual"),
        ({"iterations": -1}, "iterations"),
        ({"max_batch": 0}, "max_batch"),
        ({"keys": torch.zeros(3)}, "keys"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    options = {**SMALL, **kwargs}
    radius = options.pop("radius", 0.1)
    with pytest.raises(ValueError, match=match):
        two_step_ga(mlp(), seeds_16(2), torch.tensor([0, 1]), radius, **options)


def test_bad_inputs_and_models() -> None:
    net, labels = mlp(), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="seeds"):
        two_step_ga(net, torch.ones(2, 16, dtype=torch.long), labels, **SMALL)
    with pytest.raises(ValueError, match="seeds: contains NaN"):
        two_step_ga(net, torch.full((2, 1, 4, 4), math.nan), labels, **SMALL)
    with pytest.raises(ValueError, match=r"seeds: expected values in \[0, 1\]"):
        two_step_ga(net, seeds_16(2) * 255, labels, **SMALL)
    with pytest.raises(ValueError, match="target"):
        two_step_ga(net, seeds_16(2), torch.tensor([0, 1, 2]), **SMALL)
    with pytest.raises(ValueError, match="target: expected labels in"):
        two_step_ga(net, seeds_16(2), torch.tensor([0, 3]), **SMALL)
    with pytest.raises(ValueError, match="perceptual: 'ssim' needs images"):
        two_step_ga(MeanScore(20, 0.0), torch.rand(2, 2, 10), labels, perceptual="ssim", **SMALL)
    with pytest.raises(ValueError, match="perceptual: 'ssim' needs images of at least 11x11"):
        two_step_ga(net, seeds_16(2), labels, perceptual="ssim", **SMALL)
    with pytest.raises(ValueError, match="output_transform"):
        two_step_ga(nn.Sequential(net, nn.Flatten(0)), seeds_16(2), labels, **SMALL)


def test_no_seeds() -> None:
    result = two_step_ga(mlp(), torch.zeros(0, 1, 4, 4), torch.zeros(0, dtype=torch.long), num_best=2, **SMALL)
    assert result.examples.shape == (0, 2, 1, 4, 4) and result.found.shape == (0, 2)
    assert result.first_success.shape == (0,) and result.success.shape == (0,)


def test_a_given_start_is_searched_from_and_projected_into_the_ball() -> None:
    # mean 0.45, AE once it exceeds 0.51: without noise (init_std 0) and without iterations none is found
    seeds, labels = torch.full((2, 1, 3, 3), 0.45), torch.zeros(2, dtype=torch.long)
    net = MeanScore(9, threshold=0.51)
    options = {"population": 8, "iterations": 0, "elite": 2, "init_std": 0.0}
    assert not bool(two_step_ga(net, seeds, labels, 0.1, **options).found.any())
    start = torch.stack([torch.full((1, 1, 3, 3), 0.9), torch.full((1, 1, 3, 3), 0.5)])  # 0.9 lies outside the ball
    result = two_step_ga(net, seeds, labels, 0.1, start=start, **options)
    assert result.found[:, 0].tolist() == [True, False]  # projected to 0.55 > 0.51; 0.5 stays below
    torch.testing.assert_close(result.best[0], torch.full((1, 3, 3), 0.55))
    assert result.first_success.tolist() == [0, -1]


@pytest.mark.parametrize(
    ("shape", "message"),
    [((2, 1, 1, 3), r"start: expected \(S, G, \*input_shape\) = \(2, G, 1, 3, 3\)"),
     ((1, 1, 1, 3, 3), r"start: expected \(S, G"),
     ((2, 9, 1, 3, 3), r"start: expected at most population \(8\)")],
)  # fmt: skip
def test_a_start_of_the_wrong_shape_is_refused(shape: tuple[int, ...], message: str) -> None:
    seeds, labels = torch.full((2, 1, 3, 3), 0.45), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=message):
        two_step_ga(MeanScore(9, 0.51), seeds, labels, 0.1, population=8, elite=2, start=torch.zeros(shape))
