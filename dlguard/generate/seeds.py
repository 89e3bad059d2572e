"""HDA's seed selection (SPEC §4): local robustness indicators and the density-weighted ranking.

- ``S_grad(x) = ‖∇_x CE(f(x), y)‖_∞`` (:func:`gradient_indicator`): a large gradient means a
  small step changes the loss much -- *less* robust (``vulnerability="high"``).
- ``S_sep(x) = min_{x̂: ŷ ≠ y} ‖f(x) − f(x̂)‖_∞`` on logits (:func:`separation_indicator`): an
  input whose outputs lie close to those of another label is *less* robust (``vulnerability="low"``).
- Seeds are the ``k`` correctly classified candidates with the largest ``p_g(z) · minmax(S)``
  (:func:`select_seeds`), ranked in log space (:func:`seed_scores`): 32-d densities underflow ``exp``.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import torch
from torch import Tensor, nn

from dlguard._validation import check_labels, check_tensor, check_values, one_of, optional_positive_int, positive_int
from dlguard.generate.gradients import input_gradients, loss_gradient
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

__all__ = ["NoCorrectCandidateError", "gradient_indicator", "seed_scores", "select_seeds", "separation_indicator"]


class NoCorrectCandidateError(ValueError):
    """No candidate seed is classified correctly: nothing to select seeds from (a ``ValueError``)."""


Vulnerability = Literal["high", "low"]


def _check_inputs(inputs: Tensor, target: Tensor, validate_args: bool) -> None:
    check_tensor("inputs", inputs, floating=True)
    if validate_args:
        check_values("inputs", inputs, None)
    check_labels("target", target, batch=len(inputs))


def gradient_indicator(
    model: nn.Module | ModelAdapter,
    inputs: Tensor,
    target: Tensor,
    max_batch: int | None = None,
    validate_args: bool = True,
) -> Tensor:
    """``S_grad = ‖∇_x CE(f(x), y)‖_∞`` per input: the largest pixel-space loss gradient (SPEC §4).

    The gradient is taken with respect to the pixel-space ``inputs`` (``preprocess`` applies after
    them), of the summed cross-entropy of each pass, so each row gets its own gradient. The model
    runs in eval mode and is left exactly as found (also after an exception); works inside
    ``torch.no_grad()`` and ``torch.inference_mode()`` (on cloned inputs).

    Args:
        model: the network, or a :class:`~dlguard.probes.ModelAdapter`.
        inputs: ``(B, ...)`` floating inputs (pixels in ``[0, 1]`` for images; no range is enforced).
        target: ``(B,)`` labels.
        max_batch: rows per forward and backward pass (``None``: a memory budget,
            :func:`~dlguard.probes.default_max_batch`).
        validate_args: check the inputs for NaN (skip when the caller did).

    Returns:
        ``(B,)`` on the **model's** device, in ``inputs``' dtype.

    Example:
        >>> net = nn.Linear(2, 2)
        >>> with torch.no_grad():
        ...     _ = net.weight.copy_(torch.tensor([[1.0, -3.0], [-1.0, 3.0]])), net.bias.zero_()
        >>> x, y = torch.zeros(1, 2), torch.tensor([0])  # softmax (1/2, 1/2): ∇ = Wᵀ(p − e_0) = (−1, 3)
        >>> gradient_indicator(net, x, y)
        tensor([3.])
    """
    optional_positive_int("max_batch", max_batch)
    _check_inputs(inputs, target, validate_args)
    adapter = ModelAdapter.wrap(model)
    device = adapter.device
    parts = []
    with input_gradients(adapter.model):
        rows = adapter.rows_per_pass(inputs, max_batch) if len(inputs) else 1
        for begin in range(0, len(inputs), rows):
            part = inputs[begin : begin + rows].to(device)
            labels = target[begin : begin + rows].to(device).clone().long()
            parts.append(loss_gradient(adapter, part, labels).flatten(1).abs().amax(dim=1))
    return torch.cat(parts) if parts else inputs.new_zeros(0, device=device)


def separation_indicator(
    model: nn.Module | ModelAdapter,
    inputs: Tensor,
    target: Tensor,
    reference: Tensor | None = None,
    reference_target: Tensor | None = None,
    max_batch: int | None = None,
    validate_args: bool = True,
) -> Tensor:
    """``S_sep = min ‖f(x) − f(x̂)‖_∞`` over reference inputs ``x̂`` of another label, on logits (SPEC §4).

    Args:
        model: the network, or a :class:`~dlguard.probes.ModelAdapter`.
        inputs: ``(B, ...)`` floating inputs ``x`` (no range is enforced).
        target: ``(B,)`` their labels.
        reference: ``(R, ...)`` the inputs ``x̂`` to compare with; default ``inputs`` themselves.
        reference_target: ``(R,)`` their labels (given exactly when ``reference`` is).
        max_batch: rows per forward pass, and query rows per ``(rows, R)`` distance block (``None``: a
            memory budget, :func:`~dlguard.probes.default_max_batch`).
        validate_args: check the inputs and references for NaN (skip when the caller did).

    Returns:
        ``(B,)`` on the model's device; ``inf`` for an input with no reference of another label.

    Example:
        >>> net = nn.Identity()  # the "logits" are the inputs
        >>> x, y = torch.tensor([[0.0, 0.0], [0.1, 0.3], [1.0, 1.0]]), torch.tensor([0, 1, 1])
        >>> separation_indicator(net, x, y)
        tensor([0.3000, 0.3000, 1.0000])
    """
    optional_positive_int("max_batch", max_batch)
    _check_inputs(inputs, target, validate_args)
    if (reference is None) != (reference_target is None):
        raise ValueError("reference_target: expected reference and reference_target both given or both None")
    if reference is not None:
        check_tensor("reference", reference, floating=True)
        if validate_args:
            check_values("reference", reference, None)
        check_labels("reference_target", reference_target, batch=len(reference))
    adapter = ModelAdapter.wrap(model)
    device = adapter.device
    with evaluation(adapter.model), torch.no_grad():
        max_batch = adapter.rows_per_pass(inputs, max_batch) if len(inputs) else 1
        logits = adapter.logits(inputs, max_batch=max_batch)
        if reference is None:
            other, other_target = logits, target
        else:
            other = adapter.logits(reference, max_batch=max_batch, num_classes=logits.shape[1])
            other_target = reference_target
        target, other_target = target.to(device), other_target.to(device)  # type: ignore[union-attr]
        parts = []
        for begin in range(0, len(logits), max_batch):
            query = logits[begin : begin + max_batch]
            if len(other) == 0:  # no reference at all: nothing of another label
                parts.append(query.new_full((len(query),), math.inf))
                continue
            distance = torch.cdist(query[None], other[None], p=math.inf)[0]  # (rows, R)
            same = target[begin : begin + max_batch, None] == other_target[None, :]
            parts.append(distance.masked_fill(same, math.inf).amin(dim=1))
    return torch.cat(parts) if parts else logits.new_zeros(0)


def _check_vector(name: str, value: object, size: int | None = None, values: bool = True) -> Tensor:
    tensor = check_tensor(name, value, floating=True)
    if tensor.ndim != 1 or (size is not None and len(tensor) != size):
        expected = "(N,)" if size is None else f"({size},)"
        raise ValueError(f"{name}: expected shape {expected}, got {tuple(tensor.shape)}")
    if values and torch.isnan(tensor).any():
        raise ValueError(f"{name}: contains NaN")
    return tensor


def _minmax(values: Tensor) -> Tensor:
    """``(s − min) / (max − min)`` over the finite values; ``+inf`` → 1, ``−inf`` → 0; no spread → 1."""
    finite = torch.isfinite(values)
    scaled = torch.where(values > 0, 1.0, 0.0).to(values.dtype)  # the infinite ends
    if finite.any():
        low, high = values[finite].min(), values[finite].max()
        # a uniform indicator says nothing: every finite value gets 1, the ranking is by density alone
        inner = (values - low) / (high - low) if high > low else torch.ones_like(values)
        scaled = torch.where(finite, inner, scaled)
    return scaled


def seed_scores(
    log_density: Tensor, indicator: Tensor, vulnerability: Vulnerability = "high", validate_args: bool = True
) -> Tensor:
    """Log seed scores ``log p_g + log minmax(S)``: the log of SPEC §4's ranking ``p_g · minmax(S)``.

    ``vulnerability="high"`` when a larger indicator means less robust (``S_grad``);
    ``"low"`` when a smaller one does (``S_sep``), which ranks by ``1 − minmax(S)``, computed as
    ``minmax(−S)``. Min-max runs over the finite indicator values; ``±inf`` take the ends of the
    scale (an ``S_sep`` of ``inf``, no reference of another label, is least vulnerable). When the
    finite values do not spread (a uniform indicator), each of them scores 1: the ranking is by
    density alone. The least vulnerable candidate's factor is 0 (score ``−inf``), as in the paper.

    Args:
        log_density: ``(N,)`` ``log p_g`` of the candidates (``−inf`` allowed, NaN and ``+inf`` not).
        indicator: ``(N,)`` the local robustness indicator (no NaN).
        vulnerability: ``"high"`` or ``"low"``, see above.
        validate_args: check the values (NaN, ``+inf``); callers that made them skip it.

    Returns:
        ``(N,)`` log scores on ``log_density``'s device (``−inf`` for a zero score).

    Example:
        >>> log_p = torch.tensor([0.9, 0.8, 0.1, 0.06]).log()
        >>> seed_scores(log_p, torch.tensor([1.0, 2.0, 3.0, 5.0])).exp()  # p · (0, 1/4, 1/2, 1)
        tensor([0.0000, 0.2000, 0.0500, 0.0600])
    """
    log_density = _check_vector("log_density", log_density, values=validate_args)
    indicator = _check_vector("indicator", indicator, size=len(log_density), values=validate_args)
    if validate_args and (log_density == math.inf).any():
        raise ValueError("log_density: expected finite values or -inf, got +inf")
    vulnerability = one_of("vulnerability", vulnerability, ("high", "low"))
    indicator = indicator.to(device=log_density.device, dtype=log_density.dtype)
    scaled = _minmax(indicator if vulnerability == "high" else -indicator)
    return log_density + scaled.log()


def select_seeds(
    log_density: Tensor,
    indicator: Tensor,
    k: int,
    correct: Tensor | None = None,
    vulnerability: Vulnerability = "high",
    tie_break: Tensor | None = None,
    validate_args: bool = True,
) -> Tensor:
    """HDA's seeds: the ``k`` correctly classified candidates with the largest ``p_g · minmax(S)`` (SPEC §4).

    Min-max normalisation runs over the ``correct`` candidates only. Equal scores are ordered by
    ``tie_break`` (smaller key first; e.g. a :class:`~dlguard.data.ProbeSet`'s content keys, so the
    choice does not depend on the candidates' order), else by index.

    Args:
        log_density: ``(N,)`` ``log p_g`` of the candidates.
        indicator: ``(N,)`` ``S_grad`` or ``S_sep`` of the candidates.
        k: number of seeds (``>= 1``); more than the candidates warns and takes all of them.
        correct: ``(N,)`` bool mask of the correctly classified candidates; ``None``: all.
        vulnerability: ``"high"`` for ``S_grad``, ``"low"`` for ``S_sep`` (see :func:`seed_scores`).
        tie_break: ``(N,)`` keys ordering equal scores.
        validate_args: check the values (NaN, ``+inf``); callers that made them skip it.

    Returns:
        ``(min(k, number of candidates),)`` int64 indices into the candidates, best first, on
        ``log_density``'s device.

    Example:
        >>> log_p = torch.tensor([0.9, 0.8, 0.1, 0.06, 0.5]).log()
        >>> s_grad = torch.tensor([1.0, 2.0, 3.0, 5.0, 9.0])
        >>> select_seeds(log_p, s_grad, k=3, correct=torch.tensor([True, True, True, True, False]))
        tensor([1, 3, 2])
    """
    k = positive_int("k", k)
    log_density = _check_vector("log_density", log_density, values=validate_args)
    size = len(log_density)
    indicator = _check_vector("indicator", indicator, size=size, values=validate_args)
    device = log_density.device
    if correct is None:
        correct = torch.ones(size, dtype=torch.bool, device=device)
    elif not isinstance(correct, Tensor) or correct.dtype != torch.bool or tuple(correct.shape) != (size,):
        shape = tuple(correct.shape) if isinstance(correct, Tensor) else type(correct).__name__
        raise ValueError(f"correct: expected a bool mask of shape ({size},), got {shape}")
    if tie_break is not None:
        check_tensor("tie_break", tie_break)
        if (
            tuple(tie_break.shape) != (size,)
            or tie_break.is_complex()
            or (validate_args and torch.isnan(tie_break.double()).any())
        ):
            raise ValueError(f"tie_break: expected ({size},) real keys without NaN, got {tuple(tie_break.shape)}")
    candidates = correct.to(device).nonzero().squeeze(1)
    if len(candidates) == 0:
        raise NoCorrectCandidateError("correct: no candidate is marked correct (nothing to select seeds from)")
    if k > len(candidates):
        warnings.warn(
            f"select_seeds: k = {k} seeds asked for but there are only {len(candidates)} candidates; "
            f"taking all {len(candidates)}",
            stacklevel=2,
        )
        k = len(candidates)
    scores = seed_scores(log_density[candidates], indicator.to(device)[candidates], vulnerability, validate_args)
    keys = torch.arange(len(candidates), device=device) if tie_break is None else tie_break.to(device)[candidates]
    by_key = keys.argsort(stable=True)
    ranked = by_key[(-scores[by_key]).argsort(stable=True)]  # stable: equal scores keep the key order
    return candidates[ranked[:k]]
