"""Object relevancy (SPEC §3) as torchmetrics metrics, for classifiers and for detectors.

Both metrics keep the same sum-reduced states -- sums of ``S``, ``S⁺``, ``S⁻`` and of each mutation
function's scores, counts of inferences, of correct ones and of unreliable ones, and a histogram of
``S`` -- so N processes report what one process reports for the same inputs. The maths lives in
:mod:`dlguard.metrics.functional.object_relevancy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from dlguard._validation import positive_int, probability
from dlguard.metrics.functional.object_relevancy import (
    OBJECT_MUTATION_FUNCTIONS,
    ObjectRelevancyScores,
    detection_relevancy,
    object_relevancy,
    unreliable,
)

__all__ = ["DetectionObjectRelevancy", "ObjectRelevancy"]


class _RelevancyStates(Metric):
    """States and ``compute`` shared by the classification and the detection metric."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    inferences: Tensor
    correct: Tensor
    unreliable: Tensor
    score_sum: Tensor
    preserving_sum: Tensor
    removing_sum: Tensor
    function_sum: Tensor
    function_count: Tensor
    histogram: Tensor

    def __init__(
        self,
        p_high: float = 0.9,
        s_low: float = 0.5,
        functions: Sequence[str] = OBJECT_MUTATION_FUNCTIONS,
        bins: int = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.p_high, self.s_low = probability("p_high", p_high), probability("s_low", s_low)
        if isinstance(functions, str) or not functions or not all(isinstance(f, str) for f in functions):
            raise ValueError(f"functions: expected a non-empty sequence of function names, got {functions!r}")
        self.functions = tuple(functions)
        self.bins = positive_int("bins", bins)
        zero = torch.tensor(0.0, dtype=torch.float64)
        for name in ("inferences", "correct", "unreliable", "score_sum", "preserving_sum", "removing_sum"):
            self.add_state(name, zero.clone(), dist_reduce_fx="sum")
        width = len(self.functions)
        self.add_state("function_sum", torch.zeros(width, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("function_count", torch.zeros(width, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("histogram", torch.zeros(self.bins, dtype=torch.float64), dist_reduce_fx="sum")

    def _add(self, scores: ObjectRelevancyScores) -> None:
        device = self.inferences.device
        s = scores.score.to(device, torch.float64)
        flagged = unreliable(scores, self.p_high, self.s_low).to(device)
        self.inferences += len(s)
        self.correct += scores.correct.to(device).sum()
        self.unreliable += flagged.sum()
        self.score_sum += s.sum()
        self.preserving_sum += scores.preserving.to(device, torch.float64).sum()
        self.removing_sum += scores.removing.to(device, torch.float64).sum()
        per_function = scores.per_function.to(device, torch.float64)
        if per_function.shape[1] > len(self.functions):
            raise ValueError(
                f"function: indices reach {per_function.shape[1] - 1}, but the metric knows {len(self.functions)} "
                f"functions {list(self.functions)}; pass functions=... with every function's name"
            )
        seen = ~torch.isnan(per_function)
        width = per_function.shape[1]
        self.function_sum[:width] += torch.where(seen, per_function, torch.zeros_like(per_function)).sum(0)
        self.function_count[:width] += seen.sum(0)
        self.histogram += torch.histc(s, bins=self.bins, min=0.0, max=1.0)

    def compute(self) -> dict[str, Any]:
        """The means, the unreliable share and counts, per-function means and the histogram of ``S``.

        Keys: ``score``, ``preserving``, ``removing`` (means), ``unreliable_rate`` (share of correct
        inferences flagged), ``unreliable``, ``inferences``, ``per_function`` ``{name: mean}``, ``histogram``.
        """
        if float(self.inferences) == 0:
            raise ValueError(f"{type(self).__name__}: no inferences were added")
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=self.inferences.device)
        count = self.function_count.clamp_min(1)
        per_function = torch.where(self.function_count > 0, self.function_sum / count, nan)
        return {
            "score": self.score_sum / self.inferences,
            "preserving": self.preserving_sum / self.inferences,
            "removing": self.removing_sum / self.inferences,
            "unreliable_rate": self.unreliable / self.correct if float(self.correct) else nan,
            "unreliable": self.unreliable,
            "inferences": self.inferences,
            "per_function": dict(zip(self.functions, per_function, strict=True)),
            "histogram": self.histogram,
        }


class ObjectRelevancy(_RelevancyStates):
    r"""Object relevancy ``S = (S⁺ + S⁻)/2`` of a classifier's inferences, and the share that is unreliable.

    ``update(logits, follow_up_logits, target, function, preserving, valid=None)`` takes the sources'
    logits ``(B, K)``, their follow-ups' logits ``(B, F, K)`` (from
    :func:`~dlguard.augment.object_follow_ups`), the labels ``(B,)``, each follow-up's function index
    ``(F,)`` and type ``(F,)`` and which follow-ups exist ``(B, F)``; see
    :func:`~dlguard.metrics.functional.object_relevancy.object_relevancy` for the formulas. An
    inference is *unreliable* when it is correct, ``p ≥ p_high`` and ``S < s_low``;
    ``unreliable_rate`` is their share among the correct inferences (the paper's 5.3--6.7 % of correct
    ImageNet classifications).

    ``compute()`` returns a dict: ``score``, ``preserving``, ``removing``, ``unreliable_rate`` (float64
    scalars), ``unreliable`` and ``inferences`` (counts), ``per_function`` (mean ``s⁺``/``s⁻`` of each
    mutation function, by name) and ``histogram`` (``bins`` counts of ``S`` over ``[0, 1]``).

    Args:
        num_classes: ``K``, the width of the logits.
        p_high: confidence from which a correct inference can be unreliable.
        s_low: object relevancy below which a confident correct inference is unreliable.
        functions: the mutation functions' names, indexed by ``function``.
        bins: bins of the histogram of ``S``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> metric = ObjectRelevancy(num_classes=3)
        >>> logits = torch.tensor([[5.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
        >>> reads_object = torch.stack([logits[0], logits[0].flip(0)])  # same on a new background; gone when removed
        >>> reads_background = torch.stack([logits[0].flip(0), logits[0]])  # the opposite
        >>> function, preserving = torch.tensor([0, 3]), torch.tensor([True, False])
        >>> metric.update(logits, torch.stack([reads_object, reads_background]), torch.tensor([0, 0]),
        ...               function, preserving)
        >>> result = metric.compute()
        >>> round(float(result["score"]), 4), int(result["unreliable"]), round(float(result["unreliable_rate"]), 4)
        (0.5017, 1, 0.5)
    """

    def __init__(
        self,
        num_classes: int,
        p_high: float = 0.9,
        s_low: float = 0.5,
        functions: Sequence[str] = OBJECT_MUTATION_FUNCTIONS,
        bins: int = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(p_high, s_low, functions, bins, **kwargs)
        self.num_classes = positive_int("num_classes", num_classes, minimum=2)

    def update(
        self,
        logits: Tensor,
        follow_up_logits: Tensor,
        target: Tensor,
        function: Tensor,
        preserving: Tensor,
        valid: Tensor | None = None,
    ) -> None:
        """Add ``B`` inferences and their follow-ups (shapes as in the class docstring)."""
        if isinstance(logits, Tensor) and logits.ndim == 2 and logits.shape[1] != self.num_classes:
            raise ValueError(f"logits: expected {self.num_classes} classes (num_classes), got {logits.shape[1]}")
        self._add(object_relevancy(logits, follow_up_logits, target, function, preserving, valid, len(self.functions)))


class DetectionObjectRelevancy(_RelevancyStates):
    """Object relevancy of a detector's records (torchvision detection output), SPEC §3's detection variant.

    ``update(detections, follow_up_detections, targets, object_index, function, preserving, valid=None)``
    takes, per mutated object ``b``, the source image's detections, its ``F`` follow-ups' detections,
    the image's ground truth and which of its objects was mutated; see
    :func:`~dlguard.metrics.functional.object_relevancy.detection_relevancy`. Every record associated
    with a mutated object is one inference; a record is correct when its IoU with its object is at
    least ``iou_threshold`` and confident when its score is at least ``p_high``.

    ``compute()`` returns the same dict as :class:`ObjectRelevancy`.

    Example:
        >>> import torch
        >>> box = torch.tensor([[10.0, 10.0, 30.0, 30.0]])
        >>> found = {"boxes": box, "labels": torch.tensor([3]), "scores": torch.tensor([0.95])}
        >>> lost = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long), "scores": torch.zeros(0)}
        >>> metric = DetectionObjectRelevancy()
        >>> target = {"boxes": box, "labels": torch.tensor([3])}
        >>> metric.update([found], [[found, lost]], [target], torch.tensor([0]), torch.tensor([0, 3]),
        ...               torch.tensor([True, False]))
        >>> result = metric.compute()
        >>> float(result["score"]), int(result["unreliable"])  # kept when preserved, gone when removed
        (1.0, 0)
    """

    def __init__(
        self,
        p_high: float = 0.9,
        s_low: float = 0.5,
        iou_threshold: float = 0.5,
        functions: Sequence[str] = OBJECT_MUTATION_FUNCTIONS,
        bins: int = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(p_high, s_low, functions, bins, **kwargs)
        self.iou_threshold = probability("iou_threshold", iou_threshold)

    def update(
        self,
        detections: Sequence[Mapping[str, Tensor]],
        follow_up_detections: Sequence[Sequence[Mapping[str, Tensor]]],
        targets: Sequence[Mapping[str, Tensor]],
        object_index: Tensor,
        function: Tensor,
        preserving: Tensor,
        valid: Tensor | None = None,
    ) -> None:
        """Add the records associated with ``B`` mutated objects (arguments as in the class docstring)."""
        scores = detection_relevancy(
            detections,
            follow_up_detections,
            targets,
            object_index,
            function,
            preserving,
            valid,
            self.iou_threshold,
            len(self.functions),
        )
        self._add(scores)
