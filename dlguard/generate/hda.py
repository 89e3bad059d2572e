"""Hierarchical distribution-aware testing (SPEC §4): seeds by global density × local vulnerability, then the GA.

One run, usable without Lightning and shared by :class:`~dlguard.callbacks.HDACallback` and the
recipe: score candidate seeds by ``p_g`` (the global distribution) and a local robustness
indicator (``S_grad`` or ``S_sep``), keep the top ``k`` among the correctly classified ones, search
each seed's ``r``-ball with the two-step GA, all seeds' populations in one batch, and score the
current model on a held-out set of test cases (``R̂_g``).

Under DDP every process passes its own shard of candidates with their content keys: densities,
indicators and keys are gathered so that the top ``k`` are chosen over all candidates (the
selection one process would make), and each process searches around the selected seeds it holds.
The inputs are validated once, at :func:`hda_test`, and passed on trusted, with their keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from dlguard import _distributed
from dlguard._random import content_keys, keyed_uniform
from dlguard._validation import (
    check_labels,
    check_tensor,
    check_values,
    one_of,
    optional_positive_int,
    positive_int,
    probability,
)
from dlguard.generate.distribution import GlobalDistribution
from dlguard.generate.failures import Failures
from dlguard.generate.genetic import GAResult, check_ga_options, two_step_ga
from dlguard.generate.gradients import input_gradients, loss_gradient
from dlguard.generate.seeds import gradient_indicator, select_seeds, separation_indicator
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

__all__ = ["HOLDOUT_SALT", "HDARun", "HeldOut", "hda_test", "select_hda_seeds"]

Indicator = Literal["grad", "sep"]
_VULNERABILITY = {"grad": "high", "sep": "low"}  # a large gradient, a small separation: less robust
HOLDOUT_SALT = 0x4D5A
"""The held-out draw's own stream of keyed randomness: a seed is held out when its keyed uniform is ≤ ``holdout``."""

HeldOut = dict[str, Tensor]
"""Held-out test cases of every process, sorted by key: ``inputs``, ``labels``, ``log_density``, ``keys``."""


