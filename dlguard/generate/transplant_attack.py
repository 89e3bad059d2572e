r"""The guided transplant attack (SPEC §3, papers/001_…): object relevancy picks the images to transplant.

For a class pair ``(y, y')``, an attempt takes a correctly classified *background* image ``x₁`` of class
``y`` and a correctly classified object *donor* ``x₂`` of class ``y'``, and synthesises ``x₁`` with its
own object replaced by ``x₂``'s (:func:`~dlguard.augment.functional.transplant`: the scene's object
inpainted away, the donor's object scaled into its box). Two scenarios, two ways to succeed:

- **scenario 1** (the image shows a ``y'`` object, the model should say ``y'``): success when the top-1
  prediction is *not* the donor's class ``y'``;
- **scenario 2** (the image shows no ``y`` object, the model should not say ``y``): success when the top-1
  prediction *is* the background's class ``y``.

**Selection.** ``strategy="guided"`` follows the object-relevancy scores: backgrounds sorted by lowest
removing score ``S⁻`` (removing their object barely changes the inference: the background drives it),
donors by lowest preserving score ``S⁺`` (moving their object elsewhere changes the inference: the object
is ignored), in both scenarios. The paper "selects starting from the image with the lowest score" in
each sorted list without saying how the two lists combine; here attempt ``t`` walks the grid of
(``i``-th lowest-``S⁻`` background, ``j``-th lowest-``S⁺`` donor) in order of increasing ``i + j``, ties
by ``i`` -- ``(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0), …`` -- so the first attempt pairs the two
lowest scores and no combination repeats. Equal scores keep the images' order.

``strategy="random"`` is the baseline over the same budget: combinations drawn uniformly among the same
candidates, without repeating one while any is left, from a generator seeded by ``(seed, y, y')``, so a
pair's draws do not depend on which other pairs run with it.

Each pair gets ``min(budget, n_y · n_y')`` attempts (``n_c`` correctly classified images of class ``c``,
as ``scores.correct`` records them). The synthesised images of all pairs are built and classified in
batches of at most ``max_batch``; the model runs in eval mode without gradients and is left exactly as
found (SPEC §0).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import torch
from torch import Tensor, nn

from dlguard._validation import check_images, check_labels, one_of, positive_int
from dlguard.augment.functional.object_mutations import transplant
from dlguard.metrics.functional.object_relevancy import ObjectRelevancyScores
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

__all__ = ["TRANSPLANT_STRATEGIES", "TransplantAttackResult", "transplant_attack"]

TRANSPLANT_STRATEGIES: tuple[str, ...] = ("guided", "random")
"""How backgrounds and donors are chosen: by object-relevancy scores, or uniformly at random (the baseline)."""

_RANDOM_PERMUTATION_LIMIT = 1 << 20  # grids up to this many cells draw a permutation; larger ones reject repeats


@dataclass
class TransplantAttackResult:
    """What a transplant attack found, per class pair (all tensors on the CPU).

    Attributes:
        pairs: ``(P, 2)`` long, the class pairs ``(y, y')``: background class, donor class.
        successes: ``(P,)`` long, successful attempts per pair.
        attempts: ``(P,)`` long, attempts per pair: ``min(budget, n_y · n_y')``.
        first_success: ``(P,)`` long, index of the first successful attempt of each pair; ``-1`` if none.
        sources: ``(P, budget, 2)`` long, the (background, donor) image indices of each attempt in the
            order tried; ``-1`` past a pair's attempts.
        predictions: ``(P, budget)`` long, the model's top-1 prediction on each attempt's image; ``-1``
            past a pair's attempts.
        examples: ``(E, C, H, W)`` up to ``keep`` successful synthesised images: the first successes of
            every pair first (attempt 0 of each pair, then attempt 1, …).
        example_predictions: ``(E,)`` long, the model's top-1 prediction on each example.
        example_sources: ``(E, 2)`` long, each example's (background, donor) image indices.
        scenario: the scenario (1 or 2).
        strategy: ``"guided"`` or ``"random"``.
    """

    pairs: Tensor
    successes: Tensor
    attempts: Tensor
    first_success: Tensor
    sources: Tensor
    predictions: Tensor
    examples: Tensor
    example_predictions: Tensor
    example_sources: Tensor
    scenario: int
    strategy: str

    @property
    def total(self) -> int:
        """Successful attempts over all pairs."""
        return int(self.successes.sum())

    @property
    def success_rate(self) -> float:
        """Successful attempts over all attempts (0 when there were none)."""
        count = int(self.attempts.sum())
        return self.total / count if count else 0.0


# --- validation ---------------------------------------------------------------------------------------------


def _check_masks(masks: object, images: Tensor) -> Tensor:
    expected = (images.shape[0], *images.shape[2:])
    if not isinstance(masks, Tensor) or masks.dtype != torch.bool or tuple(masks.shape) != expected:
        got = f"{masks.dtype} {tuple(masks.shape)}" if isinstance(masks, Tensor) else type(masks).__name__
        raise ValueError(f"masks: expected a bool tensor (N, H, W) = {expected} matching the images, got {got}")
    empty = (~masks.flatten(1).any(1)).nonzero().flatten()
    if len(empty):
        raise ValueError(f"masks: the mask of image {int(empty[0])} is empty (no object); {len(empty)} empty in all")
    return masks


def _check_scores(scores: object, count: int) -> tuple[Tensor, Tensor, Tensor]:
    """``S⁺``, ``S⁻`` (float64) and ``correct`` (bool) of the ``count`` images, on the CPU."""
    if not isinstance(scores, ObjectRelevancyScores):
        raise ValueError(f"scores: expected ObjectRelevancyScores of the images, got {type(scores).__name__}")
    fields = []
    for name in ("preserving", "removing", "correct"):
        value = getattr(scores, name)
        if not isinstance(value, Tensor) or tuple(value.shape) != (count,):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"scores: expected {name} of shape ({count},) (one per image), got {shape}")
        fields.append(value.detach().cpu())
    preserving, removing, correct = fields
    for name, value in (("preserving", preserving), ("removing", removing)):
        if not value.is_floating_point() or torch.isnan(value).any():
            raise ValueError(f"scores: expected {name} as floating values without NaN")
    return preserving.double(), removing.double(), correct.bool()


def _check_pairs(pairs: Tensor | Sequence[Sequence[int]] | None, available: list[int]) -> Tensor:
    """The ``(P, 2)`` class pairs; default every ordered pair of distinct classes with candidates."""
    if pairs is None:
        if len(available) < 2:
            raise ValueError(
                f"pairs: none given, and only classes {available} have correctly classified images "
                "(scores.correct); an attack needs two classes"
            )
        return torch.tensor([(y, z) for y in available for z in available if y != z], dtype=torch.long)
    if not isinstance(pairs, Tensor):
        try:
            pairs = torch.as_tensor(pairs)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"pairs: expected (P, 2) integer class pairs, got {type(pairs).__name__}") from None
    if pairs.ndim != 2 or pairs.shape[1] != 2 or len(pairs) == 0 or pairs.is_floating_point() or pairs.is_complex():
        raise ValueError(f"pairs: expected (P, 2) integer class pairs, P >= 1, got {pairs.dtype} {tuple(pairs.shape)}")
    if pairs.dtype == torch.bool:
        raise ValueError("pairs: expected integer class pairs, got bool")
    pairs = pairs.detach().cpu().long()
    for background, donor in pairs.tolist():
        if background == donor:
            raise ValueError(f"pairs: pair ({background}, {donor}) has equal classes; a transplant needs two")
        for role, label in (("background", background), ("donor", donor)):
            if label not in available:
                raise ValueError(
                    f"pairs: {role} class {label} of pair ({background}, {donor}) has no correctly classified "
                    f"image (scores.correct); classes with candidates: {available}"
                )
    return pairs


# --- selection ----------------------------------------------------------------------------------------------


def _guided_cells(rows: int, cols: int, count: int) -> Tensor:
    """The first ``count`` cells ``(i, j)`` of a ``rows × cols`` grid by increasing ``i + j``, ties by ``i``."""
    cells: list[tuple[int, int]] = []
    for total in range(rows + cols - 1):
        for i in range(max(0, total - cols + 1), min(total, rows - 1) + 1):
            cells.append((i, total - i))
            if len(cells) == count:
                return torch.tensor(cells, dtype=torch.long)
    return torch.tensor(cells, dtype=torch.long).view(-1, 2)


def _pair_generator(seed: int, background: int, donor: int) -> torch.Generator:
    digest = hashlib.blake2b(f"transplant/{seed}/{background}/{donor}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def _random_cells(rows: int, cols: int, count: int, generator: torch.Generator) -> Tensor:
    """``count`` distinct cells of a ``rows × cols`` grid drawn uniformly, in the order drawn."""
    size = rows * cols
    if size <= _RANDOM_PERMUTATION_LIMIT:
        flat = torch.randperm(size, generator=generator)[:count]
    else:  # a huge grid and a small budget: draw with rejection of repeats
        chosen: dict[int, None] = {}
        while len(chosen) < count:
            for cell in torch.randint(size, (2 * (count - len(chosen)),), generator=generator).tolist():
                chosen.setdefault(cell)
                if len(chosen) == count:
                    break
        flat = torch.tensor(list(chosen), dtype=torch.long)
    return torch.stack((flat // cols, flat % cols), dim=1)


def _attempt_sources(
    pairs: Tensor,
    target: Tensor,
    correct: Tensor,
    preserving: Tensor,
    removing: Tensor,
    strategy: str,
    budget: int,
    seed: int,
) -> Tensor:
    """``(P, budget, 2)`` (background, donor) image indices of every attempt, ``-1`` past a pair's attempts."""
    sources = torch.full((len(pairs), budget, 2), -1, dtype=torch.long)
    for p, (background_class, donor_class) in enumerate(pairs.tolist()):
        backgrounds = ((target == background_class) & correct).nonzero().flatten()
        donors = ((target == donor_class) & correct).nonzero().flatten()
        count = min(budget, len(backgrounds) * len(donors))
        if strategy == "guided":
            backgrounds = backgrounds[torch.sort(removing[backgrounds], stable=True).indices]
            donors = donors[torch.sort(preserving[donors], stable=True).indices]
            cells = _guided_cells(len(backgrounds), len(donors), count)
        else:
            generator = _pair_generator(seed, background_class, donor_class)
            cells = _random_cells(len(backgrounds), len(donors), count, generator)
        sources[p, :count, 0] = backgrounds[cells[:, 0]]
        sources[p, :count, 1] = donors[cells[:, 1]]
    return sources


# --- the attack ---------------------------------------------------------------------------------------------


def _succeeded(predicted: Tensor, background_class: Tensor, donor_class: Tensor, scenario: int) -> Tensor:
    """Scenario 1: the prediction is not the donor's class; scenario 2: it is the background's class."""
    return predicted != donor_class if scenario == 1 else predicted == background_class


def transplant_attack(
    model: nn.Module | ModelAdapter,
    images: Tensor,
    target: Tensor,
    masks: Tensor,
    scores: ObjectRelevancyScores,
    *,
    scenario: int,
    strategy: str = "guided",
    pairs: Tensor | Sequence[Sequence[int]] | None = None,
    budget: int = 100,
    seed: int = 0,
    max_batch: int = 1024,
    keep: int = 16,
) -> TransplantAttackResult:
    """Transplant attack on a classifier: ``budget`` synthesised images per class pair, guided or random.

    Pair ``(y, y')`` puts the object of a correctly classified ``y'`` image (the donor) in place of the
    object of a correctly classified ``y`` image (the background); scenario 1 succeeds when the model
    does not predict ``y'``, scenario 2 when it predicts ``y``. ``"guided"`` tries the backgrounds of
    lowest ``S⁻`` with the donors of lowest ``S⁺`` first (grid order by ``i + j``, see the module);
    ``"random"`` draws distinct combinations of the same candidates, seeded.

    Args:
        model: the classifier (an ``nn.Module`` returning logits, or a
            :class:`~dlguard.probes.ModelAdapter` with ``preprocess``/``output_transform``).
        images: ``(N, C, H, W)`` the candidate images in ``[0, 1]``, ``C`` in ``{1, 3}``.
        target: ``(N,)`` their labels.
        masks: ``(N, H, W)`` bool masks of their objects, none empty.
        scores: the object-relevancy scores of these ``N`` images under this model (e.g.
            :func:`~dlguard.generate.object_relevancy_test`'s ``scores``); ``correct`` picks the candidates,
            ``removing`` (``S⁻``) orders the backgrounds and ``preserving`` (``S⁺``) the donors.
        scenario: ``1`` (success: prediction ``≠ y'``) or ``2`` (success: prediction ``= y``).
        strategy: ``"guided"`` or ``"random"``.
        pairs: ``(P, 2)`` class pairs ``(y, y')`` (background class, donor class); default every ordered
            pair of distinct classes that have correctly classified images. A given pair with equal classes
            or a class without correctly classified images raises.
        budget: attempts per pair (fewer when the pair has fewer combinations).
        seed: seed of the random strategy (the guided one does not draw).
        max_batch: synthesised images per transplant batch and forward pass.
        keep: how many successful synthesised images to return as examples.

    Returns:
        A :class:`TransplantAttackResult`.

    Raises:
        ValueError: naming the argument, before any work, for a bad ``scenario``, ``strategy``, ``budget``,
            ``seed``, ``max_batch``, ``keep``, ``images``, ``target``, ``masks``, ``scores`` or ``pairs``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from dlguard.augment import object_follow_ups
        >>> from dlguard.generate.object_relevancy import object_relevancy_test
        >>> _ = torch.manual_seed(0)
        >>> images = torch.zeros(4, 3, 16, 16)
        >>> images[:2, 0], images[2:, 2] = 0.8, 0.8  # class 0 on red, class 1 on blue backgrounds
        >>> masks = torch.zeros(4, 16, 16, dtype=torch.bool)
        >>> masks[:, 5:11, 6:10] = True
        >>> images[masks[:, None].expand(-1, 3, -1, -1)] = 1.0  # white objects
        >>> target = torch.tensor([0, 0, 1, 1])
        >>> reads_background = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 2))
        >>> with torch.no_grad():  # logit 0: red minus blue, logit 1: blue minus red
        ...     _ = reads_background[2].weight.copy_(torch.tensor([[8.0, 0, -8], [-8, 0, 8]]))
        ...     _ = reads_background[2].bias.zero_()
        >>> follow_ups = object_follow_ups(images, masks, torch.rand(2, 3, 16, 16), workers=1)
        >>> scores = object_relevancy_test(reads_background, images, target, follow_ups).scores
        >>> result = transplant_attack(reads_background, images, target, masks, scores, scenario=2, budget=3)
        >>> result.pairs.tolist(), result.successes.tolist(), result.attempts.tolist(), result.total
        ([[0, 1], [1, 0]], [3, 3], [3, 3], 6)
    """
    adapter = ModelAdapter.wrap(model)
    scenario = one_of("scenario", scenario, (1, 2))
    strategy = one_of("strategy", strategy, TRANSPLANT_STRATEGIES)
    budget = positive_int("budget", budget)
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    max_batch = positive_int("max_batch", max_batch)
    keep = positive_int("keep", keep, minimum=0)
    check_images(images)
    if images.shape[1] not in (1, 3):
        raise ValueError(f"images: expected 1 or 3 channels, got shape {tuple(images.shape)}")
    count = images.shape[0]
    target = check_labels("target", target, count).detach().cpu().long()
    masks = _check_masks(masks, images).to(images.device)
    preserving, removing, correct = _check_scores(scores, count)
    available = sorted(set(target[correct].tolist()))
    pairs = _check_pairs(pairs, available)

    sources = _attempt_sources(pairs, target, correct, preserving, removing, strategy, budget, int(seed))
    attempts = (sources[:, :, 0] >= 0).sum(1)
    predictions = torch.full((len(pairs), budget), -1, dtype=torch.long)
    # attempt 0 of every pair, then attempt 1, ...: the kept examples spread over the pairs
    order = (sources[:, :, 0] >= 0).t().nonzero()  # (attempt, pair) rows
    work_pair, work_attempt = order[:, 1], order[:, 0]
    kept: list[tuple[Tensor, Tensor, Tensor]] = []
    kept_count = 0
    device = images.device
    with evaluation(adapter.model), torch.no_grad():
        for begin in range(0, len(order), max_batch):
            pair, attempt = work_pair[begin : begin + max_batch], work_attempt[begin : begin + max_batch]
            chosen = sources[pair, attempt]  # (b, 2) background, donor
            background, donor = chosen[:, 0].to(device), chosen[:, 1].to(device)
            synthesised = transplant(images[donor], masks[donor], images[background], masks[background])
            predicted = adapter.logits(synthesised, max_batch=max_batch).argmax(1).cpu()
            predictions[pair, attempt] = predicted
            hit = _succeeded(predicted, pairs[pair, 0], pairs[pair, 1], scenario)
            if kept_count < keep and bool(hit.any()):
                index = hit.nonzero().flatten()[: keep - kept_count]
                kept.append((synthesised[index].cpu(), predicted[index], chosen[index]))
                kept_count += len(index)

    success = (sources[:, :, 0] >= 0) & _succeeded(predictions, pairs[:, :1], pairs[:, 1:], scenario)
    first = torch.where(success.any(1), success.int().argmax(1), torch.full((len(pairs),), -1))
    if kept:
        examples, example_predictions, example_sources = (torch.cat(parts) for parts in zip(*kept, strict=True))
    else:
        examples = torch.zeros(0, *images.shape[1:], dtype=torch.float32)
        example_predictions = torch.zeros(0, dtype=torch.long)
        example_sources = torch.zeros(0, 2, dtype=torch.long)
    return TransplantAttackResult(
        pairs=pairs,
        successes=success.sum(1),
        attempts=attempts,
        first_success=first.long(),
        sources=sources,
        predictions=predictions,
        examples=examples,
        example_predictions=example_predictions,
        example_sources=example_sources,
        scenario=int(scenario),
        strategy=strategy,
    )
