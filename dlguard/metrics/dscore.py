"""D-Score as a torchmetrics metric (SPEC §1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from dlguard.metrics.functional.dscore import DScoreResult, _dscore_update, d_score, g_bound

__all__ = ["DScore"]


class DScore(Metric):
    """Accumulate correct counts of a model, its ``n²`` deletion mutants and ``n²`` translated sets.

    ``update`` takes logits the caller computed (a metric never runs the model): the unmodified
    model's ``(B, K)``, the mutants' ``(n², B, K)`` (:func:`~dlguard.probes.deletion_mutant_logits`)
    and the translated sets' ``(n², B, K)`` (:func:`~dlguard.augment.functional.region_translations`).
    States are counts reduced by sum, so any split of the probe set across batches or processes
    gives the same result. ``compute`` returns :class:`~dlguard.metrics.functional.DScoreResult`,
    whose ``baseline_accuracy``, ``deletion_accuracy`` and ``translation_accuracy`` are the
    accuracies reduced over all processes (the count states hold this process's own counts again
    once ``compute`` returns).

    Args:
        n: grid size (``>= 2``).
        num_classes: ``K``, the width of the logits.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> target = torch.randint(0, 10, (32,))
        >>> clean = torch.nn.functional.one_hot(target, 10).float()
        >>> metric = DScore(n=2, num_classes=10)
        >>> metric.update(clean, clean.expand(4, -1, -1), torch.randn(4, 32, 10), target)
        >>> result = metric.compute()
        >>> float(result.v_fitness) <= 1.0, result.feature_distribution.tolist()  # no mutant lost anything
        (True, [0.25, 0.25, 0.25, 0.25])
        >>> round(float(result.baseline_accuracy), 4), round(float(result.deletion_accuracy[0]), 4)
        (1.0, 1.0)
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    baseline_correct: Tensor
    deletion_correct: Tensor
    translation_correct: Tensor
    total: Tensor

    def __init__(self, n: int, num_classes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        g_bound(n, num_classes)  # validates n and num_classes
        self.n, self.num_classes = n, num_classes
        self.add_state("baseline_correct", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("deletion_correct", torch.zeros(n * n, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("translation_correct", torch.zeros(n * n, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, baseline_logits: Tensor, mutant_logits: Tensor, translated_logits: Tensor, target: Tensor) -> None:
        """Add a batch: logits ``(B, K)``, ``(n², B, K)``, ``(n², B, K)`` and labels ``(B,)`` in ``[0, K)``.

        Raises:
            ValueError: on a shape other than these, ``K != num_classes``, or a label outside ``[0, K)``.
        """
        if isinstance(mutant_logits, Tensor) and mutant_logits.ndim == 3 and mutant_logits.shape[0] != self.n**2:
            raise ValueError(f"mutant_logits: expected n² = {self.n**2} mutants, got {mutant_logits.shape[0]}")
        baseline, deletion, translation, batch = _dscore_update(
            baseline_logits, mutant_logits, translated_logits, target, self.num_classes
        )
        self.baseline_correct += baseline
        self.deletion_correct += deletion
        self.translation_correct += translation
        self.total += batch

    def compute(self) -> DScoreResult:
        """D-Score of the accumulated accuracies."""
        if self.total == 0:
            raise ValueError("DScore: no probe inputs were added; call update() first")
        total = self.total.double()
        return d_score(
            self.baseline_correct / total,
            self.deletion_correct / total,
            self.translation_correct / total,
            self.num_classes,
        )

    def plot(self, val: DScoreResult | None = None, ax: Sequence[Any] | None = None) -> tuple[Any, Any]:
        """Draw the feature and attention distributions as ``n x n`` heatmaps.

        Args:
            val: a result to draw (default: :meth:`compute`).
            ax: two matplotlib ``Axes`` of one figure to draw the feature and attention heatmaps
                into (default: a new figure).

        Returns:
            ``(figure, [feature axes, attention axes])``.
        """
        # matplotlib loads only when a figure is drawn
        from dlguard.utilities.plot import plot_dscore_heatmaps

        figure = plot_dscore_heatmaps(val if val is not None else self.compute(), ax=ax)
        return figure, list(ax) if ax is not None else figure.axes[:2]
