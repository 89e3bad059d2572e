"""Error summarization of the comprehensive framework (SPEC §5).

From the adder's failed pairs to the classes and properties that cause them, and a proposal for
error-guided augmentation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from dlguard._validation import check_combine, check_labels, positive_int
from dlguard.augment.error_guided import proposal_from_rates, rates_with_prior
from dlguard.metrics.functional.robustness import digit_sum

__all__ = ["ErrorSummary", "summarize_errors"]


@dataclass
class ErrorSummary:
    """What failed, where, and what to train on more. Plain Python values: ``json.dumps``-ready.

    Attributes:
        properties: property names, in the order of ``failure_rate``'s columns.
        num_classes: number of classes.
        pairs: pairs evaluated; ``failed_pairs``: pairs whose combined prediction was wrong.
        failure_rate: ``[class][property]``: share of that class's inputs mispredicted under the property.
        confusions: ``[{"true", "predicted", "property", "count"}]`` among the failed pairs, most first.
        ranked_cells: ``[{"class", "property", "share"}]``: share of failed pairs in which an input of
            that class was mispredicted under that property, largest first.
        failures: per failed pair ``{"property", "level", "targets", "predictions", "mispredicted"}``;
            keyword-only and empty by default, so a summary saved with ``to_dict(include_failures=False)``
            is restored by ``ErrorSummary(**saved)``.
        proposal: ``[class][property]`` augmentation probability, proportional to the failure
            rate (the weakest cell gets 1), for :class:`~dlguard.augment.ErrorGuidedAugmentation`; a
            cell no pair held an input of takes the property's rate over all classes, not 0.
    """

    properties: list[str]
    num_classes: int
    pairs: int
    failed_pairs: int
    failure_rate: list[list[float]]
    confusions: list[dict[str, Any]]
    ranked_cells: list[dict[str, Any]]
    proposal: list[list[float]]
    failures: list[dict[str, Any]] = field(default_factory=list, repr=False, kw_only=True)

    def to_dict(self, include_failures: bool = True) -> dict[str, Any]:
        """The summary as plain Python values (``json.dumps``-ready), fields in declaration order.

        Args:
            include_failures: keep the per-pair ``failures`` list (one entry per failed pair); leave
                it out for a compact record such as a checkpoint's.

        Example:
            >>> import torch
            >>> zero = torch.zeros(1, dtype=torch.long)
            >>> summary = summarize_errors(["noise"], zero, zero, torch.tensor([[5, 1]]), torch.tensor([[6, 1]]), 10)
            >>> len(summary.to_dict()["failures"]), "failures" in summary.to_dict(include_failures=False)
            (1, False)
            >>> ErrorSummary(**summary.to_dict(include_failures=False)).failed_pairs
            1
        """
        if not isinstance(include_failures, bool):
            raise ValueError(f"include_failures: expected a bool, got {include_failures!r}")
        record = asdict(self)
        if not include_failures:
            del record["failures"]
        return record

    def to_json(self, **kwargs: Any) -> str:
        """The summary, failures included, as JSON (``kwargs`` go to :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), **kwargs)

    def plot_failure_rates(self) -> Any:
        """Heatmap of the failure rate per class (rows) and property (columns); returns the figure."""
        import numpy as np
        from matplotlib.figure import Figure

        rates = np.asarray(self.failure_rate)
        figure = Figure(figsize=(1.2 * len(self.properties) + 2.5, 4.2), layout="constrained")
        ax = figure.subplots()
        image = ax.imshow(rates, cmap="magma_r", vmin=0, vmax=max(float(rates.max()), 1e-9), aspect="auto")
        for (row, col), value in np.ndenumerate(rates):
            ax.text(col, row, f"{100 * value:.0f}", ha="center", va="center", fontsize=7,
                    color="white" if value > rates.max() / 2 else "black")  # fmt: skip
        ax.set_xticks(range(len(self.properties)), self.properties)
        ax.set_yticks(range(self.num_classes))
        ax.set_ylabel("class")
        ax.set_title("failure rate (%) per class and property", fontsize=9)
        figure.colorbar(image, ax=ax, shrink=0.8)
        return figure

    def plot_top_confusions(self, top: int = 10) -> Any:
        """Horizontal bars of the ``top`` most frequent ``true → predicted (property)`` confusions."""
        from matplotlib.figure import Figure

        shown = self.confusions[: positive_int("top", top)][::-1]
        figure = Figure(figsize=(5, 0.3 * max(len(shown), 1) + 1.2), layout="constrained")
        ax = figure.subplots()
        ax.barh([f"{c['true']} → {c['predicted']} ({c['property']})" for c in shown], [c["count"] for c in shown])
        ax.set_xlabel("mispredicted inputs in failed pairs")
        ax.set_title("top confusions", fontsize=9)
        return figure

    def to_markdown(self, top: int = 10) -> str:
        """A readable report: totals, the ``top`` weakest cells and confusions, the failure-rate table."""
        top = positive_int("top", top)
        lines = [
            "# Error summary",
            "",
            f"{self.failed_pairs} of {self.pairs} pairs failed ({100 * self.failed_pairs / max(self.pairs, 1):.1f} %).",
            "",
            "## Weakest (class, property) cells",
            "",
            "| class | property | share of failed pairs |",
            "| --- | --- | --- |",
            *(f"| {c['class']} | {c['property']} | {100 * c['share']:.1f} % |" for c in self.ranked_cells[:top]),
            "",
            "## Top confusions",
            "",
            "| true → predicted | property | count |",
            "| --- | --- | --- |",
            *(f"| {c['true']} → {c['predicted']} | {c['property']} | {c['count']} |" for c in self.confusions[:top]),
            "",
            "## Failure rate per class and property",
            "",
            "| class | " + " | ".join(self.properties) + " |",
            "| --- | " + " | ".join("---" for _ in self.properties) + " |",
            *(
                f"| {cls} | " + " | ".join(f"{100 * rate:.1f} %" for rate in rates) + " |"
                for cls, rates in enumerate(self.failure_rate)
            ),
        ]
        return "\n".join(lines) + "\n"


