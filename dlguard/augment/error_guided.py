"""Error-guided augmentation: each property applied to each class as often as it fails (SPEC §5, §6)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dlguard.augment.properties import Property, default_properties

__all__ = ["ErrorGuidedAugmentation"]


class ErrorGuidedAugmentation(nn.Module):
    """Apply property ``p`` to a sample of class ``c`` with probability ``proposal[c][p]``.

    The proposal comes from an :class:`~dlguard.report.ErrorSummary` (probabilities proportional
    to the failure rate of each class under each property); each chosen sample gets a severity
    level drawn uniformly from the property's levels. Properties are applied one after another,
    so a sample may receive several. Until a proposal is set, the module leaves images unchanged.
    :class:`~dlguard.callbacks.RobustnessCallback` updates it after every measurement and applies
    it to training batches on the device; standalone, call ``aug(images, labels)``.

    Args:
        properties: the properties the proposal's columns refer to.

    Example:
        >>> import torch
        >>> from dlguard.augment import Property
        >>> from dlguard.augment.functional import brightness_scale
        >>> aug = ErrorGuidedAugmentation([Property("brightness", brightness_scale, (2.0,))])
        >>> aug.set_proposal([[0.0], [1.0]])  # class 1 always brightened, class 0 never
        >>> aug(torch.full((2, 1, 2, 2), 0.25), torch.tensor([0, 1]))[:, 0, 0, 0].tolist()
        [0.25, 0.5]
    """

    def __init__(self, properties: Sequence[Property] | None = None) -> None:
        super().__init__()
        self.properties = list(properties) if properties is not None else default_properties()
        if not self.properties:
            raise ValueError("properties: expected at least one property")
        self.register_buffer("proposal", torch.zeros(0, len(self.properties)))

    def set_proposal(self, proposal: Tensor | Sequence[Sequence[float]]) -> None:
        """Set ``proposal[class][property]`` probabilities in ``[0, 1]``."""
        table = torch.as_tensor(proposal, dtype=torch.float32)
        if table.ndim != 2 or table.shape[1] != len(self.properties):
            raise ValueError(f"proposal: expected (classes, {len(self.properties)}), got {tuple(table.shape)}")
        if table.isnan().any() or (table < 0).any() or (table > 1).any():
            raise ValueError("proposal: expected probabilities in [0, 1]")
        self.proposal = table.to(self.proposal.device)

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        """Augment ``images`` ``(B, C, H, W)`` according to their ``labels`` ``(B,)``."""
        if self.proposal.numel() == 0:
            return images
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels: expected shape ({images.shape[0]},), got {tuple(labels.shape)}")
        if labels.numel() and (labels.min() < 0 or labels.max() >= self.proposal.shape[0]):
            raise ValueError(f"labels: expected classes in 0..{self.proposal.shape[0] - 1}")
        chances = self.proposal.to(images.device)[labels.long()]  # (B, properties)
        chosen = torch.rand(chances.shape, device=images.device) < chances
        out = images
        for index, prop in enumerate(self.properties):
            rows = torch.nonzero(chosen[:, index]).flatten()
            if rows.numel() == 0:
                continue
            levels = torch.tensor(prop.levels, dtype=images.dtype, device=images.device)
            level = levels[torch.randint(len(levels), (rows.numel(),), device=images.device)]
            out = out.clone() if out is images else out
            out[rows] = prop(out[rows], level)
        return out
