"""Running a classifier on object-preserving and object-removing follow-ups: object relevancy of its inferences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from dlguard._validation import check_images, check_labels, positive_int
from dlguard.metrics.functional.object_relevancy import ObjectRelevancyScores, object_relevancy
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

if TYPE_CHECKING:
    from dlguard.augment.follow_ups import FollowUps

__all__ = ["ObjectRelevancyRun", "object_relevancy_test"]


@dataclass
class ObjectRelevancyRun:
    """What one object-relevancy test of ``B`` inferences found.

    Attributes:
        scores: the inferences' :class:`~dlguard.metrics.functional.object_relevancy.ObjectRelevancyScores`.
        logits: ``(B, K)`` the sources' logits.
        follow_up_logits: ``(B, F, K)`` the follow-ups' logits.
        follow_ups: the follow-ups the model was run on.
    """

    scores: ObjectRelevancyScores
    logits: Tensor
    follow_up_logits: Tensor
    follow_ups: FollowUps


def object_relevancy_test(
    model: nn.Module | ModelAdapter,
    images: Tensor,
    target: Tensor,
    follow_ups: FollowUps,
    max_batch: int = 1024,
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
        max_batch: inputs per forward pass.

    Returns:
        An :class:`ObjectRelevancyRun`: scores, logits and follow-up logits.

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
    adapter = model if isinstance(model, ModelAdapter) else ModelAdapter(model)
    check_images(images)
    batch = images.shape[0]
    check_labels("target", target, batch)
    positive_int("max_batch", max_batch)
    if len(follow_ups) != batch or follow_ups.inputs.shape[2:] != images.shape[1:]:
        raise ValueError(
            f"follow_ups: expected the follow-ups of these {batch} images {tuple(images.shape[1:])}, got "
            f"{tuple(follow_ups.inputs.shape)}"
        )
    count = follow_ups.inputs.shape[1]
    with evaluation(adapter.model), torch.no_grad():
        logits = adapter.logits(images, max_batch=max_batch)
        follow = adapter.logits(follow_ups.inputs.flatten(0, 1), max_batch=max_batch, num_classes=logits.shape[1])
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
    return ObjectRelevancyRun(scores, logits, follow, follow_ups)
