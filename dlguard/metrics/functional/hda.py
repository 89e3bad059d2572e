"""HDA's scores of a model on test cases (SPEC §4): the prediction loss ``J`` and empirical global robustness.

- ``J(f(x'), y) = max_{j≠y} z_j − z_y`` on logits ``z``: ``J ≥ 0`` exactly when ``x'`` is an
  adversarial example (a tie counts as one) -- the paper's Definition 3.
- ``R̂_g = Σ_i 1[f(x'_i) = y_i]·p_i`` over seeds whose densities ``p_i`` are normalised to sum 1 --
  Definition 5. Densities come as log densities (``log p_g`` of the seeds, SPEC §4) and are
  normalised in log space, so densities that underflow ``exp`` still weigh correctly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dlguard._validation import check_labels, check_logits, check_tensor, check_values

__all__ = ["empirical_global_robustness", "prediction_loss"]


def prediction_loss(logits: Tensor, target: Tensor) -> Tensor:
    """HDA's prediction loss ``J = max_{j≠y} z_j − z_y`` per row, ``(B,)``; ``J ≥ 0`` ⇔ adversarial.

    Args:
        logits: ``(B, K)`` logits (any leading batch shape ``(..., K)`` with ``target`` of shape ``(...)``).
        target: the labels ``y`` the inputs should get.

    Example:
        >>> logits = torch.tensor([[2.0, 0.5, 1.0], [0.0, 3.0, 1.0]])
        >>> prediction_loss(logits, torch.tensor([0, 0]))
        tensor([-1.,  3.])
    """
    check_tensor("logits", logits, floating=True)
    if logits.shape[-1] < 2 or tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"logits: expected shape (..., K) with K >= 2 and target of shape (...), got logits "
            f"{tuple(logits.shape)} and target {tuple(target.shape)}"
        )
    target = target.to(logits.device).long().unsqueeze(-1)
    true = logits.gather(-1, target)
    others = logits.scatter(-1, target, float("-inf"))
    return (others.amax(dim=-1, keepdim=True) - true).squeeze(-1)


def _check_seed_scores(preds: Tensor, target: Tensor, log_density: Tensor, values: bool = True) -> Tensor:
    """Predicted labels ``(B,)`` from labels or logits, with ``target`` and ``log_density`` checked (values too)."""
    check_tensor("preds", preds)
    if preds.ndim == 2:
        preds = check_logits("preds", preds, len(preds)).argmax(dim=1)
    elif preds.ndim != 1 or preds.is_floating_point():
        raise ValueError(f"preds: expected labels (B,) or logits (B, K), got {preds.dtype} {tuple(preds.shape)}")
    if values:
        check_labels("target", target, len(preds))
    elif tuple(target.shape) != (len(preds),):
        raise ValueError(f"target: expected labels of shape ({len(preds)},), got {tuple(target.shape)}")
    check_tensor("log_density", log_density, floating=True)
    if tuple(log_density.shape) != (len(preds),):
        raise ValueError(f"log_density: expected shape ({len(preds)},), got {tuple(log_density.shape)}")
    if values:
        check_values("log_density", log_density.clamp_min(-torch.finfo(log_density.dtype).max), None)
    return preds


def empirical_global_robustness(preds: Tensor, target: Tensor, log_density: Tensor) -> Tensor:
    """``R̂_g = Σ_i 1[f(x'_i) = y_i]·p_i / Σ_i p_i`` (SPEC §4): robustness weighted by seed density.

    Args:
        preds: ``(B,)`` predicted labels of the test cases ``x'_i`` (one per seed) or their logits ``(B, K)``.
        target: ``(B,)`` the seeds' labels ``y_i``.
        log_density: ``(B,)`` ``log p_g`` of the seeds (``-inf`` allowed: weight 0; NaN is not).

    Returns:
        A scalar in ``[0, 1]`` (NaN when every weight is 0).

    Example:
        >>> preds, target = torch.tensor([1, 2, 0]), torch.tensor([1, 0, 0])
        >>> log_p = torch.tensor([0.5, 0.3, 0.2]).log()  # the second seed's test case is misclassified
        >>> empirical_global_robustness(preds, target, log_p)
        tensor(0.7000)
    """
    log_correct, log_total, _ = _empirical_global_robustness_update(preds, target, log_density)
    return _empirical_global_robustness_compute(log_correct, log_total).to(log_density.dtype)


def _empirical_global_robustness_update(
    preds: Tensor, target: Tensor, log_density: Tensor, validate_args: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """``log Σ_{correct} p_i``, ``log Σ p_i`` (float64 scalars, ``-inf`` for an empty sum) and the number of seeds.

    Log-sum-exp sums reduce across batches and processes by log-sum-exp again, so the states never
    leave log space (densities of 32-d latent points can under- or overflow ``exp``, even in float64).
    """
    preds = _check_seed_scores(preds, target, log_density, validate_args)
    correct = preds.to(target.device) == target
    weights = log_density.to(device=target.device, dtype=torch.float64)
    count = torch.tensor(len(weights), dtype=torch.long, device=target.device)
    return weights[correct].logsumexp(0), weights.logsumexp(0), count


def _empirical_global_robustness_compute(log_correct: Tensor, log_total: Tensor) -> Tensor:
    """``exp(log_correct − log_total)``: NaN when the total weight is 0 (or infinite)."""
    if not torch.isfinite(log_total):
        return torch.full_like(log_total, float("nan"))
    return (log_correct - log_total).exp()