def summarize_errors(
    properties: Sequence[str],
    property_index: Tensor,
    level: Tensor,
    targets: Tensor,
    predictions: Tensor,
    num_classes: int,
    combine: Callable[[Tensor, Tensor], Tensor] = digit_sum,
) -> ErrorSummary:
    """Summarize the failures of the adder's pairs (SPEC §5, error summarization).

    Args:
        properties: distinct property names (or :class:`~dlguard.augment.Property` objects);
            ``property_index`` refers to them.
        property_index: ``(M,)`` the property each pair was perturbed with.
        level: ``(M,)`` the severity level index of each pair (``>= 0``).
        targets: ``(M, 2)`` true labels in ``[0, C)`` of both inputs of each pair.
        predictions: ``(M, 2)`` predicted labels in ``[0, C)``.
        num_classes: ``C`` (at least 2).
        combine: the adder's combination; the default, the sum of two digits, needs ``C = 10``.

    Returns:
        An :class:`ErrorSummary`.

    Example:
        >>> import torch
        >>> targets = torch.tensor([[5, 1], [5, 2], [3, 4]])
        >>> predictions = torch.tensor([[6, 1], [5, 2], [3, 4]])  # the 5 of the first pair read as 6
        >>> summary = summarize_errors(["noise"], torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long),
        ...                            targets, predictions, num_classes=10)
        >>> summary.failed_pairs, summary.ranked_cells[0], summary.confusions[0]["predicted"]
        (1, {'class': 5, 'property': 'noise', 'share': 1.0}, 6)
    """
    names = [getattr(p, "name", p) for p in properties] if isinstance(properties, Sequence) else None
    if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"properties: expected distinct property names, got {properties!r}")
    num_classes = positive_int("num_classes", num_classes, minimum=2)
    check_combine(combine, num_classes)
    for name, tensor in (("targets", targets), ("predictions", predictions)):
        if not isinstance(tensor, Tensor) or tensor.ndim != 2 or tensor.shape[1] != 2:
            shape = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
            raise ValueError(f"{name}: expected shape (M, 2), got {shape}")
    count = targets.shape[0]
    if predictions.shape[0] != count:
        raise ValueError(f"predictions: expected shape ({count}, 2), got {tuple(predictions.shape)}")
    for name, tensor in (("property_index", property_index), ("level", level)):
        if (
            not isinstance(tensor, Tensor)
            or tensor.shape != (count,)
            or tensor.is_floating_point()
            or tensor.is_complex()
            or tensor.dtype == torch.bool
        ):
            got = f"{tensor.dtype} {tuple(tensor.shape)}" if isinstance(tensor, Tensor) else type(tensor).__name__
            raise ValueError(f"{name}: expected integer indices of shape ({count},), got {got}")
    check_labels("targets", targets.flatten(), num_classes=num_classes)
    check_labels("predictions", predictions.flatten(), num_classes=num_classes)
    if count and (int(property_index.min()) < 0 or int(property_index.max()) >= len(names)):
        raise ValueError(
            f"property_index: expected indices into {names}, got values in "
            f"[{int(property_index.min())}, {int(property_index.max())}]"
        )
    if count and int(level.min()) < 0:
        raise ValueError(f"level: expected severity level indices >= 0, got {int(level.min())}")
    targets, predictions = targets.long().cpu(), predictions.long().cpu()
    property_index, level = property_index.long().cpu(), level.long().cpu()

    predicted, true = combine(predictions[:, 0], predictions[:, 1]), combine(targets[:, 0], targets[:, 1])
    if not all(isinstance(c, Tensor) and c.shape == (count,) for c in (predicted, true)):
        raise ValueError(f"combine: expected one combined label per pair ({count},)")
    failed = predicted != true
    wrong = predictions != targets  # (M, 2): which input of each pair was mispredicted
    # per input: class x property mispredictions over all pairs
    cell = targets * len(names) + property_index.unsqueeze(1)
    cells = num_classes * len(names)
    seen = torch.bincount(cell.flatten(), minlength=cells).view(num_classes, len(names))
    missed = torch.bincount(cell.flatten(), weights=wrong.flatten().double(), minlength=cells).view(num_classes, -1)
    failure_rate = torch.where(seen > 0, missed / seen.clamp(min=1), 0.0)

    # failed pairs: which cells took part with a mispredicted input (a pair counts once per cell)
    blamed = torch.zeros(num_classes, len(names), dtype=torch.float64)
    for index in torch.nonzero(failed).flatten().tolist():
        for cls in {int(targets[index, k]) for k in range(2) if wrong[index, k]}:
            blamed[cls, property_index[index]] += 1
    failed_pairs = int(failed.sum())
    share = blamed / max(failed_pairs, 1)
    order = torch.argsort(share.flatten(), descending=True, stable=True)
    ranked = [
        {"class": int(i) // len(names), "property": names[int(i) % len(names)], "share": float(share.flatten()[i])}
        for i in order
        if share.flatten()[i] > 0
    ]

    confusion_counts: dict[tuple[int, int, str], int] = {}
    records = []
    for index in torch.nonzero(failed).flatten().tolist():
        prop = names[int(property_index[index])]
        for k in range(2):
            if wrong[index, k]:
                key = (int(targets[index, k]), int(predictions[index, k]), prop)
                confusion_counts[key] = confusion_counts.get(key, 0) + 1
        records.append(
            {
                "property": prop,
                "level": int(level[index]),
                "targets": targets[index].tolist(),
                "predictions": predictions[index].tolist(),
                "mispredicted": wrong[index].tolist(),
            }
        )
    confusions = [
        {"true": t, "predicted": p, "property": prop, "count": n}
        for (t, p, prop), n in sorted(confusion_counts.items(), key=lambda item: (-item[1], item[0]))
    ]
    proposal = proposal_from_rates(rates_with_prior(failure_rate, seen, 1))  # a cell without inputs: the pooled rate
    return ErrorSummary(
        properties=names,
        num_classes=num_classes,
        pairs=count,
        failed_pairs=failed_pairs,
        failure_rate=failure_rate.tolist(),
        confusions=confusions,
        ranked_cells=ranked,
        failures=records,
        proposal=proposal.tolist(),
    )
