"""DeepTest's coverage-guided greedy search (Algorithm 1, SPEC §2), several seeds' explorations in one batch.

Algorithm 1 pushes the seeds on a stack and pops one image at a time; for each it keeps a fresh
queue of transformations that raised coverage, and tries pairs ``T1`` (from the queue, else at
random) then ``T2`` (at random), each with a random parameter from its levels. A new image is
kept when it raises the neuron coverage (NC, DeepTest form) of everything seen so far; then
``T1`` and ``T2`` join the queue and the new image is pushed on the stack (depth-first). An image
is given up after ``max_failed_tries`` failed tries.

Here ``lanes`` such explorations run at once: lane ``i`` follows Algorithm 1 on its own stack,
taking the next seed when its stack is empty. Each round makes one try in every busy lane; the
candidates go through the model in one forward pass on its device and are judged in lane order
against the shared coverage, as if they had been tried one after another. A candidate raises
coverage exactly when it is the first of the round to cover some neuron not covered before the
round (a candidate whose new neurons an earlier candidate already covered adds nothing, so only
the kept ones matter), so the judgement is a cumulative sum over a ``(lanes, neurons)`` boolean
mask and one host sync per round. With ``lanes=1`` it is Algorithm 1 exactly.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from dlguard._validation import check_images, optional_positive_int, positive_int, probability
from dlguard.augment.properties import Property, check_properties
from dlguard.data.failure_bank import FailureBank
from dlguard.metrics.functional.coverage import scaled_neuron_values
from dlguard.metrics.functional.metamorphic import MetamorphicRelation, check_outputs, squared_errors
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.capture import capture_activations
from dlguard.probes.evaluation import evaluation
from dlguard.probes.layers import LayerSpec
from dlguard.probes.neurons import neuron_layers, neuron_output

__all__ = ["SearchResult", "coverage_guided_search", "first_increments", "search_violations"]

_SEED_BATCH = 256  # seeds per forward pass of the initial coverage
_KEY_RANGE = 2**62  # keyed properties' keys, as dlguard._random.content_keys makes them


@dataclass
class SearchResult:
    """What one coverage-guided search kept, in the order it kept them (``M`` images).

    Attributes:
        images: ``(M, C, H, W)`` the generated images, each of which raised coverage, on the CPU.
        source: ``(M,)`` long: index of the seed each image descends from.
        transformations: ``M`` names ``"T1+T2"`` (``T1`` applied first) that made each image from
            its parent (the seed or an earlier kept image).
        parameters: ``(M, 2)`` float: the levels ``P1``, ``P2`` of ``T1`` and ``T2``.
        coverage_seeds: NC of the seeds alone.
        coverage: NC after the search (seeds and kept images).
        history: NC after each kept image (``M`` values, strictly increasing).
        outputs: ``(M, ...)`` the model's outputs on the kept images (after ``output_transform``), on the CPU.
        tries: candidates evaluated (forward passes' rows after the seeds').
    """

    images: Tensor
    source: Tensor
    transformations: list[str]
    parameters: Tensor
    coverage_seeds: float
    coverage: float
    history: list[float]
    outputs: Tensor
    tries: int


@dataclass
class _Lane:
    """One depth-first exploration: its image under test, that image's queue and failures, its own stack."""

    image: Tensor | None = None
    source: int = -1
    queue: deque[int] = field(default_factory=deque)
    failures: int = 0
    stack: list[tuple[Tensor, int]] = field(default_factory=list)


def _coverage_masks(records: dict[str, list[Tensor]], layers: dict[str, nn.Module], threshold: float) -> Tensor:
    """``(B, N)`` neurons whose DeepTest-scaled value exceeds ``threshold``, per input, over all layers in order."""
    masks = []
    for name, outputs in records.items():
        masks.append(scaled_neuron_values(neuron_output(layers[name], outputs[0])) > threshold)
        outputs.clear()
    return torch.cat(masks, dim=1)


