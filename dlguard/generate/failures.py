"""Failures a generator found, with the labels they should get: what a failure bank stores and replays."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from torch import Tensor

__all__ = ["Failures"]


@dataclass
class Failures:
    """Inputs the model failed on, each with the label training should teach for it.

    Unpacks as ``(inputs, labels)``, so a callback deposits them with
    ``bank.add(*run.failures, origin=...)``.

    Attributes:
        inputs: ``(F, ...)`` the failing inputs (perturbed, transformed, adversarial...).
        labels: ``(F, ...)`` their labels: the source's class, or its target value for regression.

    Example:
        >>> import torch
        >>> failures = Failures(torch.zeros(2, 1, 4, 4), torch.tensor([3, 5]))
        >>> inputs, labels = failures
        >>> len(failures), labels.tolist()
        (2, [3, 5])
    """

    inputs: Tensor
    labels: Tensor

    def __iter__(self) -> Iterator[Tensor]:
        yield self.inputs
        yield self.labels

    def __len__(self) -> int:
        return len(self.labels)
