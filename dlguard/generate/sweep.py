"""The comprehensive framework's sweep: every property at every severity, then pairs for the adder."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from dlguard.augment.properties import Property
from dlguard.metrics.robustness import AdderGlobalRobustness, LocalRobustness

__all__ = ["robustness_sweep"]


def robustness_sweep(
    model: nn.Module | Callable[[Tensor], Tensor],
    images: Tensor,
    labels: Tensor,
    properties: Sequence[Property],
    local: LocalRobustness,
    adder: AdderGlobalRobustness,
    pairs: int,
    generator: torch.Generator,
    max_batch: int = 1024,
) -> dict[str, Tensor]:
    """Apply each property at each level to ``images``, feed both metrics, and return the pairs.

    The model runs on batches of at most ``max_batch`` images (call it under ``no_grad`` and in
    eval mode). ``pairs`` random input pairs per property (drawn with ``generator``) are judged by
    the adder at every level, both inputs perturbed alike.

    Returns:
        Pair records for :func:`~dlguard.report.summarize_errors`: ``property_index``, ``level``
        ``(M,)``, ``targets`` and ``predictions`` ``(M, 2)``.

    Example:
        >>> import torch
        >>> from dlguard.augment import Property
        >>> from dlguard.augment.functional import brightness_scale
        >>> prop = Property("bright", brightness_scale, (1.0, 3.0))
        >>> model = lambda x: torch.stack([x.mean((1, 2, 3)) * 0 + 0.5, x.mean((1, 2, 3))], 1)  # 1 if mean > 0.5
        >>> local, adder = LocalRobustness(2, ["bright"], 2), AdderGlobalRobustness(2, ["bright"], 2)
        >>> images, labels = torch.full((4, 1, 2, 2), 0.3), torch.zeros(4, dtype=torch.long)
        >>> records = robustness_sweep(model, images, labels, [prop], local, adder, 5, torch.Generator().manual_seed(0))
        >>> local.compute()["bright"].per_level.tolist(), records["targets"].shape
        ([1.0, 0.0], torch.Size([10, 2]))
    """
    levels = local.levels
    records: dict[str, list[Tensor]] = {"property_index": [], "level": [], "targets": [], "predictions": []}
    for index, prop in enumerate(properties):
        logits = torch.stack(
            [torch.cat([model(part) for part in prop(images, level).split(max_batch)]) for level in prop.levels]
        )
        if len(prop.levels) < levels:  # pad to the widest property; padded levels are not reported
            logits = torch.cat([logits, logits[-1:].expand(levels - len(prop.levels), -1, -1)])
        local.update(logits, labels, prop.name)
        first = torch.randint(len(labels), (pairs,), generator=generator).to(images.device)
        second = torch.randint(len(labels), (pairs,), generator=generator).to(images.device)
        for level in range(len(prop.levels)):
            predicted = logits[level].argmax(dim=1)
            pair_preds = (predicted[first], predicted[second])
            adder.update(pair_preds, (labels[first], labels[second]), prop.name, level)
            records["property_index"].append(torch.full((pairs,), index, device=images.device))
            records["level"].append(torch.full((pairs,), level, device=images.device))
            records["targets"].append(torch.stack([labels[first], labels[second]], 1))
            records["predictions"].append(torch.stack(pair_preds, 1))
    return {key: torch.cat(values) for key, values in records.items()}
