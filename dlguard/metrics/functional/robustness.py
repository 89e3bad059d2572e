"""Local robustness per class, property and severity, and global robustness through an adder (SPEC §5).

Paper: *A Comprehensive Testing Framework for Deep Learning Models* (papers/003_…).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from dlguard._validation import check_combine, check_labels, check_tensor, positive_int

__all__ = ["LocalRobustnessResult", "adder_global_robustness", "digit_sum", "local_robustness"]


class LocalRobustnessResult(NamedTuple):
    """Local robustness of one property over its severity levels."""

    per_class: Tensor
    """``LR_{c,p}`` per level and class ``(L, C)``: accuracy on the perturbed inputs of class ``c``."""
    per_level: Tensor
    """``LR_p`` per level ``(L,)``: the mean of ``LR_{c,p}`` over the classes that have inputs."""
    confidence: Tensor
    """Mean true-label probability per level and class ``(L, C)``."""


def _check_logits(logits: Tensor, target: Tensor, num_classes: int) -> None:
    positive_int("num_classes", num_classes, minimum=2)
    check_tensor("logits", logits, floating=True)
    if logits.ndim != 3 or logits.shape[-1] != num_classes:
        raise ValueError(f"logits: expected (levels, B, {num_classes}), got shape {tuple(logits.shape)}")
    check_labels("target", target, logits.shape[1], num_classes)


def _local_robustness_update(logits: Tensor, target: Tensor, num_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per level and class: correct counts ``(L, C)``, inputs ``(C,)``, summed true-label probability ``(L, C)``."""
    _check_logits(logits, target, num_classes)
    levels = logits.shape[0]
    correct = (logits.argmax(dim=-1) == target).to(logits.dtype)  # (L, B)
    confidence = logits.softmax(dim=-1).gather(2, target.view(1, -1, 1).expand(levels, -1, 1)).squeeze(2)
    per_class = torch.zeros(levels, num_classes, dtype=logits.dtype, device=logits.device)
    index = target.view(1, -1).expand(levels, -1)
    return (
        per_class.scatter_add(1, index, correct).round().long(),
        torch.bincount(target, minlength=num_classes),
        per_class.scatter_add(1, index, confidence),
    )


def _local_robustness_compute(correct: Tensor, total: Tensor, confidence: Tensor) -> LocalRobustnessResult:
    present = total > 0
    if not present.any():
        raise ValueError("LocalRobustness: no inputs were added")
    denominator = total.clamp(min=1).to(confidence.dtype)
    per_class = correct.to(confidence.dtype) / denominator
    per_class = torch.where(present, per_class, torch.nan)
    return LocalRobustnessResult(
        per_class=per_class,
        per_level=per_class[:, present].mean(dim=1),
        confidence=torch.where(present, confidence / denominator, torch.nan),
    )


def local_robustness(logits: Tensor, target: Tensor, num_classes: int) -> LocalRobustnessResult:
    """``LR_{c,p}`` and ``LR_p`` of one property from the model's logits at each severity level.

    ``LR_{c,p} = (1/N_c)·Σ 1[f(p(x_{c,i}, θ)) = y]`` over the ``N_c`` inputs of class ``c``, at each
    severity ``θ``; ``LR_p`` averages it over classes; the mean true-label probability is
    recorded too. Classes without inputs are NaN and left out of ``LR_p``.

    Args:
        logits: ``(levels, B, K)`` floating point, the model on the inputs perturbed at each level.
        target: ``(B,)`` integer labels in ``[0, K)``.
        num_classes: ``K`` (at least 2).

    Example:
        >>> import torch
        >>> target = torch.tensor([0, 0, 1, 1])
        >>> clean = torch.nn.functional.one_hot(target, 2).float() * 4
        >>> harsh = clean.flip(-1)  # every prediction wrong at the second level
        >>> harsh[0] = clean[0]  # ... except the first input
        >>> result = local_robustness(torch.stack([clean, harsh]), target, 2)
        >>> result.per_class.tolist(), result.per_level.tolist()
        ([[1.0, 1.0], [0.5, 0.0]], [1.0, 0.25])
    """
    return _local_robustness_compute(*_local_robustness_update(logits, target, num_classes))


def digit_sum(first: Tensor, second: Tensor) -> Tensor:
    """The framework's adder: the sum of two predicted (or true) digits.

    Only meaningful when the labels *are* the digits 0-9: the adder metrics and
    :func:`~dlguard.report.summarize_errors` refuse it for any other number of classes.
    """
    return first + second


