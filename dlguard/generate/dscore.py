"""One D-Score test (SPEC §1): the model, its ``n²`` region-deletion mutants and ``n²`` translated sets."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dlguard._validation import (
    check_images,
    check_labels,
    check_translation,
    optional_positive_int,
)
from dlguard.augment.functional.translate import region_translations
from dlguard.generate.outputs import check_num_classes, logit_width
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.budget import default_max_batch
from dlguard.probes.evaluation import evaluation
from dlguard.probes.layers import LayerSpec, resolve_layers, select_layers
from dlguard.probes.region_deletion import deletion_mutant_logits

__all__ = ["DScoreRun", "dscore_layers", "dscore_test"]


@dataclass
class DScoreRun:
    """What one D-Score test ran, on this process's shard of the probe set.

    Feed it to :class:`~dlguard.metrics.DScore` (``update(run.logits, run.mutant_logits,
    run.translated_logits, run.target)``); its counts sum over processes, so ``compute()`` gives the
    D-Score of the whole probe set.

    Attributes:
        inputs: ``(B, C, H, W)`` the probe images, on the model's device.
        target: ``(B,)`` their labels.
        logits: ``(B, K)`` the unmodified model's logits.
        mutant_logits: ``(n², B, K)`` the region-deletion mutants' logits.
        translated_logits: ``(n², B, K)`` the model's logits on the ``n²`` padding translations.
        num_classes: ``K``, agreed by every process.
    """

    inputs: Tensor
    target: Tensor
    logits: Tensor
    mutant_logits: Tensor
    translated_logits: Tensor
    num_classes: int


def dscore_layers(model: nn.Module, layers: LayerSpec | None = None) -> dict[str, nn.Module]:
    """The layers D-Score mutates: ``layers``, or every ``Conv2d`` (a clear error listing the model's layers)."""
    return select_layers(model, types=nn.Conv2d) if layers is None else resolve_layers(model, layers)


def dscore_test(
    model: nn.Module | ModelAdapter,
    images: Tensor,
    target: Tensor,
    n: int = 3,
    t: int = 5,
    layers: LayerSpec | None = None,
    *,
    num_classes: int | None = None,
    max_batch: int | None = None,
    validate_args: bool = True,
) -> DScoreRun:
    """Run ``model``, its ``n²`` region-deletion mutants and its ``n²`` padding translations on probe ``images``.

    The mutants zero region ``i`` of every selected conv layer's output
    (:func:`~dlguard.probes.deletion_mutant_logits`, batched); the translations pad each image
    towards region ``i`` and resize it back (SPEC §1). The model runs in eval mode and is left
    exactly as found. Under DDP each process passes its shard of the probe set (the logits' width is
    agreed by a collective: every process must call this); the run holds the shard's logits.

    Args:
        model: the network, or a :class:`~dlguard.probes.ModelAdapter` with its ``preprocess`` and
            ``output_transform`` (translation happens in pixel space, ``preprocess`` after it).
        images: ``(B, C, H, W)`` in ``[0, 1]``.
        target: ``(B,)`` labels.
        n: grid size (``>= 2``).
        t: padding step divisor of the translation (``> 1``).
        layers: conv layers to mutate; default every ``Conv2d``.
        num_classes: ``K``; default the width of the model's logits (checked against it when given).
        max_batch: rows per forward pass (default: a memory budget of the selected conv layers'
            outputs, :func:`~dlguard.probes.default_max_batch`).
        validate_args: check the images' values (range, NaN) and the labels' range; callers that
            checked them already (a callback's probe set) pass ``False``.

    Returns:
        A :class:`DScoreRun`; its D-Score is :class:`~dlguard.metrics.DScore` updated with it.

    Example:
        >>> import torch
        >>> from dlguard.metrics import DScore
        >>> from dlguard.zoo import pretrained
        >>> from dlguard.data import MNISTDataModule
        >>> dm = MNISTDataModule()
        >>> dm.setup()
        >>> images = torch.stack([dm.val_set[i][0] for i in range(200)])
        >>> target = torch.tensor([dm.val_set[i][1] for i in range(200)])
        >>> run = dscore_test(pretrained("mnist_a"), images, target, n=3)
        >>> metric = DScore(n=3, num_classes=run.num_classes)
        >>> metric.update(run.logits, run.mutant_logits, run.translated_logits, run.target)
        >>> result = metric.compute()
        >>> float(result.baseline_accuracy) > 0.9, 0 < float(result.d_score) < float(result.v_fitness) < 1
        (True, True)
    """
    check_translation(n, t)
    optional_positive_int("max_batch", max_batch)
    adapter = ModelAdapter.wrap(model)
    check_images(images, values=validate_args)
    check_labels("target", target, batch=len(images))
    selected = dscore_layers(adapter.model, layers)
    images, target = images.to(adapter.device), target.to(adapter.device)
    classes = check_num_classes(num_classes, logit_width(adapter, images), "images")
    if validate_args:
        check_labels("target", target, num_classes=classes)
    with evaluation(adapter.model), torch.no_grad():
        if not len(images):  # an empty shard of a probe set spread over processes
            empty = torch.zeros(n * n, 0, classes, device=adapter.device)
            return DScoreRun(images, target, empty[0], empty, empty.clone(), classes)
        prepared = adapter.prepare(images)
        baseline = adapter.logits(images, max_batch, classes)
        rows = max_batch or default_max_batch(adapter.model, prepared, selected)
        mutants = deletion_mutant_logits(
            adapter.model, prepared, n, selected, max_batch=rows, output_transform=adapter.finish
        )
        translated = adapter.logits(region_translations(images, n, t).flatten(0, 1), rows)
        return DScoreRun(images, target, baseline, mutants, translated.reshape(n * n, *baseline.shape), classes)
