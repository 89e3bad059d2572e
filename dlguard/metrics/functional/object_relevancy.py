r"""Object relevancy (SPEC §3, papers/001_…): is an inference made from the object, or from its background?

A source input ``x`` (label ``y``) gets follow-ups from *object-preserving* mutations (the object
moved onto other backgrounds, blended into them, the background grayed) and *object-removing*
mutations (the object filled with colours, inpainted, filled with its margin's statistics). An
inference that relies on the object changes little under the first and much under the second.

Classification, with ``p = P(y|x)`` and the rank ``r ∈ 1..K`` of ``y`` (1 = top), and ``p'``, ``r'``
on a follow-up:

- preserving score ``s⁺ = (1 − |p − p'|)·(1 − |r' − r|/(K − 1))`` (1 = inference unchanged);
- removing score ``s⁻ = 1 − (1 − max(p − p', 0)/p)·(1 − max(r' − r, 0)/(K − r))`` (1 = probability
  gone or label pushed to the last rank; the second factor is 1 when ``r = K``).

Detection: a record ``(box, label, score)`` is matched to its *associated object*, the ground-truth
object of the same label with the highest IoU; in a follow-up the record compared is the detection
of the same label with the highest IoU with that object (none: IoU 0); with
``u = clip(IoU(follow-up record, object)/IoU(record, object), 0, 1)``, ``s⁺ = u`` and ``s⁻ = 1 − u``.

Weights: a follow-up of operation ``j`` of function ``i`` weighs ``w = 1/(n_i·M)`` (``n_i`` valid
operations of function ``i`` for this source, ``M`` functions of that type with at least one), so
every function counts equally; ``S⁺ = Σ w·s⁺``, ``S⁻ = Σ w·s⁻``, ``S = (S⁺ + S⁻)/2 ∈ [0, 1]``. An
inference is *unreliable* when it is correct, ``p ≥ p_high`` and ``S < s_low``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from dlguard._validation import check_labels, check_logits, check_tensor, positive_int, probability

__all__ = [
    "OBJECT_MUTATION_FUNCTIONS",
    "ObjectRelevancyScores",
    "class_probability_and_rank",
    "detection_relevancy",
    "object_relevancy",
    "preserving_score",
    "relevancy_weights",
    "removing_score",
    "unreliable",
]

OBJECT_MUTATION_FUNCTIONS: tuple[str, ...] = (
    "MoveObjectToBackground",
    "BlendObjectIntoBackground",
    "GrayBackground",
    "FillObjectWithColor",
    "InpaintObject",
    "FillObjectWithMarginStatistic",
)
"""SPEC §3's mutation functions, in the order their indices (``function``) refer to: 3 preserving, 3 removing."""


class ObjectRelevancyScores(NamedTuple):
    """Scores of ``R`` inferences (images, or detection records).

    Attributes:
        preserving: ``(R,)`` ``S⁺``.
        removing: ``(R,)`` ``S⁻``.
        score: ``(R,)`` object relevancy ``S = (S⁺ + S⁻)/2``.
        probability: ``(R,)`` the inference's confidence: ``p = P(y|x)``, or the detection's score.
        correct: ``(R,)`` whether the inference is correct (top-1 = label; detection: IoU with its object
            at least the threshold).
        per_function: ``(R, n_functions)`` mean ``s⁺`` (preserving functions) or ``s⁻`` (removing) of each
            function's valid follow-ups; NaN where a function has none.
        follow_up: ``(R, F)`` each follow-up's own score, ``s⁺`` for a preserving follow-up and ``s⁻`` for
            a removing one (NaN where the follow-up does not exist); ``None`` when not recorded.
    """

    preserving: Tensor
    removing: Tensor
    score: Tensor
    probability: Tensor
    correct: Tensor
    per_function: Tensor
    follow_up: Tensor | None = None


