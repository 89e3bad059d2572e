"""One D-Score measurement (SPEC §1): the model, its ``n²`` region-deletion mutants and ``n²`` translated sets."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dlguard import _distributed
from dlguard._validation import check_images, check_labels, check_translation, positive_int
from dlguard.augment.functional.translate import region_translations
from dlguard.metrics.dscore import DScore
from dlguard.metrics.functional.dscore import DScoreResult
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation
from dlguard.probes.layers import LayerSpec, resolve_layers, select_layers
from dlguard.probes.region_deletion import default_max_batch, deletion_mutant_logits

__all__ = ["dscore_layers", "logit_width", "measure_dscore"]


def dscore_layers(model: nn.Module, layers: LayerSpec | None = None) -> dict[str, nn.Module]:
    """The layers D-Score mutates: ``layers``, or every ``Conv2d`` (a clear error listing the model's layers)."""
    return select_layers(model, types=nn.Conv2d) if layers is None else resolve_layers(model, layers)


def logit_width(adapter: ModelAdapter, inputs: Tensor) -> int:
    """``K``, the width of the model's logits, agreed by every process (also one whose shard is empty).

    Runs the model on one input; a collective under DDP.
    """
    width = 0
    if len(inputs):
        with evaluation(adapter.model), torch.no_grad():
            width = adapter.logits(inputs[:1]).shape[1]
    return int(_distributed.gather_cat(torch.tensor([width], device=inputs.device)).max())


def measure_dscore(
    model: nn.Module | ModelAdapter,
    images: Tensor,
    target: Tensor,
    n: int = 3,
    t: int = 5,
    layers: LayerSpec | None = None,
    *,
    num_classes: int | None = None,
    max_batch: int | None = None,
) -> DScoreResult:
    """D-Score of ``model`` on probe ``images`` (pixels in ``[0, 1]``) with labels ``target``.

    Runs the unmodified model, all ``n²`` region-deletion mutants of ``layers`` (batched,
    :func:`~dlguard.probes.deletion_mutant_logits`) and the model on the ``n²`` padding translations
    of the images (SPEC §1), in eval mode, leaving the model exactly as found. Under DDP each process
    passes its shard of the probe set; the counts are summed over processes (a collective: every
    process must call this), so the result is the one of the whole probe set.

    Args:
        model: the network, or a :class:`~dlguard.probes.ModelAdapter` with its ``preprocess`` and
            ``output_transform`` (translation happens in pixel space, ``preprocess`` after it).
        images: ``(B, C, H, W)`` in ``[0, 1]``.
        target: ``(B,)`` labels.
        n: grid size (``>= 2``).
        t: padding step divisor of the translation (``> 1``).
        layers: conv layers to mutate; default every ``Conv2d``.
        num_classes: ``K``; default the width of the model's logits.
        max_batch: rows per forward pass (default: a memory budget, see
            :func:`~dlguard.probes.region_deletion.default_max_batch`).

    Returns:
        :class:`~dlguard.metrics.functional.DScoreResult`, including the accuracies it came from.

    Example:
        >>> import torch
        >>> from dlguard.zoo import pretrained
        >>> from dlguard.data import MNISTDataModule
        >>> dm = MNISTDataModule()
        >>> dm.setup()
        >>> images = torch.stack([dm.val_set[i][0] for i in range(200)])
        >>> target = torch.tensor([dm.val_set[i][1] for i in range(200)])
        >>> result = measure_dscore(pretrained("mnist_a"), images, target, n=3)
        >>> float(result.baseline_accuracy) > 0.9, 0 < float(result.d_score) < float(result.v_fitness) < 1
        (True, True)
    """
    check_translation(n, t)
    if max_batch is not None:
        positive_int("max_batch", max_batch)
    adapter = model if isinstance(model, ModelAdapter) else ModelAdapter(model)
    check_images(images)
    check_labels("target", target, batch=len(images))
    selected = dscore_layers(adapter.model, layers)
    images, target = images.to(adapter.device), target.to(adapter.device)
    classes = num_classes or logit_width(adapter, images)
    check_labels("target", target, num_classes=classes)
    with evaluation(adapter.model), torch.no_grad():
        prepared = adapter.prepare(images)
        baseline = adapter.logits(images, max_batch, classes) if len(images) else None
        metric = DScore(n, classes).to(images.device)
        if baseline is not None:
            rows = max_batch or default_max_batch(adapter.model, prepared, selected)
            mutants = deletion_mutant_logits(
                adapter.model, prepared, n, selected, max_batch=rows, output_transform=adapter.finish
            )
            translated = adapter.logits(region_translations(images, n, t).flatten(0, 1), rows)
            metric.update(baseline, mutants, translated.reshape(n * n, *baseline.shape), target)
        return metric.compute()