@dataclass
class HDARun:
    """What one HDA run found; tensors hold this process's selected seeds, ``selected_keys`` all of them.

    Feed :attr:`test_cases` to :class:`~dlguard.metrics.AEQuality` and :attr:`heldout_share` to
    :class:`~dlguard.metrics.EmpiricalGlobalRobustness`; both sum over processes.

    Attributes:
        seeds: ``(k_rank, ...)`` the selected seeds this process holds, in key order.
        target: ``(k_rank,)`` their labels.
        keys: ``(k_rank,)`` their content keys.
        log_density: ``(k_rank,)`` ``log p_g`` of the seeds.
        ga: the GA's result for these seeds (``examples (k_rank, m, ...)``...).
        selected_keys: ``(k,)`` every process's selected keys, sorted.
        candidate_log_density: ``(n,)`` ``log p_g`` of every candidate, over all processes, by key.
        selected_density_share: ``(k,)`` each selected seed's ``p_g`` over the candidates' total, by key
            (the paper's Table 6 normalises densities for presentation; random seeds average ``1 / n``).
        held: ``(k_rank,)`` whether each seed is held out (its test case is never a failure to replay).
        failures: the AEs of the seeds not held out, with their seeds' labels.
        heldout: the held-out test cases the run scored: the ones it was given, else this run's held-out
            seeds' best AE (the seed itself where the GA found none); empty when no seed is held out.
        heldout_share: ``(logits, labels, log_density)`` of this process's share of ``heldout`` (every
            world-th case), as :class:`~dlguard.metrics.EmpiricalGlobalRobustness` takes them.
    """

    seeds: Tensor
    target: Tensor
    keys: Tensor
    log_density: Tensor
    ga: GAResult
    selected_keys: Tensor
    candidate_log_density: Tensor
    selected_density_share: Tensor
    held: Tensor
    failures: Failures
    heldout: HeldOut
    heldout_share: tuple[Tensor, Tensor, Tensor]

    @property
    def test_cases(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(logits, target, tests, seeds)`` of the ``k_rank·m`` test cases, for :class:`~dlguard.metrics.AEQuality`.

        The GA's own logits: no second forward pass (an AE with ``J`` near 0 may flip in a batch of
        another size, and the bank must hold what the numbers count).
        """
        examples = self.ga.examples
        m = examples.shape[1]
        seeds = self.seeds.to(examples.device)[:, None].expand_as(examples)
        return (
            self.ga.logits.flatten(0, 1),
            self.target.to(examples.device).repeat_interleave(m),
            examples.flatten(0, 1),
            seeds.flatten(0, 1),
        )


def check_indicator(indicator: object) -> str:
    """``indicator`` if it names a local robustness indicator: ``"grad"`` (``S_grad``) or ``"sep"`` (``S_sep``)."""
    return one_of("indicator", indicator, tuple(_VULNERABILITY))


def check_distribution(distribution: object, fitted: bool = True) -> None:
    """``distribution`` is a :class:`~dlguard.generate.GlobalDistribution` (fitted, unless ``fitted=False``)."""
    if not isinstance(distribution, GlobalDistribution):
        raise ValueError(f"distribution: expected a GlobalDistribution, got {type(distribution).__name__}")
    if fitted and not distribution.is_fitted:
        raise ValueError("distribution: is not fitted; call distribution.fit(training inputs) first")


def select_hda_seeds(
    model: nn.Module | ModelAdapter,
    inputs: Tensor,
    target: Tensor,
    distribution: GlobalDistribution,
    k: int,
    indicator: Indicator = "grad",
    keys: Tensor | None = None,
    max_batch: int | None = None,
    *,
    density_keys: Tensor | None = None,
    validate_args: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Indices (into this process's candidate ``inputs``) of the top ``k`` seeds over all processes.

    Candidates the model misclassifies are never selected. Returns the local indices in key order
    and the gathered ``{"keys", "log_density", "selected"}`` of every candidate (``selected``: the
    global selection's keys, sorted). ``keys`` order the candidates (default: content keys);
    ``density_keys`` are their seed-0 content keys for the distribution's leave-one-out, when the
    caller has them; ``validate_args=False`` skips reading the inputs' values (range, NaN).
    """
    adapter = ModelAdapter.wrap(model)
    indicator = check_indicator(indicator)
    check_distribution(distribution)
    keys = content_keys(inputs) if keys is None else keys
    if indicator == "sep":  # the reference set is every process's candidates (a collective: before any early exit)
        reference, reference_target = _distributed.gather_cat(inputs), _distributed.gather_cat(target)
    if len(inputs):
        log_density = distribution.log_density(inputs, keys=density_keys, validate_args=validate_args)
        log_density = log_density.to(adapter.device, torch.float64)
        with evaluation(adapter.model), torch.no_grad():
            rows = adapter.rows_per_pass(inputs, max_batch)
            correct = adapter.logits(inputs, max_batch=rows).argmax(dim=1) == target.to(adapter.device)
        if indicator == "grad":
            scores = gradient_indicator(adapter, inputs, target, max_batch, validate_args=validate_args)
        else:
            scores = separation_indicator(
                adapter, inputs, target, reference, reference_target, max_batch, validate_args=validate_args
            )
    else:  # a process whose shard is empty still joins every gather
        log_density = torch.zeros(0, dtype=torch.float64, device=adapter.device)
        correct = torch.zeros(0, dtype=torch.bool, device=adapter.device)
        scores = torch.zeros(0, dtype=torch.float64, device=adapter.device)
    gathered = {
        name: _distributed.gather_cat(value.to(adapter.device))
        for name, value in (
            ("keys", keys),
            ("log_density", log_density),
            ("indicator", scores.double()),
            ("correct", correct),
        )
    }
    order = gathered["keys"].argsort()  # one order for 1 or N processes
    gathered = {name: value[order] for name, value in gathered.items()}
    chosen = select_seeds(
        gathered["log_density"],
        gathered["indicator"],
        k,
        correct=gathered["correct"],
        vulnerability=_VULNERABILITY[indicator],
        tie_break=gathered["keys"],
        validate_args=False,  # made here from checked inputs
    )
    selected = gathered["keys"][chosen].sort().values
    local = torch.isin(keys.to(adapter.device), selected).nonzero().squeeze(1)
    local = local[keys.to(adapter.device)[local].argsort()]
    return local, {"keys": gathered["keys"], "log_density": gathered["log_density"], "selected": selected}


def _hold_out(seeds: Tensor, target: Tensor, keys: Tensor, log_density: Tensor, ga: GAResult, held: Tensor) -> HeldOut:
    """Every process's held-out test cases, by key: the best AE, or the seed itself where the GA found none."""
    device = seeds.device
    held, found = held.to(device), ga.found[:, 0].to(device)
    cases = torch.where(found.view(-1, *[1] * (seeds.ndim - 1)), ga.best.to(device), seeds)
    mine = {
        "inputs": cases[held].flatten(1),
        "labels": target[held].to(device),
        "log_density": log_density.to(device)[held],
        "keys": keys[held].to(device),
    }
    every = {name: _distributed.gather_cat(value) for name, value in mine.items()}
    order = every["keys"].argsort()
    every = {name: value[order].cpu() for name, value in every.items()}
    every["inputs"] = every["inputs"].reshape(-1, *seeds.shape[1:])
    return every


