"""Running a classifier on object-preserving and object-removing follow-ups: object relevancy of its inferences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from dlguard._validation import (
    check_images,
    check_labels,
    check_object_images,
    check_object_masks,
    optional_positive_int,
    positive_int,
    probability,
)
from dlguard.augment.functional.object_mutations import move_objects
from dlguard.data.backgrounds import scene_backgrounds
from dlguard.generate.failures import Failures
from dlguard.metrics.functional.object_relevancy import ObjectRelevancyScores, object_relevancy, unreliable
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

if TYPE_CHECKING:
    from dlguard.augment.follow_ups import FollowUps

__all__ = ["ObjectRelevancyRun", "object_relevancy_test", "objects_on_fresh_backgrounds"]


@dataclass
class ObjectRelevancyRun:
    """What one object-relevancy test of ``B`` inferences found; each inference is scored once, here.

    Feed ``scores`` to :class:`~dlguard.metrics.ObjectRelevancy` (``update(run.scores)``); its sums
    reduce over processes.

    Attributes:
        inputs: ``(B, C, H, W)`` the sources.
        target: ``(B,)`` their labels.
        scores: the inferences' :class:`~dlguard.metrics.functional.object_relevancy.ObjectRelevancyScores`,
            with each follow-up's own score (``scores.follow_up``, ``(B, F)``).
        logits: ``(B, K)`` the sources' logits.
        follow_up_logits: ``(B, F, K)`` the follow-ups' logits.
        follow_ups: the follow-ups the model was run on.
        flagged: ``(B,)`` the unreliable inferences: correct, ``p ≥ p_high`` and ``S < s_low``.
        failures: the background-swapped follow-ups of the unreliable inferences, with their labels:
            the same objects on other backgrounds, to teach the model the object.
    """

    inputs: Tensor
    target: Tensor
    scores: ObjectRelevancyScores
    logits: Tensor
    follow_up_logits: Tensor
    follow_ups: FollowUps
    flagged: Tensor
    failures: Failures


def object_relevancy_test(
    model: nn.Module | ModelAdapter,
    images: Tensor,
    target: Tensor,
    follow_ups: FollowUps,
    max_batch: int | None = None,
    *,
    p_high: float = 0.9,
    s_low: float = 0.5,
    validate_args: bool = True,
) -> ObjectRelevancyRun:
    """Object relevancy ``S`` of a classifier's inferences on ``images`` from their follow-ups.

    The sources and their ``F`` follow-ups each (:func:`~dlguard.augment.object_follow_ups`) go
    through the model in eval mode, without gradients, in passes of at most ``max_batch`` inputs on
    the model's device; the model is left exactly as found.

    Args:
        model: the classifier (an ``nn.Module`` returning logits, or a
            :class:`~dlguard.probes.ModelAdapter` with ``preprocess``/``output_transform``).
        images: ``(B, C, H, W)`` the sources in ``[0, 1]``.
        target: ``(B,)`` their labels.
        follow_ups: the sources' follow-ups.
        max_batch: inputs per forward pass (``None``: a memory budget, :func:`~dlguard.probes.default_max_batch`).
        p_high: confidence from which a correct inference can be unreliable.
        s_low: object relevancy below which a confident correct inference is unreliable.
        validate_args: check the images' values (range, NaN) and the labels' range; callers that
            checked them already (a callback's probe set) pass ``False``.

    Returns:
        An :class:`ObjectRelevancyRun`: scores, logits, follow-up logits and the failures to replay.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from dlguard.augment import object_follow_ups
        >>> _ = torch.manual_seed(0)
        >>> images = torch.full((2, 3, 16, 16), 0.3)
        >>> masks = torch.zeros(2, 16, 16, dtype=torch.bool)
        >>> masks[:, 4:12, 5:11] = True
        >>> images[:, 0][masks] = 1.0  # a red object on a dark background
        >>> follow_ups = object_follow_ups(images, masks, torch.rand(2, 3, 16, 16), workers=1)
        >>> red_detector = nn.Sequential(nn.Flatten(), nn.Linear(768, 2))  # class 1: pure red inside the box
        >>> with torch.no_grad():
        ...     _ = red_detector[1].weight.zero_(), red_detector[1].bias.zero_()
        ...     for channel, sign in ((0, 1.0), (1, -1.0), (2, -1.0)):
        ...         red_detector[1].weight[1, 256 * channel:256 * (channel + 1)].view(16, 16)[4:12, 5:11] = sign
        >>> run = object_relevancy_test(red_detector, images, torch.tensor([1, 1]), follow_ups)
        >>> round(float(run.scores.probability[0]), 4), round(float(run.scores.score[0]), 2)
        (1.0, 0.76)
        >>> [round(v, 2) for v in run.scores.per_function[0, :5].tolist()]  # Poisson blending shifts the red
        [1.0, 0.0, 1.0, 0.72, 1.0]
    """
    adapter = ModelAdapter.wrap(model)
    check_images(images, values=validate_args)
    batch = images.shape[0]
    check_labels("target", target, batch)
    optional_positive_int("max_batch", max_batch)
    p_high, s_low = probability("p_high", p_high), probability("s_low", s_low)
    if len(follow_ups) != batch or follow_ups.inputs.shape[2:] != images.shape[1:]:
        raise ValueError(
            f"follow_ups: expected the follow-ups of these {batch} images {tuple(images.shape[1:])}, got "
            f"{tuple(follow_ups.inputs.shape)}"
        )
    count = follow_ups.inputs.shape[1]
    with evaluation(adapter.model), torch.no_grad():
        rows = adapter.rows_per_pass(images, max_batch)
        logits = adapter.logits(images, max_batch=rows)
        follow = adapter.logits(follow_ups.inputs.flatten(0, 1), max_batch=rows, num_classes=logits.shape[1])
    follow = follow.view(batch, count, -1)
    device = logits.device
    scores = object_relevancy(
        logits.float(),
        follow.float(),
        target.to(device),
        follow_ups.function.to(device),
        follow_ups.preserving.to(device),
        follow_ups.valid.to(device),
    )
    flagged = unreliable(scores, p_high, s_low).cpu()
    swapped = follow_ups.background_swapped()[flagged]  # (U, n_backgrounds, C, H, W)
    labels = target.cpu()[flagged][:, None].expand(swapped.shape[:2])
    failures = Failures(swapped.flatten(0, 1), labels.flatten())
    return ObjectRelevancyRun(images, target, scores, logits, follow, follow_ups, flagged, failures)


def objects_on_fresh_backgrounds(
    images: Tensor, masks: Tensor, labels: Tensor, count: int, *, seed: int, workers: int | None = None
) -> Failures:
    """Each image's object on ``count`` scene backgrounds of its own, labelled with the image's label.

    What object-relevancy feedback replays: an object the model did not read, shown on backgrounds it
    has not seen (:func:`~dlguard.data.scene_backgrounds`, drawn from ``seed``), so that only the object
    carries the label (:func:`~dlguard.augment.functional.move_objects`).

    Args:
        images: ``(B, C, H, W)`` floating sources in ``[0, 1]``, ``C`` in ``{1, 3}``.
        masks: ``(B, H, W)`` bool, ``True`` on each image's object; none may be empty.
        labels: ``(B,)`` each image's class.
        count: backgrounds per image, at least 1.
        seed: seed of the backgrounds.
        workers: threads, as in :func:`~dlguard.augment.functional.move_objects`.

    Returns:
        :class:`Failures` of ``B · count`` inputs, image by image (image 0 on its ``count``
        backgrounds first), on ``images``' device.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> images = torch.rand(2, 3, 8, 8, generator=g)
        >>> masks = torch.zeros(2, 8, 8, dtype=torch.bool)
        >>> masks[:, 2:6, 2:6] = True
        >>> moved = objects_on_fresh_backgrounds(images, masks, torch.tensor([3, 7]), 4, seed=0)
        >>> tuple(moved.inputs.shape), moved.labels.tolist()
        ((8, 3, 8, 8), [3, 3, 3, 3, 7, 7, 7, 7])
        >>> torch.equal(moved.inputs[5][:, masks[1]], images[1][:, masks[1]])  # the object, unchanged
        True
    """
    images = check_object_images("images", images)
    masks = check_object_masks("masks", masks, images)
    labels = check_labels("labels", labels, batch=len(images))
    count = positive_int("count", count)
    if not len(images):
        return Failures(images.float(), labels)
    height, width = images.shape[-2:]
    drawn, _ = scene_backgrounds(len(images) * count, max(height, width), seed=seed)
    drawn = drawn[..., :height, :width].unflatten(0, (len(images), count))
    moved = move_objects(images, masks, drawn, workers=workers)
    return Failures(moved.flatten(0, 1), labels.repeat_interleave(count, dim=0).to(moved.device))
