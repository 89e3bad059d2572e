"""Hierarchical distribution-aware testing (SPEC §4): seeds by global density × local vulnerability, then the GA.

One run, usable without Lightning and shared by :class:`~dlguard.callbacks.HDACallback` and the
recipe: score candidate seeds by ``p_g`` (the global distribution) and a local robustness
indicator (``S_grad`` or ``S_sep``), keep the top ``k`` among the correctly classified ones, and
search each seed's ``r``-ball with the two-step GA, all seeds' populations in one batch.

Under DDP every process passes its own shard of candidates with their content keys: densities,
indicators and keys are gathered so that the top ``k`` are chosen over all candidates (the
selection one process would make), and each process searches around the selected seeds it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from dlguard import _distributed
from dlguard._random import content_keys
from dlguard._validation import check_labels, check_tensor, check_values, positive_int
from dlguard.generate.distribution import GlobalDistribution
from dlguard.generate.genetic import GAResult, check_ga_options, two_step_ga
from dlguard.generate.seeds import gradient_indicator, select_seeds, separation_indicator
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

__all__ = ["HDARun", "hda_test", "select_hda_seeds"]

Indicator = Literal["grad", "sep"]
_VULNERABILITY = {"grad": "high", "sep": "low"}  # a large gradient, a small separation: less robust


@dataclass
class HDARun:
    """What one HDA run found; tensors hold this process's selected seeds, ``selected_keys`` all of them.

    Attributes:
        seeds: ``(k_rank, ...)`` the selected seeds this process holds, in key order.
        labels: ``(k_rank,)`` their labels.
        keys: ``(k_rank,)`` their content keys.
        log_density: ``(k_rank,)`` ``log p_g`` of the seeds.
        ga: the GA's result for these seeds (``examples (k_rank, m, ...)``...).
        selected_keys: ``(k,)`` every process's selected keys, sorted.
        candidate_log_density: ``(n,)`` ``log p_g`` of every candidate, over all processes, by key.
        selected_density_share: ``(k,)`` each selected seed's ``p_g`` over the candidates' total, by key
            (the paper's Table 6 normalises densities for presentation; random seeds average ``1 / n``).
    """

    seeds: Tensor
    labels: Tensor
    keys: Tensor
    log_density: Tensor
    ga: GAResult
    selected_keys: Tensor
    candidate_log_density: Tensor
    selected_density_share: Tensor


def check_indicator(indicator: object) -> None:
    """``indicator`` names a local robustness indicator: ``"grad"`` (``S_grad``) or ``"sep"`` (``S_sep``)."""
    if indicator not in _VULNERABILITY:
        raise ValueError(f"indicator: expected 'grad' (S_grad) or 'sep' (S_sep), got {indicator!r}")


def check_distribution(distribution: object, fitted: bool = True) -> None:
    """``distribution`` is a :class:`~dlguard.generate.GlobalDistribution` (fitted, unless ``fitted=False``)."""
    if not isinstance(distribution, GlobalDistribution):
        raise ValueError(f"distribution: expected a GlobalDistribution, got {type(distribution).__name__}")
    if fitted and not distribution.is_fitted:
        raise ValueError("distribution: is not fitted; call distribution.fit(training inputs) first")


def _adapter(model: nn.Module | ModelAdapter) -> ModelAdapter:
    return model if isinstance(model, ModelAdapter) else ModelAdapter(model)


def select_hda_seeds(
    model: nn.Module | ModelAdapter,
    candidates: Tensor,
    target: Tensor,
    distribution: GlobalDistribution,
    k: int,
    indicator: Indicator = "grad",
    keys: Tensor | None = None,
    max_batch: int = 256,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Indices (into this process's ``candidates``) of the top ``k`` seeds over all processes.

    Candidates the model misclassifies are never selected. Returns the local indices in key order
    and the gathered ``{"keys", "log_density", "selected"}`` of every candidate (``selected``: the
    global selection's keys, sorted).
    """
    adapter = _adapter(model)
    check_indicator(indicator)
    check_distribution(distribution)
    keys = content_keys(candidates) if keys is None else keys
    if indicator == "sep":  # the reference set is every process's candidates (a collective: before any early exit)
        reference, reference_target = _distributed.gather_cat(candidates), _distributed.gather_cat(target)
    if len(candidates):
        log_density = distribution.log_density(candidates).to(adapter.device, torch.float64)
        with evaluation(adapter.model), torch.no_grad():
            correct = adapter.logits(candidates, max_batch=max_batch).argmax(dim=1) == target.to(adapter.device)
        if indicator == "grad":
            scores = gradient_indicator(adapter, candidates, target, max_batch=max_batch)
        else:
            scores = separation_indicator(adapter, candidates, target, reference, reference_target, max_batch)
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
    )
    selected = gathered["keys"][chosen].sort().values
    local = torch.isin(keys.to(adapter.device), selected).nonzero().squeeze(1)
    local = local[keys.to(adapter.device)[local].argsort()]
    return local, {"keys": gathered["keys"], "log_density": gathered["log_density"], "selected": selected}


