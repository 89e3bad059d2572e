"""HDA's two-step genetic algorithm (SPEC §4): black-box local test cases around seeds, all seeds in one batch.

Every seed evolves its own population inside the ``r``-ball (L∞) around it, first towards adversarial
examples (``F₁``), then, once most of the population is adversarial, also towards perceptual closeness
(``F₂``). The populations of many seeds run through the model together; the random numbers of each seed
come from its own generator, seeded by the seed's content, so what a seed gets does not depend on the
other seeds, on chunking, on pass sizes, or on how many processes share the seeds.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dlguard._random import content_keys
from dlguard._validation import (
    check_labels,
    check_tensor,
    check_values,
    finite_float,
    optional_positive_int,
    positive_int,
    probability,
)
from dlguard.metrics.functional.hda import prediction_loss
from dlguard.metrics.functional.perceptual import check_measure, perceptual_quality
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

__all__ = ["GAResult", "two_step_ga"]

_MASK64 = (1 << 64) - 1
_BITS = (1 << torch.arange(8, dtype=torch.int16)).to(torch.uint8)


@dataclass
class GAResult:
    """The test cases the GA found, ``m = num_best`` per seed.

    Attributes:
        examples: ``(S, m, *input_shape)`` the best ``m`` adversarial examples of each seed, best first;
            rows not found hold the seed itself.
        found: ``(S, m)`` whether each row is an adversarial example (``J ≥ 0``).
        loss: ``(S, m)`` prediction loss ``J`` of each row (NaN where not found).
        logits: ``(S, m, K)`` the model's logits on each row (the seed's where not found): what
            :class:`~dlguard.metrics.AEQuality` takes, with no second forward pass.
        quality: ``(S, m)`` perceptual quality ``q`` against the seed (NaN where not found).
        first_success: ``(S,)`` the first evaluation at which the population held an adversarial example
            (0: the initial population, ``t``: after ``t`` iterations; -1: never).
        ae_proportion: ``(S,)`` share of the final population with ``J ≥ 0``.
        iterations: ``T``.
    """

    examples: Tensor
    found: Tensor
    loss: Tensor
    logits: Tensor
    quality: Tensor
    first_success: Tensor
    ae_proportion: Tensor
    iterations: int

    @property
    def best(self) -> Tensor:
        """``(S, *input_shape)`` each seed's best test case (the seed itself where none was found)."""
        return self.examples[:, 0]

    @property
    def success(self) -> Tensor:
        """``(S,)`` whether an adversarial example was found for each seed."""
        return self.found[:, 0]


def _minmax(values: Tensor) -> Tensor:
    """Min-max scaling along the last dimension to ``[0, 1]``; a uniform row scales to zeros (no 0/0)."""
    low, high = values.amin(dim=-1, keepdim=True), values.amax(dim=-1, keepdim=True)
    span = high - low
    return torch.where(span > 0, (values - low) / torch.where(span > 0, span, 1), 0)


