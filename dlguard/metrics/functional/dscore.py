"""D-Score: feature and attention distributions of a CNN over an ``n x n`` grid (SPEC §1).

Paper: *D-Score: A White-Box Diagnosis Score for CNNs Based on Mutation Operators* (papers/000_…).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from dlguard._validation import check_grid, check_labels, check_logits, check_tensor, positive_int

__all__ = ["DScoreResult", "d_score", "g_bound"]


class DScoreResult(NamedTuple):
    """Everything D-Score derives from the accuracies; vectors are row-major over the ``n x n`` grid."""

    d_score: Tensor
    """``v_fitness − v_robust`` (higher is better)."""
    v_fitness: Tensor
    """``â − (1/n²)·‖f̃ − ã‖₂`` (higher is better)."""
    v_robust: Tensor
    """Spread of both distributions and of the translated accuracies (lower is better)."""
    feature_distribution: Tensor
    """``f̃_i``: share of the accuracy lost when region ``i`` of every conv output is deleted."""
    attention_distribution: Tensor
    """``ã_i``: share of the accuracy kept when the input is translated towards region ``i``."""
    g_n: Tensor
    """``g(n)``, the upper bound of ``v_robust``."""
    augment_probability: Tensor
    """``p = clip(v_robust / g(n), 0, 1)`` for score-guided padding."""
    baseline_accuracy: Tensor
    """``â``, the accuracy of the unmodified model the result was computed from (scalar)."""
    deletion_accuracy: Tensor
    """``f_i``, the accuracy of each region-deletion mutant ``(n²,)``."""
    translation_accuracy: Tensor
    """``a_i``, the accuracy on each translated set ``(n²,)``.

    The three accuracies are part of the result because :class:`~dlguard.metrics.DScore` restores
    each process's own counts after ``compute()``: under DDP only the result holds the accuracies
    reduced over every process."""


def g_bound(n: int, num_classes: int) -> float:
    """Upper bound of ``v_robust``: ``g(n) = 2·sqrt(n² − 1)/n³ + (1/n)·(K − 1)/K``.

    Example:
        >>> round(g_bound(3, 10), 4)
        0.5095
    """
    check_grid(n)
    positive_int("num_classes", num_classes, minimum=2)
    return 2 * math.sqrt(n * n - 1) / n**3 + (num_classes - 1) / (n * num_classes)


def _as_accuracy(name: str, value: float | Tensor) -> Tensor:
    if isinstance(value, bool) or (isinstance(value, Tensor) and value.dtype == torch.bool):
        raise ValueError(f"{name}: expected accuracies in [0, 1], got booleans")
    try:
        tensor = torch.as_tensor(value, dtype=torch.float64).detach()
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name}: expected accuracies in [0, 1], got {type(value).__name__}") from None
    if torch.isnan(tensor).any():
        raise ValueError(f"{name}: contains NaN")
    if (tensor < 0).any() or (tensor > 1).any():
        raise ValueError(
            f"{name}: expected accuracies in [0, 1], got values in [{tensor.min():.4g}, {tensor.max():.4g}]"
        )
    return tensor


def d_score(
    baseline_accuracy: float | Tensor,
    deletion_accuracy: Tensor,
    translation_accuracy: Tensor,
    num_classes: int,
) -> DScoreResult:
    r"""D-Score from the accuracies of the model, its region-deletion mutants and translated sets.

    With ``â`` the baseline accuracy, ``f_i`` the accuracy of mutant ``i`` and ``a_i`` the accuracy
    on the set translated towards region ``i`` (``i = 1..n²``):

    - ``f̃_i = max(â − f_i, 0) / Σ_j max(â − f_j, 0)`` (uniform when every difference is 0)
    - ``ã_i = a_i / Σ_j a_j`` (uniform when every ``a_i`` is 0)
    - ``v_fitness = â − (1/n²)·sqrt(Σ (f̃_i − ã_i)²)``
    - ``v_robust = (1/n²)·(‖f̃ − 1/n²‖₂ + ‖ã − 1/n²‖₂ + ‖a − â‖₂)``
    - ``D-Score = v_fitness − v_robust``, ``p = clip(v_robust / g(n), 0, 1)``

    Args:
        baseline_accuracy: ``â`` in ``[0, 1]``.
        deletion_accuracy: ``f``, ``n²`` accuracies in ``[0, 1]``, row-major over the grid.
        translation_accuracy: ``a``, ``n²`` accuracies in ``[0, 1]``, row-major over the grid.
        num_classes: ``K``, for ``g(n)``.

    Returns:
        :class:`DScoreResult` of float64 tensors (scalars, or ``(n²,)`` distributions), including
        the accuracies it was computed from.

    Example (the paper's CIFAR-10 model, Tables III and IV, ``n = 3``):
        >>> f = [.7735, .7576, .7775, .7609, .7104, .7615, .7708, .7556, .7760]
        >>> a = [.4231, .4861, .4090, .5122, .6240, .5088, .4429, .5511, .4528]
        >>> result = d_score(0.7966, f, a, num_classes=10)
        >>> [round(float(v), 4) for v in (result.v_robust, result.v_fitness, result.d_score)]
        [0.129, 0.7812, 0.6522]
        >>> round(float(result.baseline_accuracy), 4), result.deletion_accuracy.shape
        (0.7966, torch.Size([9]))
    """
    baseline = _as_accuracy("baseline_accuracy", baseline_accuracy)
    deletion = _as_accuracy("deletion_accuracy", deletion_accuracy).flatten()
    translation = _as_accuracy("translation_accuracy", translation_accuracy).flatten()
    if baseline.numel() != 1:
        raise ValueError(f"baseline_accuracy: expected one accuracy, got {baseline.numel()} values")
    if deletion.numel() != translation.numel():
        raise ValueError(
            f"deletion_accuracy and translation_accuracy: expected the same length, got "
            f"{deletion.numel()} and {translation.numel()}"
        )
    cells = deletion.numel()
    n = math.isqrt(cells)
    if n * n != cells or n < 2:
        raise ValueError(f"deletion_accuracy: expected n² accuracies with n >= 2 (4, 9, 16, ...), got {cells}")
    g_n = torch.tensor(g_bound(n, num_classes), dtype=torch.float64)  # validates num_classes
    baseline = baseline.reshape(())
    uniform = torch.full_like(deletion, 1.0 / cells)

    loss = (baseline - deletion).clamp(min=0)
    feature = loss / loss.sum() if loss.sum() > 0 else uniform
    attention = translation / translation.sum() if translation.sum() > 0 else uniform

    v_fitness = baseline - torch.linalg.vector_norm(feature - attention) / cells
    v_robust = (
        torch.linalg.vector_norm(feature - uniform)
        + torch.linalg.vector_norm(attention - uniform)
        + torch.linalg.vector_norm(translation - baseline)
    ) / cells
    return DScoreResult(
        d_score=v_fitness - v_robust,
        v_fitness=v_fitness,
        v_robust=v_robust,
        feature_distribution=feature,
        attention_distribution=attention,
        g_n=g_n,
        augment_probability=(v_robust / g_n).clamp(0, 1),
        baseline_accuracy=baseline,
        deletion_accuracy=deletion,
        translation_accuracy=translation,
    )


def _dscore_update(
    baseline_logits: Tensor,
    mutant_logits: Tensor,
    translated_logits: Tensor,
    target: Tensor,
    num_classes: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, int]:
    """Correct counts of the baseline ``()``, each mutant ``(n²,)`` and each translated set ``(n²,)``.

    Every argument is checked before any count: logits of shapes ``(B, K)``, ``(n², B, K)`` and
    ``(n², B, K)``, ``K = num_classes`` when given, and integer labels ``(B,)`` in ``[0, K)``.
    """
    check_tensor("baseline_logits", baseline_logits, min_ndim=2)
    batch = baseline_logits.shape[0]
    check_logits("baseline_logits", baseline_logits, batch)
    classes = baseline_logits.shape[1]
    if num_classes is not None and classes != num_classes:
        raise ValueError(
            f"num_classes: is {num_classes} but the logits have {classes} classes; pass the width of the logits"
        )
    for name, logits in (("mutant_logits", mutant_logits), ("translated_logits", translated_logits)):
        check_tensor(name, logits)
        if logits.ndim != 3 or logits.shape[1:] != (batch, classes):
            raise ValueError(f"{name}: expected (n², {batch}, {classes}), got shape {tuple(logits.shape)}")
    if mutant_logits.shape[0] != translated_logits.shape[0]:
        raise ValueError(
            f"mutant_logits and translated_logits: expected the same n², got {mutant_logits.shape[0]} "
            f"and {translated_logits.shape[0]}"
        )
    check_labels("target", target, batch, num_classes=classes)
    baseline = (baseline_logits.argmax(-1) == target).sum()
    deletion = (mutant_logits.argmax(-1) == target).sum(dim=1)
    translation = (translated_logits.argmax(-1) == target).sum(dim=1)
    return baseline, deletion, translation, batch