def _heldout_share(adapter: ModelAdapter, heldout: HeldOut, max_batch: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """The current model's logits on this process's share of the held-out cases (every world-th one)."""
    share = slice(_distributed.rank(), None, _distributed.world_size())
    inputs, labels, log_density = heldout["inputs"][share], heldout["labels"][share], heldout["log_density"][share]
    device = adapter.device
    if not len(inputs):
        return torch.zeros(0, 0, device=device), labels.to(device), log_density.to(device)
    with evaluation(adapter.model), torch.no_grad():
        logits = adapter.logits(inputs, max_batch=adapter.rows_per_pass(inputs, max_batch))
    return logits, labels.to(logits.device), log_density.to(logits.device)


def _gradient_step(adapter: ModelAdapter, seeds: Tensor, labels: Tensor, radius: float) -> Tensor:
    """``(S, 1, ...)``: each seed's fast-gradient-sign point ``x + r·sign(∇_x CE)``, one seed per pass."""
    device = adapter.device
    with input_gradients(adapter.model):
        steps = [
            loss_gradient(adapter, seed[None].to(device), label[None].to(device).long().clone()).sign()
            for seed, label in zip(seeds, labels, strict=True)
        ]
    if not steps:
        return seeds[:, None]
    return (seeds.to(device) + radius * torch.cat(steps).to(seeds.dtype))[:, None]


def hda_test(
    model: nn.Module | ModelAdapter,
    inputs: Tensor,
    target: Tensor,
    distribution: GlobalDistribution,
    k: int = 20,
    radius: float = 0.1,
    indicator: Indicator = "grad",
    keys: Tensor | None = None,
    seed: int = 0,
    max_batch: int | None = None,
    *,
    holdout: float = 0.0,
    heldout: HeldOut | None = None,
    gradient_start: bool = False,
    validate_args: bool = True,
    **ga: Any,
) -> HDARun:
    """Select ``k`` seeds among candidate ``inputs`` and search each one's ``radius``-ball with the two-step GA.

    A share ``holdout`` of the selected seeds (chosen by content, :data:`HOLDOUT_SALT`) is held out:
    their test cases are not failures to replay. The run scores the current model on held-out test
    cases (``R̂_g``'s inputs): those given in ``heldout`` (kept from an earlier run: how far training
    has closed those AEs), else this run's own held-out seeds' test cases.

    Args:
        model: the classifier (or a :class:`~dlguard.probes.ModelAdapter` with ``preprocess`` and
            ``output_transform``); left exactly as found.
        inputs: ``(n, ...)`` candidate seeds in ``[0, 1]`` (this process's shard under DDP).
        target: ``(n,)`` their labels.
        distribution: a fitted :class:`~dlguard.generate.GlobalDistribution` (VAE + KDE, or PCA).
        k: seeds to select over all processes (fewer candidates: a warning and all correct ones).
        radius: the ``L∞`` radius ``r`` of each seed's norm ball, in ``(0, 1]``.
        indicator: ``"grad"`` (``S_grad``, white-box) or ``"sep"`` (``S_sep``, black-box).
        keys: the candidates' :func:`~dlguard._random.content_keys` with ``seed`` (a probe set's
            keys; computed when omitted).
        seed: seed of the GA (each seed's run is keyed by its content, not by its position).
        max_batch: rows per forward pass of the seed selection and the held-out scoring (``None``: a
            memory budget, :func:`~dlguard.probes.default_max_batch`); the GA sizes its own passes (pass
            ``max_batch`` or ``max_elements`` in ``ga`` to bound them).
        holdout: share of the selected seeds held out, in ``[0, 1]``.
        heldout: held-out test cases of an earlier run (:attr:`HDARun.heldout`) to score instead of
            this run's.
        gradient_start: put one gradient step into each seed's initial population: the fast-gradient-sign
            point ``x + r·sign(∇_x CE(f(x), y))`` replaces the first random individual (one pass with a
            backward per seed, each seed alone, so a seed's start is the same in any batch or process).
            A departure from SPEC §4's black-box GA that :class:`~dlguard.callbacks.HDACallback` takes
            by default: under a budget of a few GA iterations, random noise in the ball rarely crosses a
            boundary the gradient points at; the GA then searches from it (and toward the seed, ``F₂``).
        validate_args: check the candidates' values (range, NaN) and labels; callers that checked them
            already (a callback's probe set) pass ``False``. Either way they are checked once, here.
        **ga: further arguments of :func:`~dlguard.generate.two_step_ga` (``population``,
            ``iterations``, ``num_best``, ``perceptual``, ``alpha``...).

    Example:
        >>> import torch
        >>> from dlguard.data import MNISTDataModule
        >>> from dlguard.generate.distribution import VAEDistribution
        >>> from dlguard.zoo import pretrained
        >>> data = MNISTDataModule()
        >>> data.setup()
        >>> images = torch.stack([data.val_set[i][0] for i in range(100)])
        >>> labels = torch.tensor([data.val_set[i][1] for i in range(100)])
        >>> distribution = VAEDistribution(pretrained("vae_mnist")).fit(images)
        >>> run = hda_test(pretrained("mnist_a"), images, labels, distribution, k=4, population=100, iterations=10)
        >>> distance = (run.ga.examples - run.seeds[:, None]).abs().max()
        >>> run.seeds.shape, run.ga.examples.shape, bool(distance <= 0.1 + 1e-6)
        (torch.Size([4, 1, 28, 28]), torch.Size([4, 1, 1, 28, 28]), True)
    """
    adapter = ModelAdapter.wrap(model)
    check_tensor("inputs", inputs, floating=True)
    if validate_args:
        check_values("inputs", inputs, (0.0, 1.0))
    check_labels("target", target, batch=len(inputs))
    positive_int("k", k)
    optional_positive_int("max_batch", max_batch)
    probability("holdout", holdout)
    indicator = check_indicator(indicator)
    if not isinstance(gradient_start, bool):
        raise ValueError(f"gradient_start: expected True or False, got {gradient_start!r}")
    check_distribution(distribution)
    if len(inputs) == 0 and _distributed.world_size() == 1:
        raise ValueError("inputs: expected at least one candidate seed, got none")
    check_ga_options(inputs, radius, values=False, seed=seed, **ga)  # the values were checked above
    if keys is not None and (keys.dtype != torch.int64 or tuple(keys.shape) != (len(inputs),)):
        raise ValueError(f"keys: expected int64 content keys of shape ({len(inputs)},), got {keys.dtype} "
                         f"{tuple(keys.shape)}")  # fmt: skip
    keys = content_keys(inputs, seed) if keys is None else keys.to(inputs.device)
    density_keys = keys if seed == 0 else None  # the distribution knows its fitted points by seed-0 content keys
    local, gathered = select_hda_seeds(
        adapter, inputs, target, distribution, k, indicator, keys, max_batch,
        density_keys=density_keys, validate_args=False,
    )  # fmt: skip
    local_cpu = local.to(inputs.device)
    seeds, labels, seed_keys = inputs[local_cpu], target[local_cpu], keys[local_cpu]
    # max_batch bounds the selection's passes; the GA batches whole populations of many seeds by its own budget
    start = _gradient_step(adapter, seeds, labels, radius) if gradient_start else None
    result = two_step_ga(
        adapter, seeds, labels, radius, seed=seed, keys=seed_keys, start=start, validate_args=False, **ga
    )
    log_density = gathered["log_density"]
    selected = torch.isin(gathered["keys"], gathered["selected"])
    share = (log_density[selected] - log_density.logsumexp(0)).exp()
    position = torch.searchsorted(gathered["keys"], seed_keys.to(gathered["keys"].device))
    seed_density = log_density[position]
    held = keyed_uniform(seed_keys, (1,), salt=HOLDOUT_SALT).squeeze(1).to(seed_keys.device) <= holdout
    replayed = result.found & ~held.to(result.found.device)[:, None]
    failures = Failures(result.examples[replayed], labels.to(replayed.device)[:, None].expand(replayed.shape)[replayed])
    if heldout is None:
        heldout = _hold_out(seeds, labels, seed_keys, seed_density, result, held)
    scored = _heldout_share(adapter, heldout, max_batch)
    return HDARun(
        seeds=seeds,
        target=labels,
        keys=seed_keys,
        log_density=seed_density,
        ga=result,
        selected_keys=gathered["selected"],
        candidate_log_density=log_density,
        selected_density_share=share,
        held=held,
        failures=failures,
        heldout=heldout,
        heldout_share=scored,
    )