digit_sum.labels_are_digits = True  # type: ignore[attr-defined]  # check_combine refuses it for other tasks


def _label_pair(name: str, pair: object, num_classes: int) -> tuple[Tensor, Tensor]:
    """Two integer label vectors ``(M,)`` of one shape, in ``[0, num_classes)``."""
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise ValueError(f"{name}: expected two label tensors (first inputs, second inputs), got {type(pair).__name__}")
    first = check_labels(f"{name}[0]", pair[0], num_classes=num_classes)
    second = check_labels(f"{name}[1]", pair[1], first.shape[0], num_classes=num_classes)
    return first, second


def _adder_update(
    preds: tuple[Tensor, Tensor],
    targets: tuple[Tensor, Tensor],
    num_classes: int,
    combine: Callable[[Tensor, Tensor], Tensor],
    group: Tensor | None = None,
    groups: int = 1,
) -> tuple[Tensor, Tensor]:
    """Per class pair ``(C, C)``: pairs whose combined prediction equals the combined truth, and all pairs.

    With ``group`` ``(M,)`` (each pair's index in ``0..groups-1``), one table per group: ``(groups, C, C)``.
    """
    num_classes = positive_int("num_classes", num_classes, minimum=2)
    check_combine(combine, num_classes)
    first, second = _label_pair("preds", preds, num_classes)
    true_first, true_second = _label_pair("targets", targets, num_classes)
    if true_first.shape != first.shape:
        raise ValueError(
            f"targets: expected labels of the predictions' shape {tuple(first.shape)}, got {tuple(true_first.shape)}"
        )
    pair = true_first.long() * num_classes + true_second.long()
    predicted, true = combine(first, second), combine(true_first, true_second)
    if not all(isinstance(c, Tensor) and c.shape == first.shape for c in (predicted, true)):
        raise ValueError(f"combine: expected one combined label per pair {tuple(first.shape)}")
    correct = (predicted == true).long()
    cells = num_classes * num_classes
    if group is None:
        return (
            torch.bincount(pair, weights=correct, minlength=cells).long().view(num_classes, num_classes),
            torch.bincount(pair, minlength=cells).view(num_classes, num_classes),
        )
    flat = group.to(pair.device) * cells + pair
    shape = (groups, num_classes, num_classes)
    return (
        torch.bincount(flat, weights=correct, minlength=groups * cells).long().view(shape),
        torch.bincount(flat, minlength=groups * cells).view(shape),
    )


def adder_global_robustness(
    preds: tuple[Tensor, Tensor],
    targets: tuple[Tensor, Tensor],
    num_classes: int,
    combine: Callable[[Tensor, Tensor], Tensor] = digit_sum,
) -> tuple[Tensor, Tensor]:
    """Global robustness through an adder: ``GR = (1/M)·Σ 1[combine(ŷ₁, ŷ₂) = combine(c₁, c₂)]``.

    Both inputs of each pair were perturbed by the same property and severity (SPEC §5). Not to
    be confused with HDA's empirical global robustness (density-weighted, SPEC §4).

    Args:
        preds: predicted labels of the first and second inputs, ``(M,)`` each, in ``[0, C)``.
        targets: their true labels, in ``[0, C)``.
        num_classes: ``C``.
        combine: how two labels combine, elementwise, into one value per pair. The default,
            :func:`digit_sum`, adds digits and needs ``C = 10``; pass a combine that fits other
            labels.

    Returns:
        ``(GR over all pairs, GR per class pair (C, C))``, NaN for pairs never drawn.

    Example:
        >>> import torch
        >>> gr, _ = adder_global_robustness((torch.tensor([3, 2, 5]), torch.tensor([4, 5, 6])),
        ...                                 (torch.tensor([3, 3, 5]), torch.tensor([4, 4, 5])), 10)
        >>> round(float(gr), 4)  # 7 = 7; 7 = 7 although both digits are wrong; 11 != 10
        0.6667
    """
    correct, total = _adder_update(preds, targets, num_classes, combine)
    return _adder_compute(correct, total)


def _adder_compute(correct: Tensor, total: Tensor) -> tuple[Tensor, Tensor]:
    if total.sum() == 0:
        raise ValueError("AdderGlobalRobustness: no pairs were added")
    per_pair = torch.where(total > 0, correct.double() / total.clamp(min=1), torch.nan)
    return correct.sum().double() / total.sum(), per_pair