def first_increments(masks: Tensor, covered: Tensor) -> Tensor:
    """The neurons each candidate adds to ``covered`` when candidates are judged one after another in row order.

    Row ``i`` holds the neurons candidate ``i`` covers that neither ``covered`` nor any earlier row
    does. A candidate raises coverage exactly when its row is not empty: a neuron new to it but
    covered by an earlier candidate was covered by a *kept* one (a rejected candidate's new neurons
    were all covered before it), so keeping only the raising candidates leaves the same answer.

    Args:
        masks: ``(L, N)`` boolean, the neurons each candidate covers.
        covered: ``(N,)`` boolean, the neurons covered before the first candidate.

    Example:
        >>> import torch
        >>> masks = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)
        >>> first_increments(masks, torch.tensor([True, False, False, False])).int().tolist()
        [[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1]]
    """
    new = masks & ~covered
    return new & (new.cumsum(dim=0, dtype=torch.int32) == 1)


def _apply(
    transformations: list[Property], images: Tensor, chosen: list[int], levels: list[float], keys: Tensor
) -> Tensor:
    """Row ``r`` of ``images`` transformed by ``transformations[chosen[r]]`` at ``levels[r]``: one call per property."""
    out: Tensor | None = None
    for index in sorted(set(chosen)):
        prop = transformations[index]
        rows = [r for r, c in enumerate(chosen) if c == index]
        level = torch.tensor([levels[r] for r in rows], dtype=torch.float64)
        if len(rows) == len(chosen):  # one property for the whole batch
            return prop(images, level, keys) if prop.keyed else prop(images, level)
        where = torch.tensor(rows, device=images.device)
        part = prop(images[where], level, keys[rows]) if prop.keyed else prop(images[where], level)
        if out is None:
            out = torch.empty_like(images)
        out[where] = part.to(images.dtype)
    assert out is not None
    return out


def _pick(count: int, draw: float) -> int:
    """An index in ``[0, count)`` from a uniform draw in ``[0, 1)``."""
    return min(int(draw * count), count - 1)


def _take_work(workers: list[_Lane], pending: list[int], seeds: Tensor) -> list[_Lane]:
    """The lanes with an image to try, in lane order; an idle lane pops its own stack, else the next seed."""
    busy = []
    for lane in workers:
        if lane.image is None:
            if lane.stack:
                lane.image, lane.source = lane.stack.pop()
            elif pending:
                lane.source = pending.pop()
                lane.image = seeds[lane.source]
            else:
                continue
            lane.queue.clear()
            lane.failures = 0
        busy.append(lane)
    return busy


def _draw_tries(
    busy: list[_Lane], props: list[Property], generator: torch.Generator
) -> tuple[list[tuple[int, float]], list[tuple[int, float]], Tensor]:
    """Each busy lane's ``(T1, P1)`` and ``(T2, P2)``, and ``(L, 2)`` keys for keyed properties."""
    draws = torch.rand(len(busy), 4, generator=generator, dtype=torch.float64).tolist()
    keys = torch.randint(_KEY_RANGE, (len(busy), 2), generator=generator)
    first, second = [], []
    for lane, (t1, p1, t2, p2) in zip(busy, draws, strict=True):
        one = lane.queue.popleft() if lane.queue else _pick(len(props), t1)
        two = _pick(len(props), t2)
        first.append((one, props[one].levels[_pick(len(props[one].levels), p1)]))
        second.append((two, props[two].levels[_pick(len(props[two].levels), p2)]))
    return first, second, keys


