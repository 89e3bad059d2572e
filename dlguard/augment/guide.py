"""The guide protocol: an augmentation whose strength a measurement sets, applied to training batches."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

__all__ = ["Guide"]


@runtime_checkable
class Guide(Protocol):
    """``guide(images, labels) -> images``: augment a batch of inputs in pixel space, knowing their labels.

    A measuring callback sets the guide's strength from each measurement and, from then on, calls
    it on every training batch (read and written back through the batch accessor, on the device, in
    ``on_train_batch_start``). The same module works standalone in a transform pipeline.
    :class:`~dlguard.augment.ScoreGuidedPadding` (strength ``p`` from D-Score's ``v_robust``; it does
    not read the labels) and :class:`~dlguard.augment.ErrorGuidedAugmentation` (a per-class, per-
    property proposal from the robustness sweep or from the metamorphic violations) follow it; so does
    any future guide.

    Example:
        >>> import torch
        >>> from dlguard.augment import ErrorGuidedAugmentation, ScoreGuidedPadding
        >>> isinstance(ScoreGuidedPadding(), Guide), isinstance(ErrorGuidedAugmentation(), Guide)
        (True, True)
    """

    def __call__(self, images: Tensor, labels: Tensor) -> Tensor:
        """The augmented ``images`` (same shape), given their ``labels`` ``(B,)``."""
        ...
