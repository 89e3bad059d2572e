"""Region-deletion mutants of a CNN (D-Score's mutation operator, SPEC §1), evaluated batched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from dlguard._validation import check_grid
from dlguard.probes.budget import default_max_batch
from dlguard.probes.evaluation import evaluation
from dlguard.probes.intervene import intervene
from dlguard.probes.layers import LayerSpec, resolve_layers, select_layers

__all__ = ["deletion_mutant_logits", "region_keep_masks"]


def _region_bounds(size: int, n: int) -> list[int]:
    """Grid boundaries ``round(j·size/n)``, ``j = 0..n`` (SPEC §1)."""
    return [round(j * size / n) for j in range(n + 1)]


def region_keep_masks(height: int, width: int, n: int, device: torch.device | None = None) -> Tensor:
    """Masks ``(n², H, W)``: mask ``i`` is 0 on grid region ``i`` (row-major) and 1 elsewhere.

    Region boundaries lie at ``round(j·H/n)`` and ``round(j·W/n)``; a map smaller than ``n`` has
    some empty regions, whose masks are all ones.

    Example:
        >>> region_keep_masks(3, 3, 3)[4]
        tensor([[1., 1., 1.],
                [1., 0., 1.],
                [1., 1., 1.]])
    """
    rows, cols = _region_bounds(height, n), _region_bounds(width, n)
    masks = torch.ones(n * n, height, width, device=device)
    for r in range(n):
        for c in range(n):
            masks[r * n + c, rows[r] : rows[r + 1], cols[c] : cols[c + 1]] = 0
    return masks


def deletion_mutant_logits(
    model: nn.Module,
    images: Tensor,
    n: int,
    layers: LayerSpec | None = None,
    *,
    max_batch: int | None = None,
    output_transform: Callable[[Any], Tensor] | None = None,
) -> Tensor:
    """Logits of the ``n²`` region-deletion mutants of ``model`` on ``images``: ``(n², B, K)``.

    Mutant ``i`` zeroes region ``i`` of every selected conv layer's output (all channels) in one
    forward pass. The probe batch is repeated once per mutant, each copy with its own mask, so
    all mutants run in about ``ceil(n²·B / max_batch)`` forward passes; the result equals running the
    mutants one at a time. The model runs in eval mode on its own device and is left exactly as
    it was (SPEC §0).

    Args:
        model: a network with ``Conv2d`` layers (or the ``layers`` given).
        images: ``(B, C, H, W)`` on the model's device.
        n: grid size (``n >= 2``).
        layers: conv layers to mutate; default every ``Conv2d``.
        max_batch: upper bound of the rows of one forward pass (default: a memory budget,
            :func:`~dlguard.probes.default_max_batch`).
        output_transform: adapts the model's output to logits.

    Example:
        >>> import torch
        >>> from dlguard.zoo import mnist_a
        >>> _ = torch.manual_seed(0)
        >>> deletion_mutant_logits(mnist_a(), torch.rand(5, 1, 28, 28), n=3).shape
        torch.Size([9, 5, 10])
    """
    check_grid(n)
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch: expected at least 1, got {max_batch}")
    if images.ndim != 4:
        raise ValueError(f"images: expected (B, C, H, W), got shape {tuple(images.shape)}")
    selected = select_layers(model, types=nn.Conv2d) if layers is None else resolve_layers(model, layers)

    mutants = n * n
    current: dict[str, int] = {}

    def delete_regions(_name: str, output: Tensor) -> Tensor:
        # zero region i of copy i in place: n² small slice writes instead of a full-map multiply
        tops, lefts = _region_bounds(output.shape[-2], n), _region_bounds(output.shape[-1], n)
        copies = output.view(-1, current["copies"], *output.shape[1:])
        for offset, region in enumerate(range(current["first"], current["first"] + len(copies))):
            r, c = divmod(region, n)
            copies[offset, :, :, tops[r] : tops[r + 1], lefts[c] : lefts[c + 1]] = 0
        return output

    outputs = []
    with evaluation(model), torch.no_grad():
        max_batch = max_batch or default_max_batch(model, images, selected)
        per_pass = max(1, max_batch // max(len(images), 1))
        chunk = len(images) if per_pass > 1 else max_batch  # split the images only when one copy is too big
        with intervene(model, selected, delete_regions):
            for start in range(0, len(images), chunk):
                part = images[start : start + chunk]
                rows = []
                for first in range(0, mutants, per_pass):
                    count = min(per_pass, mutants - first)
                    current.update(first=first, copies=len(part))
                    logits = model(part.repeat(count, 1, 1, 1))
                    if output_transform is not None:
                        logits = output_transform(logits)
                    rows.append(logits.reshape(count, len(part), -1))
                outputs.append(torch.cat(rows))
    return torch.cat(outputs, dim=1)