def coverage_guided_search(
    model: nn.Module | ModelAdapter,
    seeds: Tensor,
    properties: Sequence[Property],
    *,
    layers: LayerSpec | str = "auto",
    threshold: float = 0.2,
    max_failed_tries: int = 3,
    max_images: int | None = None,
    lanes: int = 16,
    seed: int = 0,
    preprocess: Callable[[Tensor], Tensor] | None = None,
    output_transform: Callable[[Any], Tensor] | None = None,
) -> SearchResult:
    """Algorithm 1 of DeepTest: stacked pairs of transformations kept only when they raise neuron coverage.

    Depth-first over the seeds: the seeds are pushed on a stack so that seed 0 is popped first; a
    popped image gets a fresh queue and tries ``T1`` (dequeued, or drawn at random when the queue is
    empty) at a random level ``P1``, then ``T2`` (at random) at a random level ``P2``. The new image
    is kept when it raises NC over the seeds and every image kept so far (DeepTest form: each
    layer's output min-max scaled per input, a neuron covered once its value exceeds ``threshold``,
    :func:`~dlguard.metrics.functional.coverage.scaled_neuron_values`); then ``T1`` and ``T2`` are
    enqueued and the new image is pushed. Failures are counted over the popped image's whole
    exploration (successes do not reset them, as in the paper) and the image is given up after
    ``max_failed_tries`` of them: the paper's loop ``while numFailedTries <= maxFailedTries`` allows
    ``maxFailedTries + 1``, so its ``maxFailedTries = m`` is ``max_failed_tries = m + 1`` here.

    ``lanes`` explorations run at once, lane ``i`` on its own stack, taking the next seed when the
    stack is empty (lanes in index order); each round's candidates go through the model in one
    forward pass on its device and are judged in lane order against the shared coverage, exactly as
    if tried one after another (:func:`first_increments`), so the result depends on ``seed`` and
    ``lanes`` only, never on timing. ``lanes=1`` is Algorithm 1 exactly. Random draws come from a
    ``torch.Generator`` seeded with ``seed``, per round and lane in lane order: four uniforms
    (``T1``, ``P1``, ``T2``, ``P2``; the first unused when ``T1`` comes from the queue) and two
    keys for keyed properties (fog, rain). The model runs in eval mode without gradients and is
    left exactly as found.

    Args:
        model: the network (logits or predictions), or a :class:`~dlguard.probes.ModelAdapter`.
        seeds: ``(N, C, H, W)`` seed images in ``[0, 1]``.
        properties: the transformations, :class:`~dlguard.augment.Property` objects to combine,
            distinct names (e.g. :func:`~dlguard.augment.properties.deeptest_properties`).
        layers: ``"auto"`` (dense, convolution and recurrent layers) or the layers coverage counts.
        threshold: NC's threshold on scaled values, in ``[0, 1]``.
        max_failed_tries: failed tries after which an image is given up, at least 1.
        max_images: stop once this many images are kept (``None``: when every stack is empty).
        lanes: explorations evaluated together, at least 1.
        seed: seed of the random draws.
        preprocess: applied to pixels before the model (only with an ``nn.Module``).
        output_transform: maps the model's output to a tensor ``(B, ...)`` (only with an ``nn.Module``).

    Returns:
        A :class:`SearchResult`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from dlguard.augment.properties import deeptest_properties
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 32))
        >>> seeds = torch.zeros(4, 1, 8, 8)
        >>> seeds[:, :, 2:5, 3:6] = torch.linspace(0.3, 0.9, 4).view(4, 1, 1, 1)  # a square, four brightnesses
        >>> result = coverage_guided_search(net, seeds, deeptest_properties()[:6], threshold=0.5, lanes=4)
        >>> round(result.coverage_seeds, 3), round(result.coverage, 3), len(result.images), result.tries
        (0.625, 0.875, 8, 44)
        >>> result.transformations[:3], result.source.tolist()
        (['brightness+shear', 'shear+shear', 'contrast+contrast'], [0, 3, 1, 2, 3, 0, 3, 3])
    """
    adapter = ModelAdapter.wrap(model, preprocess, output_transform)
    check_images(seeds, "seeds")
    if len(seeds) == 0:
        raise ValueError("seeds: expected at least one seed image, got none")
    props = check_properties(properties)
    probability("threshold", threshold)
    positive_int("max_failed_tries", max_failed_tries)
    optional_positive_int("max_images", max_images)
    positive_int("lanes", lanes)
    positive_int("seed", seed, minimum=0)
    selected = neuron_layers(adapter.model, layers)

    device = adapter.device
    seeds = seeds.to(device)
    generator = torch.Generator().manual_seed(seed)
    kept_images: list[Tensor] = []
    kept_outputs: list[Tensor] = []
    sources: list[int] = []
    names: list[str] = []
    parameters: list[tuple[float, float]] = []
    history: list[float] = []
    tries = 0
    with evaluation(adapter.model), torch.no_grad(), capture_activations(adapter.model, selected) as records:
        covered: Tensor | None = None
        for part in seeds.split(_SEED_BATCH):
            outputs = adapter(part)
            if not isinstance(outputs, Tensor) or outputs.ndim < 1 or len(outputs) != len(part):
                shape = tuple(outputs.shape) if isinstance(outputs, Tensor) else type(outputs).__name__
                raise ValueError(
                    f"output_transform: expected the model's output as a tensor ({len(part)}, ...), got {shape}; "
                    "pass output_transform= to map it to one"
                )
            no_outputs = outputs[:0]
            hit = _coverage_masks(records, selected, threshold).any(dim=0)
            covered = hit if covered is None else covered | hit
        assert covered is not None
        total = covered.numel()
        count = int(covered.sum())
        coverage_seeds = count / total

        pending = list(range(len(seeds) - 1, -1, -1))  # the seed stack: seed 0 on top
        workers = [_Lane() for _ in range(lanes)]
        while max_images is None or len(sources) < max_images:
            busy = _take_work(workers, pending, seeds)
            if not busy:
                break
            first, second, keys = _draw_tries(busy, props, generator)
            images = torch.stack([lane.image for lane in busy if lane.image is not None])
            middle = _apply(props, images, [t for t, _ in first], [p for _, p in first], keys[:, 0])
            candidates = _apply(props, middle, [t for t, _ in second], [p for _, p in second], keys[:, 1])
            outputs = adapter(candidates)
            tries += len(busy)
            added = first_increments(_coverage_masks(records, selected, threshold), covered)
            gains = added.sum(dim=1).tolist()  # the round's one host sync
            kept_rows: list[int] = []
            for row, (lane, gain) in enumerate(zip(busy, gains, strict=True)):
                if gain and (max_images is None or len(sources) < max_images):
                    count += gain
                    kept_rows.append(row)
                    sources.append(lane.source)
                    names.append(f"{props[first[row][0]].name}+{props[second[row][0]].name}")
                    parameters.append((first[row][1], second[row][1]))
                    history.append(count / total)
                    lane.queue.extend((first[row][0], second[row][0]))
                else:
                    lane.failures += 1
                    if lane.failures >= max_failed_tries:
                        lane.image = None
            if kept_rows:
                chosen = torch.tensor(kept_rows, device=candidates.device)
                covered = covered | added[: kept_rows[-1] + 1].any(dim=0)
                kept_images.append(candidates[chosen])
                kept_outputs.append(outputs[chosen])
                for image, row in zip(kept_images[-1], kept_rows, strict=True):
                    busy[row].stack.append((image, busy[row].source))

    shape = tuple(seeds.shape[1:])
    if not kept_images:
        advice = (
            "a higher threshold leaves room to grow"
            if coverage_seeds >= 0.9
            else "more tries (max_failed_tries) or other transformations may find some"
        )
        warnings.warn(
            f"coverage_guided_search kept no image in {tries} tries: the seeds cover {coverage_seeds:.0%} of the "
            f"neurons at threshold={threshold}; {advice}",
            stacklevel=2,
        )
    return SearchResult(
        images=torch.cat(kept_images).cpu() if kept_images else seeds.new_zeros((0, *shape)).cpu(),
        source=torch.tensor(sources, dtype=torch.long),
        transformations=names,
        parameters=torch.tensor(parameters, dtype=torch.float32).reshape(-1, 2),
        coverage_seeds=coverage_seeds,
        coverage=count / total,
        history=history,
        outputs=torch.cat(kept_outputs).cpu() if kept_outputs else no_outputs.cpu(),
        tries=tries,
    )