def _generator_seed(seed: int, key: int) -> int:
    """A 63-bit generator seed mixing ``seed`` and a content key (splitmix64 finaliser)."""
    z = (key ^ (seed * 0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def _coin_flips(size: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """``size`` fair booleans from ``size / 8`` random bytes (eight flips per draw)."""
    raw = torch.randint(0, 256, ((size + 7) // 8,), generator=generator, device=device, dtype=torch.uint8)
    return ((raw[:, None] & _BITS.to(device)) != 0).view(-1)[:size]


def _mutation_sites(size: int, rate: float, generator: torch.Generator, device: torch.device) -> Tensor:
    """Sorted positions in ``[0, size)``, each included independently with probability ``rate``.

    Draws only the gaps between sites (geometric, by inversion), about ``rate · size`` numbers instead
    of one per element; more are drawn in the rare case that the first draw falls short of ``size``.
    """
    if rate == 0.0 or size == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    if rate == 1.0:
        return torch.arange(size, device=device)
    log_keep, expected = math.log1p(-rate), rate * size
    sites, end = [], torch.zeros((), dtype=torch.long, device=device)
    while True:
        count = int(expected + 6 * math.sqrt(expected) + 16)
        uniform = torch.rand(count, generator=generator, device=device)
        gaps = (torch.log1p(-uniform) / log_keep).long() + 1  # ≥ 1; P(gap = k) = (1 - rate)^(k-1) · rate
        positions = end + gaps.cumsum(0) - 1
        sites.append(positions[positions < size])
        end = positions[-1] + 1
        if int(end) >= size:
            return torch.cat(sites)


def _breeding_draws(
    generators: list[torch.Generator], children: int, width: int, rate: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One iteration's random numbers, each seed's from its own generator (a loop over seeds for RNG only).

    Returns:
        Uniforms ``(C, 2·children)`` picking the parent pairs, crossover flips ``(C, children, width)``,
        mutation sites as flat indices into ``(C, children, width)``, and their standard normal noise.
    """
    device, size = generators[0].device, children * width
    draws, flips, sites, noise = [], [], [], []
    for index, generator in enumerate(generators):
        draws.append(torch.rand(2 * children, generator=generator, device=device))
        flips.append(_coin_flips(size, generator, device))
        where = _mutation_sites(size, rate, generator, device)
        sites.append(where + index * size)
        noise.append(torch.randn(len(where), generator=generator, device=device, dtype=dtype))
    mask = torch.stack(flips).view(len(generators), children, width)
    return torch.stack(draws), mask, torch.cat(sites), torch.cat(noise)


def _pass_slices(seeds: int, population: int, max_batch: int | None) -> list[slice]:
    """Row ranges of the model's passes over ``seeds · population`` rows: whole populations per pass.

    With ``max_batch < population`` each population is cut at the same offsets, so the rows a seed
    shares a pass with never depend on the other seeds.
    """
    total = seeds * population
    if max_batch is None or max_batch >= total:
        return [slice(0, total)]
    if max_batch >= population:
        step = max_batch // population * population
        return [slice(start, min(start + step, total)) for start in range(0, total, step)]
    return [
        slice(base + start, base + min(start + max_batch, population))
        for base in range(0, total, population)
        for start in range(0, population, max_batch)
    ]


class _Chunk:
    """The populations of a chunk of seeds, ``(C, N, D)``, with their model and fitness evaluations."""

    def __init__(
        self,
        adapter: ModelAdapter,
        seeds: Tensor,
        labels: Tensor,
        seed_logits: Tensor,
        options: dict,
        start: Tensor | None = None,
    ) -> None:
        self.adapter, self.options, self.seed_logits = adapter, options, seed_logits
        self.shape, self.count, self.size = seeds.shape[1:], len(seeds), options["population"]
        self.seeds, self.labels = seeds.reshape(len(seeds), 1, -1), labels.repeat_interleave(self.size)
        self.start = None if start is None else start.reshape(len(seeds), start.shape[1], self.seeds.shape[2])
        radius = options["radius"]
        self.lower, self.upper = (self.seeds - radius).clamp_(min=0), (self.seeds + radius).clamp_(max=1)

    def loss(self, population: Tensor) -> tuple[Tensor, Tensor]:
        """``J`` of every individual, ``(C, N)``, and its logits ``(C, N, K)``, in passes of whole populations."""
        rows = population.reshape(-1, *self.shape)
        passes = _pass_slices(self.count, self.size, self.options["max_batch"])
        logits = torch.cat([self.adapter.logits(rows[part], num_classes=self.options["classes"]) for part in passes])
        loss = prediction_loss(logits, self.labels).view(self.count, self.size).to(population.dtype)
        return loss, logits.view(self.count, self.size, -1)

    def quality(self, population: Tensor, which: Tensor) -> Tensor:
        """``q`` of every individual of the seeds ``which``, ``(C', N)``."""
        tests = population[which]
        seeds = self.seeds[which].expand_as(tests)
        flat = perceptual_quality(
            tests.reshape(-1, *self.shape), seeds.reshape(-1, *self.shape), self.options["perceptual"]
        )
        return flat.view(len(tests), self.size).to(population.dtype)

    def fitness(self, population: Tensor, loss: Tensor, second: Tensor) -> Tensor:
        """``F₁ = minmax(J)``; ``F₂ = minmax(J) + α·minmax(q)`` for the seeds flagged in ``second``."""
        fitness = _minmax(loss)
        if bool(second.any()):
            fitness[second] += self.options["alpha"] * _minmax(self.quality(population, second))
        return fitness

    def breed(self, population: Tensor, fitness: Tensor, generators: list[torch.Generator]) -> Tensor:
        """Elite kept; children of parent pairs drawn from it by ``softmax(fitness)``, uniform crossover, mutation."""
        elite, mutation_rate, mutation_std = (self.options[k] for k in ("elite", "mutation_rate", "mutation_std"))
        children, width = self.size - elite, population.shape[2]
        device = population.device
        rows = torch.arange(self.count, device=device)[:, None]
        best = fitness.argsort(dim=1, descending=True, stable=True)[:, :elite]
        parents = population[rows, best]  # (C, elite, D): the elite, also the mating pool
        cumulative = torch.softmax(fitness[rows, best], dim=1).cumsum(dim=1)
        draws, mask, sites, noise = _breeding_draws(generators, children, width, mutation_rate, population.dtype)
        pairs = torch.searchsorted(cumulative, draws.to(cumulative.dtype) * cumulative[:, -1:], right=True)
        pairs.clamp_(max=elite - 1)
        offspring = torch.where(mask, parents[rows, pairs[:, :children]], parents[rows, pairs[:, children:]])
        offspring.view(-1)[sites] += noise * mutation_std
        offspring.clamp_(self.lower, self.upper)  # the r-ball within [0, 1], in place
        return torch.cat([parents, offspring], dim=1)

    def run(self, generators: list[torch.Generator]) -> dict[str, Tensor]:
        """The whole GA for the chunk's seeds; per-seed results."""
        opts, device = self.options, self.seeds.device
        start = [
            torch.randn(self.size, self.seeds.shape[2], generator=g, device=device, dtype=self.seeds.dtype)
            for g in generators
        ]
        offsets = (torch.stack(start) * opts["init_std"]).clamp_(-opts["radius"], opts["radius"])
        population = torch.maximum(torch.minimum(self.seeds + offsets, self.upper), self.lower)
        if self.start is not None:  # given individuals replace the first random ones (the draws stay the same)
            given = self.start.shape[1]
            population[:, :given] = torch.maximum(torch.minimum(self.start, self.upper), self.lower)
        first = torch.full((self.count,), -1, dtype=torch.long, device=device)
        threshold = opts["switch"] * self.size
        for step in range(opts["iterations"] + 1):
            loss, logits = self.loss(population)
            first = torch.where((first < 0) & (loss >= 0).any(dim=1), step, first)
            if step == opts["iterations"]:
                break
            second = (loss > 0).sum(dim=1) >= threshold
            population = self.breed(population, self.fitness(population, loss, second), generators)
        quality = self.quality(population, torch.ones(self.count, dtype=torch.bool, device=device))
        fitness = _minmax(loss) + opts["alpha"] * _minmax(quality)
        adversarial = loss >= 0
        rank = torch.where(adversarial, fitness, -math.inf).argsort(dim=1, descending=True, stable=True)
        chosen = rank[:, : opts["num_best"]]
        rows = torch.arange(self.count, device=device)[:, None]
        found = adversarial[rows, chosen]
        examples = torch.where(found[..., None], population[rows, chosen], self.seeds)
        nan = torch.tensor(math.nan, dtype=loss.dtype, device=device)
        return {
            "examples": examples.reshape(self.count, -1, *self.shape),
            "found": found,
            "loss": torch.where(found, loss[rows, chosen], nan),
            "logits": torch.where(found[..., None], logits[rows, chosen], self.seed_logits[:, None]),
            "quality": torch.where(found, quality[rows, chosen], nan),
            "first_success": first,
            "ae_proportion": adversarial.to(loss.dtype).mean(dim=1),
        }


_PER_CALL = {"start", "keys", "validate_args"}
"""Keyword arguments of :func:`two_step_ga` that belong to one call's seeds, not to the GA's settings."""


def check_ga_options(seeds: Tensor | None, radius: float, values: bool = True, **ga: Any) -> None:
    """Refuse bad :func:`two_step_ga` arguments before any work, as the GA itself would.

    For callers that do work before the GA, such as seed selection, or that take the GA's arguments
    long before they have seeds (``seeds=None``: the seed-dependent checks wait for the GA);
    ``values=False`` skips reading the seeds' values (range, NaN) for callers that checked them.
    """
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(two_step_ga).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in _PER_CALL
    }
    unknown = sorted(set(ga) - set(defaults))
    if unknown:
        raise ValueError(f"ga: unknown two_step_ga arguments {unknown}; expected some of {sorted(defaults)}")
    _check_settings({**defaults, **ga, "radius": radius})
    if seeds is not None:
        _check_seeds(seeds, {**defaults, **ga}, values)


def _check_settings(options: dict) -> None:
    """The GA's settings, which do not depend on the seeds."""
    radius = finite_float("radius", options["radius"])
    if not 0.0 < radius <= 1.0:
        raise ValueError(f"radius: expected a value in (0, 1], got {radius!r}")
    population = positive_int("population", options["population"])
    elite = positive_int("elite", options["elite"])
    if population <= elite:
        raise ValueError(f"population: population smaller than the elite ({population} <= elite {elite})")
    num_best = positive_int("num_best", options["num_best"])
    if num_best > population:
        raise ValueError(f"num_best: expected at most population ({population}), got {num_best}")
    positive_int("iterations", options["iterations"], minimum=0)
    probability("switch", options["switch"])
    probability("mutation_rate", options["mutation_rate"])
    for name in ("alpha", "mutation_std", "init_std"):
        if finite_float(name, options[name]) < 0:
            raise ValueError(f"{name}: expected a value of 0 or more, got {options[name]!r}")
    for name in ("max_elements", "max_batch"):
        optional_positive_int(name, options[name])
    if isinstance(options["seed"], bool) or not isinstance(options["seed"], int):
        raise ValueError(f"seed: expected an integer, got {options['seed']!r}")
    check_measure(options["perceptual"])


def _check_seeds(seeds: object, options: dict, values: bool = True) -> Tensor:
    """Seeds in ``[0, 1]`` (values checked unless ``values=False``) that the perceptual measure can score."""
    seeds = check_tensor("seeds", seeds, min_ndim=2, floating=True)
    if values:
        hint = "seeds are pixels; pass preprocess= via a ModelAdapter for the model"
        check_values("seeds", seeds, (0.0, 1.0), hint)
    check_measure(options["perceptual"], seeds.ndim)
    if options["perceptual"] == "ssim" and min(seeds.shape[-2:]) < 11:
        raise ValueError(f"perceptual: 'ssim' needs images of at least 11x11, got {tuple(seeds.shape[1:])}")
    return seeds


def two_step_ga(
    model: nn.Module | ModelAdapter,
    seeds: Tensor,
    target: Tensor,
    radius: float = 0.1,
    *,
    population: int = 1000,
    iterations: int = 100,
    num_best: int = 1,
    elite: int = 20,
    switch: float = 0.6,
    alpha: float = 1.0,
    perceptual: str = "mse",
    mutation_rate: float = 0.2,
    mutation_std: float = 0.003,
    init_std: float = 0.01,
    seed: int = 0,
    keys: Tensor | None = None,
    max_elements: int | None = None,
    max_batch: int | None = None,
    start: Tensor | None = None,
    validate_args: bool = True,
) -> GAResult:
    """HDA's two-step GA (SPEC §4, papers/002 Algorithm 1): adversarial test cases close to each seed.

    Per seed ``x`` with label ``y``, on logits ``z``: ``J = max_{j≠y} z_j − z_y`` (``J ≥ 0`` ⇔ adversarial).

    1. ``N`` individuals ``x + clip(N(0, init_std²), ±r)``, projected to ``[0, 1]``; ``start`` replaces
       the first of them with given individuals (projected into the ``r``-ball and ``[0, 1]``).
    2. ``T`` iterations: fitness ``F₁ = minmax(J)`` while fewer than ``switch · N`` individuals have
       ``J > 0``, else ``F₂ = minmax(J) + α·minmax(q)``, ``q`` the perceptual quality against ``x``
       (``−MSE``, PSNR or SSIM; a uniform vector min-maxes to zeros); the best ``elite`` stay unchanged
       and are the mating pool: the other ``N − elite`` are children of parent pairs drawn from it with
       probabilities ``softmax(fitness)`` (as the authors' code does), by uniform crossover, with
       ``N(0, mutation_std²)`` added to each element with probability ``mutation_rate``, projected
       into the L∞ ``r``-ball around ``x`` and ``[0, 1]``.
    3. The best ``m`` of the final population by ``F₂`` among those with ``J ≥ 0``.

    The populations of a chunk of seeds (``chunk · N · elements ≤ max_elements``) pass through the
    model together, ``(chunk · N, *input_shape)`` in passes of whole populations of at most
    ``max_batch`` rows, under ``no_grad`` in eval mode (the model is left exactly as found; black box,
    also inside ``inference_mode``). Each seed draws its random numbers from its own generator on the
    model's device, seeded from ``seed`` and ``keys[i]``: a seed's result is a function of the seed alone,
    whatever the chunking, the other seeds or the number of processes -- bit for bit as long as the
    model's output for a row does not depend on the size of its batch (CPU BLAS and cuBLAS may pick other
    kernels for other batch sizes: on an Intel AVX-512 Xeon a small MLP's logits differ in the last bits
    between passes of 8 rows and of 120, so chunkings agree there to rounding, not bit for bit).

    Args:
        model: the network or a :class:`~dlguard.probes.ModelAdapter` (``preprocess`` maps pixels for it).
        seeds: ``(S, *input_shape)`` seeds in ``[0, 1]`` (images, 1-D signals ``(S, C, T)``, ...).
        target: ``(S,)`` their labels ``y``.
        radius: ``r`` of the L∞ ball, in ``(0, 1]``.
        population: ``N``.
        iterations: ``T``.
        num_best: ``m`` test cases per seed.
        elite: individuals kept unchanged each iteration, the parents of the rest (1 to ``N − 1``).
        switch: share of the population with ``J > 0`` from which ``F₂`` is used.
        alpha: ``α``, weight of the quality term.
        perceptual: ``"mse"``, ``"psnr"`` or ``"ssim"`` (images of at least 11x11).
        mutation_rate: probability of mutating an element.
        mutation_std: standard deviation of a mutation.
        init_std: standard deviation of the initial noise.
        seed: seed of every generator.
        keys: ``(S,)`` integer keys of the seeds (default :func:`~dlguard._random.content_keys`).
        max_elements: bound on ``chunk · N · elements`` held at once (memory: about 6x this in values);
            default ``2**26`` on accelerators, ``2**20`` on CPU (one MNIST population of 1,000).
        max_batch: rows per forward pass; default (``None``) a memory budget of the GA's own: a whole
            chunk on accelerators, ``2**19 / elements`` rows (at least 8) on CPU.
        start: ``(S, G, *input_shape)`` individuals placed first in each seed's initial population
            (``G ≤ N``), e.g. a gradient step from the seed (:func:`~dlguard.generate.hda_test`'s
            ``gradient_start``); ``None``: all ``N`` are random.
        validate_args: check the seeds' values and the labels' range (skip when the caller did).

    On CPU, large chunks and passes are memory-bound (``benchmarks/hda.py``: 2.4x slower for 16
    MNIST seeds in one 16,000-row pass than one seed at a time in 500-row passes), hence the smaller
    CPU defaults; on a GPU, batching many seeds keeps it busy. Neither changes the results.

    Returns:
        A :class:`GAResult`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))  # class 1 once the mean pixel exceeds 0.51
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[0.0] * 4, [1.0] * 4]))
        ...     _ = net[1].bias.copy_(torch.tensor([0.0, -2.04]))
        >>> seeds, labels = torch.tensor([0.5, 0.49, 0.2]).view(3, 1, 1, 1).repeat(1, 1, 2, 2), torch.zeros(3).long()
        >>> result = two_step_ga(net, seeds, labels, 0.1, population=50, iterations=20, num_best=2)
        >>> result.examples.shape, result.found.tolist()  # the last seed is 0.31 from the boundary: farther than r
        (torch.Size([3, 2, 1, 2, 2]), [[True, True], [True, True], [False, False]])
        >>> result.first_success.tolist(), bool((result.best[:2] - seeds[:2]).abs().max() <= 0.1 + 1e-6)
        ([0, 5, -1], True)
    """
    options = dict(
        radius=radius, population=population, iterations=iterations, num_best=num_best, elite=elite,
        switch=switch, alpha=alpha, perceptual=perceptual, mutation_rate=mutation_rate, mutation_std=mutation_std,
        init_std=init_std, seed=seed, max_elements=max_elements, max_batch=max_batch,
    )  # fmt: skip
    _check_settings(options)
    seeds = _check_seeds(seeds, options, values=validate_args)
    check_labels("target", target, batch=len(seeds))
    if keys is not None:
        check_tensor("keys", keys)
        if keys.is_floating_point() or tuple(keys.shape) != (len(seeds),):
            raise ValueError(
                f"keys: expected integer keys of shape ({len(seeds)},), got {keys.dtype} {tuple(keys.shape)}"
            )
    if start is not None:
        check_tensor("start", start, floating=True)
        if start.ndim != seeds.ndim + 1 or len(start) != len(seeds) or start.shape[2:] != seeds.shape[1:]:
            raise ValueError(
                f"start: expected (S, G, *input_shape) = ({len(seeds)}, G, {', '.join(map(str, seeds.shape[1:]))}), "
                f"got {tuple(start.shape)}"
            )
        if start.shape[1] > population:
            raise ValueError(f"start: expected at most population ({population}) individuals per seed, got "
                             f"{start.shape[1]}")  # fmt: skip
    adapter = ModelAdapter.wrap(model)
    device = adapter.device
    seeds, labels = seeds.detach().to(device).clone(), target.detach().to(device).clone()
    keys = content_keys(seeds, seed) if keys is None else keys
    generators = [torch.Generator(device=device).manual_seed(_generator_seed(seed, int(k))) for k in keys.tolist()]
    elements = max(1, seeds[0].numel() if len(seeds) else 1)
    if device.type == "cpu":
        max_elements = max_elements or 2**20
        options["max_batch"] = max_batch = max_batch or max(8, 2**19 // elements)
    chunk = max(1, (max_elements or 2**26) // (population * elements))
    parts: list[dict[str, Tensor]] = []
    with evaluation(adapter.model), torch.no_grad():
        seed_logits = adapter.logits(seeds, max_batch) if len(seeds) else None  # raises on non-logit outputs
        if seed_logits is not None:
            options["classes"] = seed_logits.shape[1]
            if validate_args:
                check_labels("target", labels, num_classes=options["classes"])
        for row in range(0, len(seeds), chunk):
            part = slice(row, row + chunk)
            assert seed_logits is not None
            given = None if start is None else start[part].detach().to(device, seeds.dtype)
            chunk_seeds = _Chunk(adapter, seeds[part], labels[part], seed_logits[part], options, given)
            parts.append(chunk_seeds.run(generators[part]))
    if not parts:
        empty = seeds.new_zeros((0, num_best, *seeds.shape[1:]))
        flags = torch.zeros(0, num_best, dtype=torch.bool, device=device)
        no_logits = seeds.new_zeros((0, num_best, 0))
        return GAResult(empty, flags, flags.to(seeds.dtype), no_logits, flags.to(seeds.dtype),
                        torch.zeros(0, dtype=torch.long, device=device), seeds.new_zeros(0), iterations)  # fmt: skip
    merged = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
    return GAResult(iterations=iterations, **merged)
