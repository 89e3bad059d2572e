r"""DeepTest's metamorphic relations (SPEC §2, papers/004_…): what a transformation must not change.

A transformed input ``x'`` of a source ``x`` should get the same answer as ``x``:

- **classification**: the label on ``x'`` equals the label on ``x`` (``argmax`` of the logits); a
  *violation* is an input whose label changed. No ground truth is needed.
- **regression** (steering), eq. 2: with ``MSE_orig`` the model's mean squared error on the source
  inputs against their labels ``y``, a transformed input is fine while
  ``(ŷ' − y)² ≤ λ·MSE_orig``; a *violation* is ``(ŷ' − y)² > λ·MSE_orig``. ``λ > 0`` trades false
  positives for false negatives (the paper sweeps 1–10 and reports ``λ = 5``).
- **filter**, eq. 3: a (transformation, parameter) counts only when its own MSE stays near the
  original, ``|MSE_(trans,param) − MSE_orig| ≤ ε`` (``ε ≥ 0``; the paper sweeps 0.01–0.1 and reports
  ``ε = 0.03``), so that transformations that change the correct answer (a 30° rotation) do not
  flood the count with false positives. It is not applied to fog, rain (their correct answer is the
  source's by construction), nor to compositions of transformations (the guided search's images),
  whose MSE cannot be pinned on one transformation: :data:`UNFILTERED` and any name with ``"+"``.

The module is pure tensor maths; :class:`~dlguard.metrics.metamorphic.MetamorphicViolations` counts
violations over a probe set and across processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real

import torch
from torch import Tensor

from dlguard._validation import check_tensor, check_values, one_of

__all__ = [
    "TASKS",
    "UNFILTERED",
    "MetamorphicRelation",
    "check_outputs",
    "classification_violations",
    "is_filtered",
    "passes_filter",
    "regression_violations",
    "squared_errors",
]

TASKS: tuple[str, ...] = ("classification", "regression")
"""The relations: the label must not change (classification) or eq. 2 must hold (regression)."""

UNFILTERED: tuple[str, ...] = ("fog", "rain", "guided")
"""Transformations the eq. 3 filter is not applied to (nor to compositions, names containing ``"+"``)."""


def _check_task(task: object) -> str:
    return one_of("task", task, TASKS)


def check_outputs(task: str, outputs: Tensor, name: str = "outputs") -> Tensor:
    """A model's outputs checked against the relation's ``task``, as the relation reads them.

    Classification reads logits ``(B, K)``, ``K ≥ 2``, returned as they are; regression reads
    predictions ``(B,)`` or ``(B, 1)``, returned as ``(B,)``. Outputs of the other task's shape, a
    non-floating tensor or a NaN raise ``ValueError`` naming ``name`` (one host sync for the NaN check).

    Example:
        >>> import torch
        >>> tuple(check_outputs("regression", torch.zeros(4, 1)).shape)
        (4,)
        >>> check_outputs("classification", torch.zeros(4, 1), "logits")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: logits: expected class logits (B, K) ...: a regression output; use task='regression'
    """
    task = _check_task(task)
    check_tensor(name, outputs, floating=True)
    shape = tuple(outputs.shape)
    one_per_input = outputs.ndim == 1 or (outputs.ndim == 2 and shape[1] == 1)
    if task == "classification":
        if one_per_input:
            raise ValueError(
                f"{name}: expected class logits (B, K) with K >= 2, got shape {shape}: a regression output; "
                "use task='regression'"
            )
        if outputs.ndim != 2:
            raise ValueError(f"{name}: expected class logits (B, K) with K >= 2, got shape {shape}")
    else:
        if outputs.ndim == 2:
            if not one_per_input:
                raise ValueError(
                    f"{name}: expected predictions (B,) or (B, 1), got shape {shape}: class logits (B, K); "
                    "use task='classification'"
                )
            outputs = outputs[:, 0]
        elif outputs.ndim != 1:
            raise ValueError(f"{name}: expected predictions (B,) or (B, 1), got shape {shape}")
    check_values(name, outputs, bounds=None)
    return outputs


def _check_target(target: object, batch: int, name: str = "target") -> Tensor:
    """Regression labels ``(B,)`` or ``(B, 1)`` (real numbers, no NaN) as ``(B,)``."""
    check_tensor(name, target)
    if target.dtype == torch.bool or target.is_complex():
        raise ValueError(f"{name}: expected real-valued labels, got {target.dtype}")
    if target.ndim == 2 and target.shape[1] == 1:
        target = target[:, 0]
    if target.ndim != 1 or target.shape[0] != batch:
        raise ValueError(f"{name}: expected labels of shape ({batch},) like the predictions, got {tuple(target.shape)}")
    check_values(name, target, bounds=None)
    return target


def _positive_values(name: str, value: object, minimum: float, strict: bool, device: torch.device) -> Tensor:
    """A finite number or a 0-d/1-D tensor of them, each ``> minimum`` (``strict``) or ``≥ minimum``, as float64."""
    relation = ">" if strict else ">="
    expected = f"a finite number {relation} {minimum:g}, or a 1-D tensor of them"
    if isinstance(value, Tensor):
        if value.ndim > 1 or value.numel() == 0 or value.dtype == torch.bool or value.is_complex():
            raise ValueError(f"{name}: expected {expected}, got a tensor of shape {tuple(value.shape)}")
        values = value.detach().to(device, torch.float64)
    elif isinstance(value, Real) and not isinstance(value, bool):
        values = torch.tensor(float(value), dtype=torch.float64, device=device)
    else:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    low = float(values.min())
    if not bool(torch.isfinite(values).all()) or low < minimum or (strict and low == minimum):
        shown = values.tolist() if values.ndim else float(values)
        raise ValueError(f"{name}: expected {expected}, got {shown}")
    return values


def _check_mse(name: str, mse: object, device: torch.device) -> Tensor:
    """``MSE_orig``: a finite number ``≥ 0`` (or a 0-d tensor), as a float64 0-d tensor."""
    if isinstance(mse, Tensor) and mse.ndim != 0:
        raise ValueError(
            f"{name}: expected one mean squared error (a number or a 0-d tensor), got shape {tuple(mse.shape)}"
        )
    return _positive_values(name, mse, 0.0, strict=False, device=device)


def _classification_violations(source: Tensor, transformed: Tensor, names: tuple[str, str]) -> Tensor:
    source = check_outputs("classification", source, names[0])
    transformed = check_outputs("classification", transformed, names[1])
    if source.shape != transformed.shape:
        raise ValueError(
            f"{names[1]}: expected the shape of {names[0]} {tuple(source.shape)}, got {tuple(transformed.shape)}"
        )
    return source.argmax(dim=1) != transformed.argmax(dim=1).to(source.device)


def classification_violations(source_logits: Tensor, transformed_logits: Tensor) -> Tensor:
    """Which transformed inputs changed label: ``argmax`` of ``transformed_logits`` ≠ ``argmax`` of ``source_logits``.

    Args:
        source_logits: ``(B, K)`` logits on the source inputs.
        transformed_logits: ``(B, K)`` logits on their transformed versions.

    Returns:
        ``(B,)`` bool, ``True`` where the relation is violated.

    Example:
        >>> import torch
        >>> source = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
        >>> classification_violations(source, torch.tensor([[1.0, 0.5], [1.0, 0.0]])).tolist()
        [False, True]
    """
    return _classification_violations(source_logits, transformed_logits, ("source_logits", "transformed_logits"))


def squared_errors(preds: Tensor, target: Tensor) -> Tensor:
    """``(ŷ − y)²`` per input, in float64; ``preds`` ``(B,)``/``(B, 1)`` and ``target`` ``(B,)``/``(B, 1)``.

    Example:
        >>> import torch
        >>> squared_errors(torch.tensor([0.5, -0.25]), torch.tensor([0.0, 0.25])).tolist()
        [0.25, 0.25]
    """
    preds = check_outputs("regression", preds, "preds")
    target = _check_target(target, preds.shape[0])
    return _squared_errors(preds, target)


def _squared_errors(preds: Tensor, target: Tensor) -> Tensor:
    return (preds.double() - target.to(preds.device, torch.float64)) ** 2


def _regression_violations(squared: Tensor, mse_orig: Tensor, lam: Tensor) -> Tensor:
    """Eq. 2 on checked values: ``(B,)`` for a 0-d ``lam``, ``(B, L)`` for a 1-D one."""
    bound = lam * mse_orig
    return squared.unsqueeze(-1) > bound if lam.ndim else squared > bound


def regression_violations(
    transformed_preds: Tensor, target: Tensor, mse_orig: float | Tensor, lam: float | Tensor
) -> Tensor:
    """Eq. 2: a transformed input violates the relation when ``(ŷ' − y)² > λ·MSE_orig``.

    Args:
        transformed_preds: ``(B,)`` or ``(B, 1)`` predictions on the transformed inputs.
        target: ``(B,)`` labels of their sources.
        mse_orig: the model's mean squared error on the source inputs (the whole probe set, not one batch).
        lam: ``λ > 0``, a number or a 1-D tensor of ``L`` values.

    Returns:
        bool ``(B,)`` for one ``λ``, ``(B, L)`` for a 1-D ``lam``.

    Example:
        >>> import torch
        >>> preds, target = torch.tensor([0.1, 0.5, -0.4]), torch.tensor([0.0, 0.0, 0.0])
        >>> regression_violations(preds, target, mse_orig=0.02, lam=5.0).tolist()  # 0.01, 0.25, 0.16 > 0.1?
        [False, True, True]
        >>> regression_violations(preds, target, 0.02, torch.tensor([5.0, 10.0]))[2].tolist()  # 0.16 > 0.2? no
        [True, False]
    """
    preds = check_outputs("regression", transformed_preds, "transformed_preds")
    target = _check_target(target, preds.shape[0])
    lam_values = _positive_values("lam", lam, 0.0, strict=True, device=preds.device)
    mse = _check_mse("mse_orig", mse_orig, preds.device)
    return _regression_violations(_squared_errors(preds, target), mse, lam_values)


def _passes_filter(mse_trans: Tensor, mse_orig: Tensor, epsilon: Tensor) -> Tensor:
    """Eq. 3 on checked values; a 1-D ``epsilon`` adds a last dimension. A NaN ``mse_trans`` never passes."""
    difference = (mse_trans.double() - mse_orig).abs()
    return difference.unsqueeze(-1) <= epsilon if epsilon.ndim else difference <= epsilon


def passes_filter(mse_trans: Tensor, mse_orig: float | Tensor, epsilon: float | Tensor) -> Tensor:
    """Eq. 3: which transformations count, ``|MSE_(trans,param) − MSE_orig| ≤ ε``.

    Args:
        mse_trans: MSE of the model on each (transformation, parameter)'s inputs, any shape ``S``;
            a NaN (no inputs) never passes.
        mse_orig: the MSE on the source inputs, a number or a tensor broadcasting against ``mse_trans``.
        epsilon: ``ε ≥ 0``, a number or a 1-D tensor of ``E`` values.

    Returns:
        bool of shape ``S`` for one ``ε``, ``(*S, E)`` for a 1-D ``epsilon``.

    Example:
        >>> import torch
        >>> passes_filter(torch.tensor([0.10, 0.12, 0.30]), 0.1, torch.tensor([0.01, 0.05])).tolist()
        [[True, True], [False, True], [False, False]]
    """
    check_tensor("mse_trans", mse_trans, min_ndim=0)
    if mse_trans.dtype == torch.bool or mse_trans.is_complex():
        raise ValueError(f"mse_trans: expected real mean squared errors, got {mse_trans.dtype}")
    epsilon_values = _positive_values("epsilon", epsilon, 0.0, strict=False, device=mse_trans.device)
    if isinstance(mse_orig, Tensor):
        if mse_orig.numel() and (not bool(torch.isfinite(mse_orig).all()) or float(mse_orig.min()) < 0):
            raise ValueError("mse_orig: expected finite mean squared errors >= 0")
        mse = mse_orig.to(mse_trans.device, torch.float64)
    else:
        mse = _check_mse("mse_orig", mse_orig, mse_trans.device)
    return _passes_filter(mse_trans, mse, epsilon_values)


def is_filtered(transformation: str, unfiltered: Sequence[str] = UNFILTERED) -> bool:
    """Whether eq. 3 applies to ``transformation``: not to names in ``unfiltered``, nor to ``"+"``-compositions.

    Example:
        >>> is_filtered("rotation"), is_filtered("fog"), is_filtered("rotation+brightness")
        (True, False, False)
    """
    if not isinstance(transformation, str) or not transformation:
        raise ValueError(f"transformation: expected a transformation's name, got {transformation!r}")
    if isinstance(unfiltered, str) or not all(isinstance(u, str) for u in unfiltered):
        raise ValueError(f"unfiltered: expected a sequence of transformation names, got {unfiltered!r}")
    return "+" not in transformation and transformation not in tuple(unfiltered)


@dataclass(frozen=True)
class MetamorphicRelation:
    """A metamorphic relation of SPEC §2, checked one batch at a time.

    Attributes:
        task: ``"classification"`` (the label must not change) or ``"regression"`` (eq. 2).
        lam: ``λ > 0`` of eq. 2 (regression only).

    Example:
        >>> import torch
        >>> relation = MetamorphicRelation("regression", lam=5.0)
        >>> target = torch.tensor([0.0, 0.0, 0.0, 0.0])
        >>> source = torch.tensor([0.1, -0.1, 0.1, -0.1])  # MSE_orig 0.01: eq. 2 allows (ŷ' − y)² ≤ 0.05
        >>> relation.violations(source, torch.tensor([0.2, -0.2, 0.3, 0.0]), target).tolist()
        [False, False, True, False]
        >>> MetamorphicRelation("classification").violations(torch.eye(2), torch.eye(2).flip(1)).tolist()
        [True, True]
    """

    task: str
    lam: float = 5.0

    def __post_init__(self) -> None:
        _check_task(self.task)
        if isinstance(self.lam, Tensor):
            raise ValueError(f"lam: expected a finite number > 0, got a tensor {self.lam!r}")
        _positive_values("lam", self.lam, 0.0, strict=True, device=torch.device("cpu"))
        object.__setattr__(self, "lam", float(self.lam))

    def violations(
        self,
        source_outputs: Tensor,
        transformed_outputs: Tensor,
        target: Tensor | None = None,
        mse_orig: float | Tensor | None = None,
    ) -> Tensor:
        """Which transformed inputs violate the relation: bool ``(B,)``.

        Args:
            source_outputs: the model's outputs on the sources: logits ``(B, K)`` or predictions ``(B,)``/``(B, 1)``.
            transformed_outputs: its outputs on the transformed inputs, shaped alike.
            target: regression: the sources' labels ``(B,)`` (required); classification: unused.
            mse_orig: regression: ``MSE_orig``, the model's MSE on the source inputs of the whole probe
                set; ``None`` takes the MSE of ``source_outputs`` against ``target`` (this batch only).
        """
        if self.task == "classification":
            return _classification_violations(
                source_outputs, transformed_outputs, ("source_outputs", "transformed_outputs")
            )
        source = check_outputs("regression", source_outputs, "source_outputs")
        transformed = check_outputs("regression", transformed_outputs, "transformed_outputs")
        if source.shape != transformed.shape:
            raise ValueError(
                f"transformed_outputs: expected {source.shape[0]} predictions like source_outputs, "
                f"got {transformed.shape[0]}"
            )
        if target is None:
            raise ValueError("target: the regression relation (eq. 2) needs the sources' labels (B,), got None")
        target = _check_target(target, source.shape[0])
        if mse_orig is None:
            mse = _squared_errors(source, target).mean()
        else:
            mse = _check_mse("mse_orig", mse_orig, transformed.device)
        lam = torch.tensor(float(self.lam), dtype=torch.float64, device=transformed.device)
        return _regression_violations(_squared_errors(transformed, target), mse, lam)