def class_probability_and_rank(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """``P(y|x)`` (softmax) and the rank ``r ∈ 1..K`` of ``y`` (1 + classes with a strictly larger logit).

    ``logits`` is ``(..., K)`` and ``target`` broadcasts to its leading dimensions.

    Example:
        >>> import torch
        >>> p, r = class_probability_and_rank(torch.tensor([[2.0, 0.0, 1.0]]), torch.tensor([2]))
        >>> round(float(p), 4), int(r)
        (0.2447, 2)
    """
    target = target.long().unsqueeze(-1).expand(*logits.shape[:-1], 1)
    own = logits.gather(-1, target)
    probability = torch.softmax(logits.double(), dim=-1).gather(-1, target).squeeze(-1)
    rank = 1 + (logits > own).sum(-1)
    return probability, rank


def preserving_score(p: Tensor, r: Tensor, p_follow: Tensor, r_follow: Tensor, num_classes: int) -> Tensor:
    """``s⁺ = (1 − |p − p'|)·(1 − |r' − r|/(K − 1))``: 1 when the follow-up's inference is the source's.

    Example:
        >>> import torch
        >>> s = preserving_score(torch.tensor(0.9), torch.tensor(1), torch.tensor(0.6), torch.tensor(3), 10)
        >>> round(float(s), 4)  # (1 - 0.3) * (1 - 2/9)
        0.5444
    """
    positive_int("num_classes", num_classes, minimum=2)
    return (1 - (p - p_follow).abs()) * (1 - (r_follow - r).abs() / (num_classes - 1))


def removing_score(p: Tensor, r: Tensor, p_follow: Tensor, r_follow: Tensor, num_classes: int) -> Tensor:
    """``s⁻ = 1 − (1 − max(p − p', 0)/p)·(1 − max(r' − r, 0)/(K − r))``: 1 when the inference is gone.

    The rank factor is 1 when ``r = K`` (the label cannot fall further).

    Example:
        >>> import torch
        >>> s = removing_score(torch.tensor(0.8), torch.tensor(1), torch.tensor(0.2), torch.tensor(4), 10)
        >>> round(float(s), 4)  # 1 - (1 - 0.6/0.8) * (1 - 3/9)
        0.8333
    """
    positive_int("num_classes", num_classes, minimum=2)
    drop = 1 - (p - p_follow).clamp_min(0) / p.clamp_min(torch.finfo(p.dtype).tiny)
    room = (num_classes - r).clamp_min(1)
    fall = torch.where(r >= num_classes, torch.ones_like(drop), 1 - (r_follow - r).clamp_min(0) / room)
    return 1 - drop * fall


def _check_structure(function: Tensor, preserving: Tensor, valid: Tensor | None, rows: int) -> Tensor:
    """Validate the follow-ups' function indices, types and validity; the validity ``(R, F)``."""
    check_tensor("function", function)
    if function.ndim != 1 or function.is_floating_point() or (function.numel() and int(function.min()) < 0):
        raise ValueError(f"function: expected (F,) non-negative integer function indices, got {function}")
    count = function.numel()
    if not isinstance(preserving, Tensor) or preserving.dtype != torch.bool or preserving.shape != (count,):
        shape = tuple(preserving.shape) if isinstance(preserving, Tensor) else type(preserving).__name__
        raise ValueError(f"preserving: expected a bool tensor ({count},) (one flag per follow-up), got {shape}")
    for index in function.unique().tolist():
        kinds = preserving[function == index].unique()
        if len(kinds) > 1:
            raise ValueError(f"preserving: function {index} has follow-ups of both types; a function is one type")
    if valid is None:
        valid = torch.ones(rows, count, dtype=torch.bool, device=function.device)
    if not isinstance(valid, Tensor) or valid.dtype != torch.bool or valid.shape != (rows, count):
        shape = tuple(valid.shape) if isinstance(valid, Tensor) else type(valid).__name__
        raise ValueError(f"valid: expected a bool tensor ({rows}, {count}), got {shape}")
    for kind, name in ((True, "preserving"), (False, "removing")):
        has = (valid & (preserving == kind).to(valid.device)).any(1)
        if rows and not bool(has.all()):
            row = int((~has).nonzero()[0])
            raise ValueError(f"valid: input {row} has no valid {name} follow-up; S needs both types")
    return valid


def relevancy_weights(function: Tensor, valid: Tensor, preserving: Tensor) -> Tensor:
    """``w = 1/(n_i·M)`` per follow-up ``(R, F)``; 0 for invalid follow-ups.

    ``n_i`` counts the valid operations of function ``i`` for each row and ``M`` the functions of the
    follow-up's type with at least one valid operation, so each type's weights sum to 1 per row.

    Example:
        >>> import torch
        >>> function = torch.tensor([0, 0, 1, 2, 2, 2])
        >>> preserving = torch.tensor([True, True, True, False, False, False])
        >>> relevancy_weights(function, torch.ones(1, 6, dtype=torch.bool), preserving)
        tensor([[0.2500, 0.2500, 0.5000, 0.3333, 0.3333, 0.3333]])
    """
    valid = _check_structure(function, preserving, valid, valid.shape[0] if isinstance(valid, Tensor) else 0)
    function = function.to(valid.device)
    preserving = preserving.to(valid.device)
    one_hot = torch.nn.functional.one_hot(function, int(function.max()) + 1).to(torch.float64)  # (F, n)
    operations = valid.double() @ one_hot  # (R, n): valid operations n_i per function
    function_type = (one_hot.T @ preserving.double()) > 0  # (n,): a function's type
    present = operations > 0
    functions_of_type = torch.stack(
        [(present & function_type).sum(1), (present & ~function_type).sum(1)], dim=1
    ).double()  # (R, 2): M for preserving, removing
    m = torch.where(preserving, functions_of_type[:, :1], functions_of_type[:, 1:])  # (R, F)
    n = operations[:, function]  # (R, F)
    weights = valid.double() / (n * m).clamp_min(1)
    return weights.to(torch.get_default_dtype())


def _aggregate(
    s_plus: Tensor,
    s_minus: Tensor,
    function: Tensor,
    preserving: Tensor,
    valid: Tensor,
    probability: Tensor,
    correct: Tensor,
    num_functions: int | None,
) -> ObjectRelevancyScores:
    """Weighted ``S⁺``, ``S⁻``, ``S`` and per-function means from per-follow-up ``s⁺``/``s⁻`` ``(R, F)``."""
    weights = relevancy_weights(function, valid, preserving).double()
    preserving = preserving.to(valid.device)
    own = torch.where(preserving, s_plus.double(), s_minus.double())  # each follow-up's own score
    follow = torch.where(valid, own, torch.zeros_like(own))
    s_pos = (weights * follow * preserving).sum(1)
    s_neg = (weights * follow * ~preserving).sum(1)
    width = int(function.max()) + 1 if num_functions is None else num_functions
    one_hot = torch.nn.functional.one_hot(function.to(valid.device), width).double()  # (F, n)
    totals, counts = follow @ one_hot, valid.double() @ one_hot
    per_function = torch.where(counts > 0, totals / counts.clamp_min(1), torch.full_like(totals, float("nan")))
    own = torch.where(valid, own, torch.full_like(own, float("nan")))
    return ObjectRelevancyScores(s_pos, s_neg, (s_pos + s_neg) / 2, probability.double(), correct, per_function, own)


def object_relevancy(
    logits: Tensor,
    follow_up_logits: Tensor,
    target: Tensor,
    function: Tensor,
    preserving: Tensor,
    valid: Tensor | None = None,
    num_functions: int | None = None,
) -> ObjectRelevancyScores:
    """Object-relevancy scores of ``B`` classifications from their follow-ups' logits.

    Args:
        logits: ``(B, K)`` the sources' logits.
        follow_up_logits: ``(B, F, K)`` the follow-ups' logits.
        target: ``(B,)`` the sources' labels ``y``.
        function: ``(F,)`` each follow-up's mutation function index (e.g. into
            :data:`OBJECT_MUTATION_FUNCTIONS`).
        preserving: ``(F,)`` whether each follow-up's function preserves the object.
        valid: ``(B, F)`` which follow-ups exist (e.g. the margin statistic needs a margin); all by default.
        num_functions: width of ``per_function`` (default: the largest index + 1).

    Returns:
        :class:`ObjectRelevancyScores` of the ``B`` inferences (float64).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> logits = torch.tensor([[4.0, 0.0, 0.0], [4.0, 0.0, 0.0]])
        >>> follow = torch.stack([logits, logits.flip(1)], dim=1)  # (2, 2, 3): unchanged, then label last
        >>> scores = object_relevancy(logits, follow, torch.tensor([0, 0]), torch.tensor([0, 1]),
        ...                           torch.tensor([True, False]))
        >>> round(float(scores.preserving[0]), 4), round(float(scores.removing[0]), 4)  # p 0.9647 → 0.0177, r 1 → 2
        (1.0, 0.9908)
        >>> round(float(scores.score[0]), 4)
        0.9954
    """
    check_tensor("logits", logits, floating=True)
    batch = logits.shape[0]
    check_logits("logits", logits, batch)
    num_classes = logits.shape[1]
    positive_int("logits.shape[1] (classes)", num_classes, minimum=2)
    if not isinstance(follow_up_logits, Tensor) or follow_up_logits.ndim != 3 or follow_up_logits.shape[0] != batch:
        shape = tuple(follow_up_logits.shape) if isinstance(follow_up_logits, Tensor) else type(follow_up_logits)
        raise ValueError(f"follow_up_logits: expected ({batch}, F, {num_classes}), got {shape}")
    if follow_up_logits.shape[2] != num_classes:
        raise ValueError(
            f"follow_up_logits: expected {num_classes} classes like logits, got {follow_up_logits.shape[2]}"
        )
    check_labels("target", target, batch, num_classes)
    if function.numel() != follow_up_logits.shape[1]:
        raise ValueError(
            f"function: expected {follow_up_logits.shape[1]} indices (one per follow-up), got {function.numel()}"
        )
    for name, value in (("logits", logits), ("follow_up_logits", follow_up_logits)):
        if torch.isnan(value).any():
            raise ValueError(f"{name}: contains NaN")
    valid = _check_structure(function, preserving, valid, batch).to(logits.device)
    target = target.to(logits.device)
    p, r = class_probability_and_rank(logits, target)
    p_follow, r_follow = class_probability_and_rank(follow_up_logits, target[:, None])
    p, r = p[:, None], r[:, None]
    s_plus = preserving_score(p, r, p_follow, r_follow, num_classes)
    s_minus = removing_score(p, r, p_follow, r_follow, num_classes)
    correct = logits.argmax(1) == target
    return _aggregate(s_plus, s_minus, function, preserving, valid, p.squeeze(1), correct, num_functions)


def unreliable(scores: ObjectRelevancyScores, p_high: float = 0.9, s_low: float = 0.5) -> Tensor:
    """``(R,)`` inferences that are correct, confident (``p ≥ p_high``) and barely object-relevant (``S < s_low``).

    Example:
        >>> import torch
        >>> one = torch.ones(3, dtype=torch.float64)
        >>> scores = ObjectRelevancyScores(one, one, torch.tensor([0.2, 0.2, 0.8]).double(),
        ...                                torch.tensor([0.95, 0.5, 0.99]).double(), torch.ones(3, dtype=torch.bool),
        ...                                one[:, None])
        >>> unreliable(scores).tolist()
        [True, False, False]
    """
    p_high, s_low = probability("p_high", p_high), probability("s_low", s_low)
    return scores.correct & (scores.probability >= p_high) & (scores.score < s_low)


# ---- detection -------------------------------------------------------------------------------------


def _check_detections(name: str, detections: object, keys: tuple[str, ...]) -> Sequence[Mapping[str, Tensor]]:
    if not isinstance(detections, Sequence) or not all(isinstance(d, Mapping) for d in detections):
        raise ValueError(
            f"{name}: expected a list of dicts (torchvision detection format), got {type(detections).__name__}"
        )
    for index, record in enumerate(detections):
        missing = [key for key in keys if key not in record]
        if missing:
            raise ValueError(
                f"{name}: entry {index} lacks {missing} (has {sorted(record)}); torchvision detection output has "
                f"{list(keys)} -- pass an output_transform that returns that format"
            )
        boxes = record["boxes"]
        if not isinstance(boxes, Tensor) or boxes.ndim != 2 or boxes.shape[1] != 4:
            raise ValueError(f"{name}: entry {index}'s boxes must be (n, 4) xyxy, got {getattr(boxes, 'shape', boxes)}")
    return detections


def _follow_up_iou(detections: Mapping[str, Tensor], obj: Tensor, label: Tensor) -> Tensor:
    """IoU with ``obj`` of the follow-up's detection of ``label`` overlapping it most (0 when none)."""
    from torchvision.ops import box_iou

    same = detections["labels"].to(label.device) == label
    if not bool(same.any()):
        return torch.zeros((), dtype=torch.float64, device=obj.device)
    return box_iou(detections["boxes"][same].to(obj.device).double(), obj[None].double()).max()


def detection_relevancy(
    detections: Sequence[Mapping[str, Tensor]],
    follow_up_detections: Sequence[Sequence[Mapping[str, Tensor]]],
    targets: Sequence[Mapping[str, Tensor]],
    object_index: Tensor,
    function: Tensor,
    preserving: Tensor,
    valid: Tensor | None = None,
    iou_threshold: float = 0.5,
    num_functions: int | None = None,
) -> ObjectRelevancyScores:
    """Object-relevancy scores of every detection record associated with a mutated object.

    Row ``b`` is one mutated object: object ``object_index[b]`` of ``targets[b]`` was preserved or
    removed by the follow-ups ``follow_up_detections[b]`` (``F`` detection outputs), and
    ``detections[b]`` is the source image's detection output. Each source record whose associated
    object (same label, highest IoU, IoU > 0) is that object is one inference: ``u = clip(IoU(follow-up
    record, object)/IoU(record, object), 0, 1)``, ``s⁺ = u``, ``s⁻ = 1 − u``; correct when
    ``IoU(record, object) ≥ iou_threshold``; its probability is the record's score.

    Args:
        detections: ``B`` dicts with ``boxes`` ``(n, 4)`` xyxy, ``labels`` ``(n,)``, ``scores`` ``(n,)``.
        follow_up_detections: ``B`` lists of ``F`` such dicts.
        targets: ``B`` dicts with the ground truth ``boxes`` and ``labels``.
        object_index: ``(B,)`` which ground-truth object of each target the follow-ups mutated.
        function: ``(F,)`` each follow-up's mutation function index.
        preserving: ``(F,)`` whether each follow-up's function preserves the object.
        valid: ``(B, F)`` which follow-ups exist; all by default.
        iou_threshold: IoU with its object at which a record counts as a correct detection.
        num_functions: width of ``per_function`` (default: the largest index + 1).

    Returns:
        :class:`ObjectRelevancyScores` of the ``R`` associated records, rows ordered by ``b`` then record.

    Example:
        >>> import torch
        >>> box = torch.tensor([[10.0, 10.0, 30.0, 30.0]])
        >>> found = {"boxes": box, "labels": torch.tensor([3]), "scores": torch.tensor([0.95])}
        >>> nothing = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long), "scores": torch.zeros(0)}
        >>> shifted = {"boxes": box + 10, "labels": torch.tensor([3]), "scores": torch.tensor([0.9])}
        >>> scores = detection_relevancy([found], [[shifted, nothing]], [{"boxes": box, "labels": torch.tensor([3])}],
        ...                              torch.tensor([0]), torch.tensor([0, 1]), torch.tensor([True, False]))
        >>> round(float(scores.preserving[0]), 4), round(float(scores.removing[0]), 4)  # IoU 100/700, removed
        (0.1429, 1.0)
    """
    from torchvision.ops import box_iou

    _check_detections("detections", detections, ("boxes", "labels", "scores"))
    _check_detections("targets", targets, ("boxes", "labels"))
    batch = len(detections)
    if len(targets) != batch or len(follow_up_detections) != batch:
        raise ValueError(
            f"follow_up_detections: expected {batch} rows like detections (targets: {len(targets)}), "
            f"got {len(follow_up_detections)}"
        )
    count = function.numel()
    for row, outputs in enumerate(follow_up_detections):
        if len(outputs) != count:
            raise ValueError(f"follow_up_detections: row {row} has {len(outputs)} outputs, expected {count} (F)")
        _check_detections(f"follow_up_detections[{row}]", outputs, ("boxes", "labels", "scores"))
    if not isinstance(object_index, Tensor) or object_index.shape != (batch,):
        raise ValueError(f"object_index: expected ({batch},) indices into each target's objects, got {object_index!r}")
    iou_threshold = probability("iou_threshold", iou_threshold)
    valid = _check_structure(function, preserving, valid, batch)
    u_rows, probabilities, corrects, valid_rows = [], [], [], []
    for b in range(batch):
        gt_boxes, gt_labels = targets[b]["boxes"].double(), targets[b]["labels"]
        j = int(object_index[b])
        if not 0 <= j < len(gt_boxes):
            raise ValueError(f"object_index: {j} at row {b}, but that target has {len(gt_boxes)} objects")
        obj, label = gt_boxes[j], gt_labels[j]
        boxes, labels = detections[b]["boxes"].double().to(obj.device), detections[b]["labels"].to(obj.device)
        if not len(boxes):
            continue
        overlap = box_iou(boxes, gt_boxes)  # (n, objects)
        same = labels[:, None] == gt_labels[None, :].to(labels.device)
        overlap = torch.where(same, overlap, torch.full_like(overlap, -1.0))
        best, associated = overlap.max(1)
        mine = (associated == j) & (best > 0)
        follow_iou = torch.stack([_follow_up_iou(out, obj, label) for out in follow_up_detections[b]])  # (F,)
        for record in mine.nonzero().squeeze(1).tolist():
            own = best[record]
            u_rows.append((follow_iou / own).clamp(0, 1))
            probabilities.append(detections[b]["scores"][record].double().to(obj.device))
            corrects.append(own >= iou_threshold)
            valid_rows.append(valid[b].to(obj.device))
    if not u_rows:
        empty = torch.zeros(0, dtype=torch.float64)
        width = (int(function.max()) + 1 if count else 0) if num_functions is None else num_functions
        return ObjectRelevancyScores(
            empty, empty, empty, empty, torch.zeros(0, dtype=torch.bool), empty.view(0, width), empty.view(0, count)
        )
    u = torch.stack(u_rows)
    return _aggregate(
        u,
        1 - u,
        function,
        preserving,
        torch.stack(valid_rows),
        torch.stack(probabilities),
        torch.stack(corrects),
        num_functions,
    )
