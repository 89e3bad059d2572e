"""Object proposals of the digit scenes with OpenCV, and R-CNN's training labels of proposals.

The proposals (:func:`object_proposals`) are extremal regions of the image's channel minimum: the
scenes of :func:`~dlguard.data.detection_scenes.make_detection_scenes` draw digits in bright colours (every
channel at least 0.7) over backgrounds kept in ``[0.05, 0.6]``, so the channel minimum is high on a digit
and low elsewhere. Thresholding it at a few levels (as MSER and selective search take regions at several
scales) and taking connected components, with and without a small dilation that joins broken strokes,
gives a handful of boxes per scene that cover nearly every digit; the classifier of
:class:`~dlguard.zoo.detector.ProposalDetector` rejects the rest. :func:`label_proposals` gives the
proposals of a training scene the labels that classifier learns.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch
from torch import Tensor
from torchvision.ops import box_iou

from dlguard._validation import check_values, positive_int, probability
from dlguard.zoo._proposal_checks import _check_dilations, _check_image, _check_levels

__all__ = ["DEFAULT_LEVELS", "label_proposals", "object_proposals"]

DEFAULT_LEVELS: tuple[float, ...] = (0.45, 0.55, 0.65, 0.75)
"""Thresholds of the channel minimum at which :func:`object_proposals` takes regions."""


def _component_boxes(binary: np.ndarray, dilation: int) -> np.ndarray:
    """Tight ``xyxy`` boxes of ``binary``'s pixels per connected component of its dilation (8-connected)."""
    grown = cv2.dilate(binary, np.ones((dilation, dilation), np.uint8)) if dilation > 1 else binary
    count, components = cv2.connectedComponents(grown, connectivity=8)
    ys, xs = np.nonzero(binary)
    ids = components[ys, xs]
    boxes = np.empty((count, 4), dtype=np.int64)
    boxes[:, :2] = np.iinfo(np.int64).max
    boxes[:, 2:] = -1
    np.minimum.at(boxes[:, 0], ids, xs)
    np.minimum.at(boxes[:, 1], ids, ys)
    np.maximum.at(boxes[:, 2], ids, xs + 1)
    np.maximum.at(boxes[:, 3], ids, ys + 1)
    return boxes[1:][boxes[1:, 2] >= 0]  # component 0 is the dilated background


def object_proposals(
    image: Tensor,
    *,
    levels: Sequence[float] = DEFAULT_LEVELS,
    dilations: Sequence[int] = (1, 3),
    min_side: int = 4,
    max_side: int = 40,
    validate_args: bool = True,
) -> Tensor:
    """Candidate object boxes of one image: connected bright regions of its channel minimum, with OpenCV.

    For each threshold in ``levels`` the pixels whose smallest channel exceeds it form a binary map; for
    each side ``d`` in ``dilations`` the map is dilated by a ``d x d`` square (``1``: not at all) to join
    strokes a few pixels apart, and each 8-connected component gives the tight box of its undilated
    pixels. Boxes whose longer side is outside ``[min_side, max_side]`` are dropped, duplicates removed.
    Runs on the CPU (a copy of the image) and is not differentiable.

    Args:
        image: float ``(C, H, W)`` in ``[0, 1]``, any device.
        levels: thresholds in ``(0, 1)``.
        dilations: dilation kernel sides, at least 1.
        min_side: smallest longer side of a box, in pixels.
        max_side: largest longer side of a box, in pixels.
        validate_args: check the image's values (range, NaN); a caller that checked them passes ``False``.

    Returns:
        float32 ``(n, 4)`` boxes ``xyxy`` (``x2``, ``y2`` exclusive) on the CPU, in lexicographic order.

    Example:
        >>> import torch
        >>> image = torch.full((3, 32, 32), 0.2)
        >>> image[:, 4:20, 8:12] = 0.9  # a bright bar
        >>> image[:, 24:28, 20:30] = 0.6  # a dimmer one, above 0.45 and 0.55 only
        >>> object_proposals(image).tolist()
        [[8.0, 4.0, 12.0, 20.0], [20.0, 24.0, 30.0, 28.0]]
    """
    image = _check_image("image", image)
    levels = _check_levels(levels)
    dilations = _check_dilations(dilations)
    min_side = positive_int("min_side", min_side)
    max_side = positive_int("max_side", max_side, minimum=min_side)
    if validate_args:
        check_values("image", image)
    darkest = image.detach().amin(dim=0).float().cpu().numpy()
    found = [np.empty((0, 4), dtype=np.int64)]
    for level in levels:
        binary = (darkest > level).astype(np.uint8)
        for dilation in dilations:
            found.append(_component_boxes(binary, dilation))
    boxes = torch.from_numpy(np.concatenate(found))
    longer = torch.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
    boxes = boxes[(longer >= min_side) & (longer <= max_side)]
    return torch.unique(boxes, dim=0).float().reshape(-1, 4)


def label_proposals(proposals: Tensor, boxes: Tensor, labels: Tensor, iou_threshold: float = 0.5) -> Tensor:
    """Training labels of proposals: the label of the best-overlapping object if its IoU reaches the threshold.

    This is R-CNN's assignment: a proposal whose highest IoU with a ground-truth box is at least
    ``iou_threshold`` takes that object's label, every other proposal is background (0).

    Args:
        proposals: float ``(n, 4)`` ``xyxy``.
        boxes: float ``(m, 4)`` ground-truth ``xyxy``.
        labels: int ``(m,)`` ground-truth labels (``digit + 1``).
        iou_threshold: smallest IoU of a foreground proposal.

    Returns:
        int64 ``(n,)`` labels.

    Example:
        >>> import torch
        >>> proposals = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 4.0], [20.0, 20.0, 30.0, 30.0]])
        >>> label_proposals(proposals, torch.tensor([[0.0, 0.0, 10.0, 9.0]]), torch.tensor([8])).tolist()
        [8, 0, 0]
    """
    iou_threshold = probability("iou_threshold", iou_threshold)
    if len(boxes) == 0 or len(proposals) == 0:
        return torch.zeros(len(proposals), dtype=torch.int64, device=proposals.device)
    best, index = box_iou(proposals.float(), boxes.float().to(proposals.device)).max(dim=1)
    assigned = labels.to(proposals.device, torch.int64)[index]
    return torch.where(best >= iou_threshold, assigned, torch.zeros_like(assigned))