def hda_test(
    model: nn.Module | ModelAdapter,
    candidates: Tensor,
    target: Tensor,
    distribution: GlobalDistribution,
    k: int = 20,
    radius: float = 0.1,
    indicator: Indicator = "grad",
    keys: Tensor | None = None,
    seed: int = 0,
    max_batch: int = 1024,
    **ga: Any,
) -> HDARun:
    """Select ``k`` seeds among ``candidates`` and search each one's ``radius``-ball with the two-step GA.

    Args:
        model: the classifier (or a :class:`~dlguard.probes.ModelAdapter` with ``preprocess`` and
            ``output_transform``); left exactly as found.
        candidates: ``(n, ...)`` candidate seeds in ``[0, 1]`` (this process's shard under DDP).
        target: ``(n,)`` their labels.
        distribution: a fitted :class:`~dlguard.generate.GlobalDistribution` (VAE + KDE, or PCA).
        k: seeds to select over all processes (fewer candidates: a warning and all correct ones).
        radius: the ``L∞`` radius ``r`` of each seed's norm ball, in ``(0, 1]``.
        indicator: ``"grad"`` (``S_grad``, white-box) or ``"sep"`` (``S_sep``, black-box).
        keys: content keys of the candidates (default :func:`~dlguard._random.content_keys`).
        seed: seed of the GA (each seed's run is keyed by its content, not by its position).
        max_batch: rows per forward pass of the seed selection (the GA sizes its own passes: pass
            ``max_batch`` or ``max_elements`` in ``ga`` to bound them).
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
    adapter = _adapter(model)
    check_tensor("candidates", candidates, floating=True)
    check_values("candidates", candidates, (0.0, 1.0))
    check_labels("target", target, batch=len(candidates))
    positive_int("k", k)
    positive_int("max_batch", max_batch)
    check_indicator(indicator)
    check_distribution(distribution)
    if len(candidates) == 0 and _distributed.world_size() == 1:
        raise ValueError("candidates: expected at least one candidate seed, got none")
    check_ga_options(candidates, radius, seed=seed, **ga)
    if keys is not None and (keys.dtype != torch.int64 or tuple(keys.shape) != (len(candidates),)):
        raise ValueError(f"keys: expected int64 content keys of shape ({len(candidates)},), got {keys.dtype} "
                         f"{tuple(keys.shape)}")  # fmt: skip
    keys = content_keys(candidates, seed) if keys is None else keys.to(candidates.device)
    local, gathered = select_hda_seeds(adapter, candidates, target, distribution, k, indicator, keys, max_batch)
    local_cpu = local.to(candidates.device)
    seeds, labels, seed_keys = candidates[local_cpu], target[local_cpu], keys[local_cpu]
    # max_batch bounds the selection's passes; the GA batches whole populations of many seeds by its own budget
    result = two_step_ga(adapter, seeds, labels, radius, seed=seed, keys=seed_keys, **ga)
    log_density = gathered["log_density"]
    selected = torch.isin(gathered["keys"], gathered["selected"])
    share = (log_density[selected] - log_density.logsumexp(0)).exp()
    position = torch.searchsorted(gathered["keys"], seed_keys.to(gathered["keys"].device))
    return HDARun(
        seeds=seeds,
        labels=labels,
        keys=seed_keys,
        log_density=log_density[position],
        ga=result,
        selected_keys=gathered["selected"],
        candidate_log_density=log_density,
        selected_density_share=share,
    )
