"""Balanced sampling of correctly predicted inputs (SPEC §5): it runs the model, so it lives beside the generators."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset

from dlguard._validation import check_labels, optional_positive_int, positive_int
from dlguard.generate.outputs import correct_predictions
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

__all__ = ["BalancedSubset", "balanced_correct_subset"]


class BalancedSubset(Subset):
    """A :class:`~torch.utils.data.Subset` that also says what balanced sampling found.

    Attributes:
        found_per_class: ``{class: correctly predicted inputs available}``.
        drawn_per_class: ``{class: inputs kept}`` (``min(found, per_class)``).
    """

    def __init__(
        self,
        dataset: Dataset,
        indices: Sequence[int],
        found_per_class: dict[int, int],
        drawn_per_class: dict[int, int],
    ) -> None:
        super().__init__(dataset, indices)
        self.found_per_class = found_per_class
        self.drawn_per_class = drawn_per_class

    def __repr__(self) -> str:
        return f"BalancedSubset({len(self)} inputs, per class {self.drawn_per_class})"


def _check_labelled(dataset: Dataset) -> None:
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError as err:
        raise ValueError("dataset: expected a map-style dataset with a length") from err
    if size == 0:
        raise ValueError("dataset: is empty; balanced sampling needs labelled inputs")
    item = dataset[0]
    label = item[1] if isinstance(item, tuple | list) and len(item) >= 2 else None
    is_label = isinstance(label, int) or (isinstance(label, Tensor) and label.numel() == 1)
    if not is_label or isinstance(label, bool):
        raise ValueError(
            "dataset: expected items (input, label) with an integer label, got an item of type "
            f"{type(item).__name__}" + (f" whose second element is {type(label).__name__}" if label is not None else "")
        )


def balanced_correct_subset(
    model: nn.Module | ModelAdapter,
    dataset: Dataset,
    per_class: int = 200,
    seed: int = 0,
    *,
    max_batch: int | None = None,
    num_classes: int | None = None,
    preprocess: Callable[[Tensor], Tensor] | None = None,
    output_transform: Callable[[Any], Tensor] | None = None,
) -> BalancedSubset:
    """Keep only inputs ``model`` classifies correctly, then draw ``per_class`` of each class.

    The model runs batched on its own device and in its dtype under :func:`~dlguard.probes.evaluation`
    (left as it was afterwards), through a :class:`~dlguard.probes.ModelAdapter`. Classes with fewer
    correct inputs than ``per_class`` are used whole and a warning gives the counts; the draw is
    uniform with a fixed ``seed``. Callbacks draw their probe sets with the streaming
    :class:`~dlguard.data.ProbeSetDraw` instead, from the batches validation loads.

    Args:
        model: maps a batch to logits ``(B, K)`` (or to anything ``output_transform`` maps there), or
            a :class:`~dlguard.probes.ModelAdapter`.
        dataset: map-style dataset of ``(input, label)``.
        per_class: inputs to keep per class.
        seed: seed of the draw.
        max_batch: inputs per forward pass of the prediction pass (``None``: a memory budget,
            :func:`~dlguard.probes.default_max_batch`).
        num_classes: classes to sample (``0..num_classes-1``); default: the labels present.
        preprocess: applied to the dataset's inputs before the model (e.g. ``Normalize``).
        output_transform: adapts the model's output to logits.

    Returns:
        A :class:`BalancedSubset` ordered class by class, with ``found_per_class`` and
        ``drawn_per_class``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> x = torch.arange(8.0).reshape(8, 1)
        >>> y = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
        >>> oracle = nn.Linear(1, 2)  # predicts class 1 when x > 3.5
        >>> with torch.no_grad():
        ...     _ = oracle.weight.copy_(torch.tensor([[-1.0], [1.0]])), oracle.bias.copy_(torch.tensor([3.5, -3.5]))
        >>> subset = balanced_correct_subset(oracle, TensorDataset(x, y), per_class=2, seed=0)
        >>> subset.found_per_class, sorted(int(y[i]) for i in subset.indices)
        ({0: 2, 1: 2}, [0, 0, 1, 1])
    """
    positive_int("per_class", per_class)
    optional_positive_int("max_batch", max_batch)
    _check_labelled(dataset)
    adapter = ModelAdapter.wrap(model, preprocess, output_transform)
    device = adapter.device
    correct_parts, label_parts = [], []
    with evaluation(adapter.model):
        rows = adapter.rows_per_pass(torch.as_tensor(dataset[0][0])[None], max_batch)
    # its own generator: iterating a loader would otherwise draw a seed from the global RNG
    loader = DataLoader(dataset, batch_size=rows, shuffle=False, generator=torch.Generator())
    for number, (inputs, labels) in enumerate(loader):
        labels = torch.as_tensor(labels, device=device).reshape(-1)
        check_labels("dataset", labels, num_classes=num_classes)
        if inputs.is_floating_point() and torch.isnan(inputs).any():
            row = number * rows + int(torch.isnan(inputs).flatten(1).any(1).nonzero()[0])
            raise ValueError(f"dataset: item {row} contains NaN")
        correct_parts.append(correct_predictions(adapter, inputs, labels))
        label_parts.append(labels.long())
    correct = torch.cat(correct_parts).cpu()
    labels = torch.cat(label_parts).cpu()

    classes = range(num_classes) if num_classes is not None else labels.unique().tolist()
    generator = torch.Generator().manual_seed(seed)
    indices: list[int] = []
    found: dict[int, int] = {}
    drawn: dict[int, int] = {}
    for cls in classes:
        candidates = torch.nonzero(correct & (labels == cls)).flatten()
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:per_class]]
        indices.extend(chosen.sort().values.tolist())
        found[int(cls)], drawn[int(cls)] = len(candidates), len(chosen)
    short = {cls: count for cls, count in found.items() if count < per_class}
    if short:
        warnings.warn(
            f"balanced_correct_subset: fewer than per_class={per_class} correctly predicted inputs "
            f"for classes {short} (class: count found); those classes are used whole",
            stacklevel=2,
        )
    return BalancedSubset(dataset, indices, found, drawn)