def search_violations(
    result: SearchResult,
    relation: MetamorphicRelation,
    seed_outputs: Tensor,
    seed_target: Tensor | None = None,
    mse_orig: float | Tensor | None = None,
    bank: FailureBank | None = None,
) -> Tensor:
    """Which images of a search violate ``relation`` against their seeds; with ``bank``, deposit them.

    Classification: the label predicted on a kept image differs from the one predicted on its seed.
    Regression (eq. 2): ``(ŷ − y_seed)² > λ·MSE_orig`` with ``y_seed`` the seed's true value and
    ``MSE_orig`` the model's MSE on the seeds (computed from ``seed_outputs`` when not given). The
    eq. 3 filter does not apply to search outputs (compositions). Violating images go into ``bank``
    under origin ``"guided"`` with their seed's label (for steering, its true angle: the oracle).

    Args:
        result: a :func:`coverage_guided_search` result.
        relation: the :class:`~dlguard.metrics.functional.MetamorphicRelation` to check.
        seed_outputs: ``(N, ...)`` the model's outputs on the search's seeds.
        seed_target: ``(N,)`` the seeds' labels (classification: deposited labels) or true values (regression).
        mse_orig: ``MSE_orig`` for regression, or ``None``.
        bank: a :class:`~dlguard.data.FailureBank`, or ``None``.

    Returns:
        ``(M,)`` bool, on the CPU.

    Example:
        >>> import torch
        >>> from dlguard.augment import deeptest_properties
        >>> from dlguard.metrics.functional import MetamorphicRelation
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        ...                           torch.nn.Linear(4 * 6 * 6, 1))
        >>> seeds = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
        >>> angles = torch.zeros(6)
        >>> result = coverage_guided_search(net, seeds, deeptest_properties()[:6], threshold=0.7, lanes=2)
        >>> with torch.no_grad():
        ...     seed_outputs = net(seeds).squeeze(1)
        >>> flags = search_violations(result, MetamorphicRelation("regression", lam=1.0), seed_outputs, angles)
        >>> flags.shape == (len(result.images),), flags.dtype
        (True, torch.bool)
    """
    if not isinstance(result, SearchResult):
        raise ValueError(f"result: expected a SearchResult, got {type(result).__name__}")
    if not isinstance(relation, MetamorphicRelation):
        raise ValueError(f"relation: expected a MetamorphicRelation, got {type(relation).__name__}")
    if bank is not None and not isinstance(bank, FailureBank):
        raise ValueError(f"bank: expected a FailureBank or None, got {type(bank).__name__}")
    seeds = check_outputs(relation.task, seed_outputs.detach().cpu(), "seed_outputs")
    if relation.task == "regression" and seed_target is None:
        raise ValueError("seed_target: the regression relation needs the seeds' true values")
    if len(result.images) == 0:
        return torch.zeros(0, dtype=torch.bool)
    rows = result.source
    target = None if seed_target is None else seed_target.detach().cpu().reshape(len(seeds), *seed_target.shape[1:])
    if relation.task == "regression":
        assert target is not None
        target = target.reshape(len(seeds)).to(seeds.dtype)
        if mse_orig is None:
            mse_orig = squared_errors(seeds, target).mean()
        violated = relation.violations(seeds[rows], result.outputs, target[rows], mse_orig)
    else:
        violated = relation.violations(seeds[rows], result.outputs)
    violated = violated.cpu()
    if bank is not None and bool(violated.any()):
        labels = seeds[rows].argmax(1) if target is None else target[rows]
        bank.add(result.images[violated], labels[violated], origin="guided")
    return violated
