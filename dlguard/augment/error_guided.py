"""Error-guided augmentation: each property applied to each class as often as it fails (SPEC §5, §6)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from dlguard._validation import check_labels, probability
from dlguard.augment.functional._inputs import values_trusted
from dlguard.augment.properties import Property, default_properties

__all__ = ["ErrorGuidedAugmentation", "guide_p", "proposal_from_rates", "rates_with_prior"]


def rates_with_prior(rates: Tensor, counts: Tensor, wanted: Tensor | float) -> Tensor:
    """Each class's failure rates with the inputs it lacks counted at the rate pooled over all classes.

    A class measured on ``n`` of the ``wanted`` inputs it should hold gets
    ``(n · rate + (wanted − n) · pooled) / wanted`` under each property, ``pooled`` being the property's
    failure rate over every measured input, ``Σ n_c · rate_c / Σ n_c``; a class with ``n >= wanted``
    keeps its own rate. A class without inputs -- one the model does not get right yet, so no probe
    input qualified -- gets the pooled rate rather than 0: its absence is no evidence that it never
    fails, and a proposal of 0 would keep the guide off it until the next measurement. ``wanted`` one
    more than ``counts`` is a pseudo-input at the pooled rate for every class, as the metamorphic
    violation guide uses.

    Args:
        rates: ``(classes, properties)`` failure rates; rows of classes without inputs may be NaN.
        counts: inputs behind each rate, ``(classes,)`` or ``(classes, properties)``, non-negative.
        wanted: inputs each class should hold, a number, ``(classes,)`` or ``(classes, properties)``;
            a class wanting none still gets the pooled rate when it has no inputs.

    Example:
        >>> import torch
        >>> rates = torch.tensor([[0.5], [0.25], [float("nan")]], dtype=torch.float64)
        >>> counts = torch.tensor([4.0, 2.0, 0.0], dtype=torch.float64)  # pooled (2 + 0.5) / 6 = 5/12
        >>> [round(v, 3) for v in rates_with_prior(rates, counts, 4).flatten().tolist()]
        [0.5, 0.333, 0.417]
    """
    if not isinstance(rates, Tensor) or rates.ndim != 2:
        raise ValueError(f"rates: expected a (classes, properties) tensor, got {getattr(rates, 'shape', rates)!r}")

    def per_cell(name: str, values: Tensor | float) -> Tensor:  # (classes,) per class, or one per cell
        values = torch.as_tensor(values, device=rates.device)
        if values.shape not in {(), rates.shape[:1], rates.shape}:
            raise ValueError(
                f"{name}: expected one count per class {tuple(rates.shape[:1])} or per cell {tuple(rates.shape)}, "
                f"got shape {tuple(values.shape)}"
            )
        if (values != values.round()).any() or (values < 0).any():
            raise ValueError(f"{name}: expected whole, non-negative input counts")
        return (values.unsqueeze(1) if values.ndim == 1 else values).to(rates.dtype).expand_as(rates)

    n, full = per_cell("counts", counts), per_cell("wanted", wanted).clamp(min=1)
    if (rates[n > 0].isnan() | (rates[n > 0] < 0)).any():
        raise ValueError("rates: expected non-negative failure rates without NaN where a class has inputs")
    observed = (rates.nan_to_num(0.0) * n).where(n > 0, 0.0)
    pooled = observed.sum(0) / n.sum(0).clamp(min=1)  # (P,) the property's rate over every measured input
    held = torch.maximum(n, full)
    return (observed + (held - n) * pooled) / held


def proposal_from_rates(rates: Tensor) -> Tensor:
    """``proposal[class][property]`` from failure rates: the weakest cell 1, every other cell its rate relative to it.

    The shape of an :class:`ErrorGuidedAugmentation` proposal as the error summary, the robustness loop and
    the metamorphic violation guide make it: how often each class fails under each property, scaled so
    that the largest rate is 1 (all zeros when nothing failed), in the rates' dtype and device.

    Args:
        rates: ``(classes, properties)`` failure rates, non-negative, without NaN.

    Example:
        >>> import torch
        >>> proposal_from_rates(torch.tensor([[0.1, 0.4], [0.2, 0.0]], dtype=torch.float64)).tolist()
        [[0.25, 1.0], [0.5, 0.0]]
    """
    if not isinstance(rates, Tensor) or rates.ndim != 2:
        raise ValueError(f"rates: expected a (classes, properties) tensor, got {getattr(rates, 'shape', rates)!r}")
    if rates.numel() and (rates.isnan().any() or (rates < 0).any()):
        raise ValueError("rates: expected non-negative failure rates without NaN")
    top = float(rates.max()) if rates.numel() else 0.0
    return (rates / top).clamp(0, 1) if top > 0 else torch.zeros_like(rates)


class ErrorGuidedAugmentation(nn.Module):
    """Apply property ``p`` to a sample of class ``c`` with probability ``strength · proposal[c][p]``.

    The proposal comes from an :class:`~dlguard.report.ErrorSummary` (probabilities proportional
    to the failure rate of each class under each property); each chosen sample gets a severity
    level drawn uniformly from the property's levels. Properties are applied one after another,
    so a sample may receive several. Until a proposal is set, the module leaves images unchanged.
    :class:`~dlguard.callbacks.RobustnessCallback` (from its error summary) and
    :class:`~dlguard.callbacks.MetamorphicCallback` (from each class's violation rates) update it after
    every measurement and apply it to training batches on the device; standalone, call ``aug(images, labels)``.

    No host sync on an accelerator's training path: each property is applied to the whole batch and
    kept where chosen (``torch.where``), and the checks that read values (labels within the
    proposal's classes, inputs in range) run on the first call after :meth:`set_proposal` (or a loaded
    state) only. Properties whose op groups inputs by value (the blurs' per-sample kernel sizes, rain's
    drop count) still sync inside the op; the default trio does not. On the CPU, where reading a value
    costs nothing, each deterministic property transforms only the rows that drew it (``rows_only``):
    at the small probabilities a proposal gives most cells that saves work (the nine label-preserving
    properties at probability 0.03 on ``mnist_a``'s batches of 64: 2.5 ms a call against 4.5 ms on the
    whole batch, beside a 2.4 ms training step; even from 0.3 up; ``benchmarks/error_guided.py``, 2 CPU
    cores). Properties that draw random numbers (noise, fog, rain: keyed
    ones get no keys on the training path and draw from the global RNG, which a callback seeds from a
    generator of its own, in its checkpoint) transform the whole batch on either path, so a call draws
    the same numbers whatever the proposal and both paths give the same images.

    **Strength.** An error summary's proposal gives its weakest class x property cell probability 1:
    applied as it stands, every training sample of that class is perturbed, often by several
    properties at their harshest, and the model no longer sees the class as it comes. ``strength``
    (default 0.5) scales the proposal, so every class keeps at least half of its samples free of each
    property; the proposal's shape -- which class, under which property -- is the measurement's.
    On ``mnist_a`` (3 seeds, :class:`~dlguard.callbacks.FailureReplay`'s ``repeats=1`` dose), at 1.0 the
    robustness loop cost 3.6 points of clean accuracy and 2.9 of mean corruption accuracy against plain
    training (``python benchmarks/closed_loop.py --arms plain robustness --guide strength=1.0``); at 0.5,
    1.4 and 0.9 points.

    Args:
        properties: the properties the proposal's columns refer to (default:
            :func:`~dlguard.augment.default_properties`).
        strength: the probability of the weakest cell, in ``[0, 1]``, the proposal's scale.
        rows_only: a deterministic property transforms only the rows that drew it (``True``; a host sync
            per property) or the whole batch, keeping the chosen rows (``False``); ``None``: ``True`` on
            the CPU only. The images are the same either way.

    Example:
        >>> import torch
        >>> from dlguard.augment import Property
        >>> from dlguard.augment.functional import brightness_scale
        >>> aug = ErrorGuidedAugmentation([Property("brightness", brightness_scale, (2.0,))], strength=1.0)
        >>> aug.set_proposal([[0.0], [1.0]])  # class 1 always brightened, class 0 never
        >>> aug(torch.full((2, 1, 2, 2), 0.25), torch.tensor([0, 1]))[:, 0, 0, 0].tolist()
        [0.25, 0.5]
    """

    proposal: Tensor
    level_table: Tensor
    level_counts: Tensor

    def __init__(
        self, properties: Sequence[Property] | None = None, strength: float = 0.5, rows_only: bool | None = None
    ) -> None:
        super().__init__()
        self.strength = probability("strength", strength)
        if rows_only is not None and not isinstance(rows_only, bool):
            raise ValueError(f"rows_only: expected True, False or None, got {rows_only!r}")
        self.rows_only = rows_only
        self.properties = list(properties) if properties is not None else default_properties()
        if not self.properties or not all(isinstance(p, Property) for p in self.properties):
            raise ValueError(f"properties: expected at least one Property, got {self.properties!r}")
        self.register_buffer("proposal", torch.zeros(0, len(self.properties)))
        # each property's levels, padded to the longest: levels are drawn on the device, no copy per call
        width = max(len(p.levels) for p in self.properties)
        table = torch.tensor([list(p.levels) + [p.levels[-1]] * (width - len(p.levels)) for p in self.properties])
        self.register_buffer("level_table", table, persistent=False)
        self.register_buffer("level_counts", torch.tensor([len(p.levels) for p in self.properties]), persistent=False)
        self._check_pending = True

    def set_proposal(self, proposal: Tensor | Sequence[Sequence[float]]) -> None:
        """Set ``proposal[class][property]`` probabilities in ``[0, 1]``; the next call validates its inputs."""
        with torch.inference_mode(False):  # a table made under inference mode could not be updated later
            table = torch.as_tensor(proposal, dtype=torch.float32).clone()
        if table.ndim != 2 or table.shape[1] != len(self.properties):
            raise ValueError(f"proposal: expected (classes, {len(self.properties)}), got {tuple(table.shape)}")
        if table.isnan().any() or (table < 0).any() or (table > 1).any():
            raise ValueError("proposal: expected probabilities in [0, 1]")
        self.proposal = table.to(self.proposal.device)
        self._check_pending = True

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        incoming = state_dict.get(prefix + "proposal")
        if isinstance(incoming, Tensor) and incoming.ndim == 2 and incoming.shape[1] == len(self.properties):
            # the number of classes is the checkpoint's (a fresh module has none yet)
            self.proposal = self.proposal.new_zeros(incoming.shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._check_pending = True

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        """Augment ``images`` ``(B, C, H, W)`` (or ``(B, ...)`` for properties that take any tensor) by ``labels``."""
        if self.proposal.numel() == 0:
            return images
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels: expected shape ({images.shape[0]},), got {tuple(labels.shape)}")
        if self._check_pending:  # a new proposal: check labels and, through the ops, the inputs, once
            check_labels("labels", labels, num_classes=self.proposal.shape[0])
            out = self._augment(images, labels, rows_only=False)  # every input goes through the ops' checks
            self._check_pending = False
            return out
        with values_trusted():
            return self._augment(images, labels)

    def _augment(self, images: Tensor, labels: Tensor, rows_only: bool | None = None) -> Tensor:
        device = images.device
        chances = self.strength * self.proposal.to(device)[labels.to(device).long()]  # (B, properties)
        chosen = torch.rand(chances.shape, device=device) < chances
        # a level index per sample and property, uniform over that property's levels
        picks = (torch.rand(chances.shape, device=device) * self.level_counts.to(device)).long()
        picks = torch.minimum(picks, self.level_counts.to(device) - 1)
        levels = self.level_table.to(device=device, dtype=images.dtype).T.gather(0, picks)  # (B, properties)
        out = images
        rows_only = self.rows_only if rows_only is None else rows_only
        rows_only = rows_only or (rows_only is None and device.type == "cpu")
        shape = (-1, *([1] * (images.ndim - 1)))
        for index, prop in enumerate(self.properties):
            if rows_only and prop.deterministic:  # draws nothing: the rows that drew it alone
                rows = chosen[:, index].nonzero().flatten()
                if len(rows):
                    out = out.clone() if out is images else out  # the caller's batch stays as it was
                    out[rows] = prop(out[rows], levels[rows, index])
            else:  # the whole batch, so that what it draws does not depend on the rows chosen
                out = torch.where(chosen[:, index].reshape(shape), prop(out, levels[:, index]), out)
        return out


def guide_p(guide: ErrorGuidedAugmentation) -> float:
    """The probability ``guide`` applies a property to a row, mean over its classes and properties.

    What a callback that sets the proposal logs as ``<prefix>/guide_p``. A row may get several properties,
    each with its own probability, so the chance it gets any is up to ``len(properties)`` times this.

    Args:
        guide: the guide whose proposal to read.

    Returns:
        ``strength · mean(proposal)``; ``0.0`` while no proposal is set.

    Example:
        >>> from dlguard.augment import Property
        >>> from dlguard.augment.functional import brightness_scale
        >>> guide = ErrorGuidedAugmentation([Property("brightness", brightness_scale, (2.0,))], strength=0.5)
        >>> guide_p(guide)
        0.0
        >>> guide.set_proposal([[0.0], [1.0], [0.5], [0.5]])
        >>> guide_p(guide)
        0.25
    """
    return guide.strength * float(guide.proposal.mean()) if guide.proposal.numel() else 0.0
