"""Object relevancy (SPEC §3) as a torchmetrics metric, for classifiers and for detectors.

The metric keeps sum-reduced states -- sums of ``S``, ``S⁺``, ``S⁻`` and of each mutation function's
scores, counts of inferences, of correct ones and of unreliable ones, and a histogram of ``S`` -- so N
processes report what one process reports for the same inputs. The scores are made once by the
functional maths (:mod:`dlguard.metrics.functional.object_relevancy`): the metric only adds them up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from dlguard._validation import positive_int, probability
from dlguard.metrics.functional.object_relevancy import OBJECT_MUTATION_FUNCTIONS, ObjectRelevancyScores, unreliable

__all__ = ["ObjectRelevancy"]


class ObjectRelevancy(Metric):
    r"""Object relevancy ``S = (S⁺ + S⁻)/2`` of a model's inferences, and the share that is unreliable.

    ``update(scores)`` adds the :class:`~dlguard.metrics.functional.ObjectRelevancyScores` of ``R``
    inferences, scored once by :func:`~dlguard.metrics.functional.object_relevancy` (a classifier's
    logits on its sources and their follow-ups) or
    :func:`~dlguard.metrics.functional.detection_relevancy` (a detector's records); see there for the
    formulas. An inference is *unreliable* when it is correct, ``p ≥ p_high`` and ``S < s_low``;
    ``unreliable_rate`` is their share among the correct inferences (the paper's 5.3--6.7 % of correct
    ImageNet classifications).

    ``compute()`` returns a dict: ``score``, ``preserving``, ``removing``, ``unreliable_rate`` (float64
    scalars; ``unreliable_rate`` NaN without a correct inference), ``unreliable`` and ``inferences``
    (counts), ``per_function`` (mean ``s⁺``/``s⁻`` of each mutation function, by name) and
    ``histogram`` (``bins`` counts of ``S`` over ``[0, 1]``). States are sums, reduced by sum, so N
    processes report what one process reports for the same inputs.

    Args:
        p_high: confidence from which a correct inference can be unreliable.
        s_low: object relevancy below which a confident correct inference is unreliable.
        functions: the mutation functions' names, indexed by the scores' ``per_function`` columns.
        bins: bins of the histogram of ``S``.

    Example:
        >>> import torch
        >>> from dlguard.metrics.functional import object_relevancy
        >>> logits = torch.tensor([[5.0, 0.0, 0.0], [5.0, 0.0, 0.0]])
        >>> reads_object = torch.stack([logits[0], logits[0].flip(0)])  # same on a new background; gone when removed
        >>> reads_background = torch.stack([logits[0].flip(0), logits[0]])  # the opposite
        >>> function, preserving = torch.tensor([0, 3]), torch.tensor([True, False])
        >>> scores = object_relevancy(logits, torch.stack([reads_object, reads_background]), torch.tensor([0, 0]),
        ...                           function, preserving)
        >>> metric = ObjectRelevancy()
        >>> metric.update(scores)
        >>> result = metric.compute()
        >>> round(float(result["score"]), 4), int(result["unreliable"]), round(float(result["unreliable_rate"]), 4)
        (0.5017, 1, 0.5)
    """

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

    def update(self, scores: ObjectRelevancyScores) -> None:
        """Add the scores of ``R`` inferences (from ``object_relevancy`` or ``detection_relevancy``)."""
        if not isinstance(scores, ObjectRelevancyScores):
            raise ValueError(
                "scores: expected ObjectRelevancyScores (dlguard.metrics.functional.object_relevancy or "
                f"detection_relevancy), got {type(scores).__name__}"
            )
        device = self.inferences.device
        s = scores.score.to(device, torch.float64)
        flagged = unreliable(scores, self.p_high, self.s_low).to(device)
        per_function = scores.per_function.to(device, torch.float64)
        if per_function.shape[1] > len(self.functions):
            raise ValueError(
                f"scores: per_function has {per_function.shape[1]} functions, but the metric knows "
                f"{len(self.functions)} {list(self.functions)}; pass functions=... with every function's name"
            )
        self.inferences += len(s)
        self.correct += scores.correct.to(device).sum()
        self.unreliable += flagged.sum()
        self.score_sum += s.sum()
        self.preserving_sum += scores.preserving.to(device, torch.float64).sum()
        self.removing_sum += scores.removing.to(device, torch.float64).sum()
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
