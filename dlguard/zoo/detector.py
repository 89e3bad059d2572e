"""A classical detector of the digit scenes to test object relevancy with (SPEC §3), in torchvision's format.

:class:`ProposalDetector` is the R-CNN recipe (Girshick et al., 2014, "Rich feature hierarchies for
accurate object detection") with classical proposals: OpenCV finds candidate boxes in the image
(:func:`~dlguard.zoo.proposals.object_proposals`), each box's crop is warped to a fixed size and
classified by a small CNN (:func:`~dlguard.zoo.scene_classifier.scene_digits`: background plus ten
digits), background and unsure boxes are dropped, and class-wise non-maximum suppression keeps the best
of overlapping boxes. Its output is exactly a torchvision detection model's in eval mode: one dict per
image with ``"boxes"`` (float32 ``(n, 4)`` ``xyxy`` in pixels), ``"labels"`` (int64 ``(n,)``,
``digit + 1``, 0 being background) and ``"scores"`` (float ``(n,)``), sorted by decreasing score.

A torchvision model to run the same code on is :func:`~dlguard.zoo.torchvision_detector.random_torchvision_detector`.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real

import torch
from torch import Tensor, nn
from torchvision.ops import batched_nms, roi_align

from dlguard._validation import check_values, positive_int, probability
from dlguard.zoo._proposal_checks import _check_dilations, _check_image, _check_levels
from dlguard.zoo.pretrained import pretrained
from dlguard.zoo.proposals import DEFAULT_LEVELS, object_proposals
from dlguard.zoo.scene_classifier import scene_digits

__all__ = ["ProposalDetector"]


def _overlap_keep(boxes: Tensor, threshold: float) -> Tensor:
    """Greedy suppression by intersection over the smaller box: indices of the boxes kept, in order.

    ``boxes`` come sorted by decreasing score; a box is dropped when at least ``threshold`` of the
    smaller of it and an earlier kept box lies in their intersection (a fragment inside a detection,
    or a detection merging two objects), whatever the classes.
    """
    lt = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    intersection = (rb - lt).clamp(min=0).prod(dim=2)
    area = (boxes[:, 2:] - boxes[:, :2]).prod(dim=1)
    smaller = torch.minimum(area[:, None], area[None, :]).clamp(min=1e-6)
    overlapping = (intersection / smaller >= threshold).cpu().tolist()
    keep: list[int] = []
    for i, row in enumerate(overlapping):
        if not any(row[j] for j in keep):
            keep.append(i)
    return torch.tensor(keep, dtype=torch.int64, device=boxes.device)


def _module_device(module: nn.Module) -> torch.device:
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


class ProposalDetector(nn.Module):
    """A classical detector in torchvision's output format: OpenCV proposals, each classified by a CNN.

    For each image, :func:`~dlguard.zoo.proposals.object_proposals` finds candidate boxes (on the CPU, with OpenCV; not
    differentiable). Each box is widened to a square ``1 + 2·context`` times its longer side around its
    centre (MNIST's framing: a 20-pixel digit in a 28-pixel image is ``context = 0.2``), cut out and
    resized by :func:`torchvision.ops.roi_align` to ``crop_size``, and classified by ``classifier`` on the
    module's device. A box keeps the most probable class and its softmax probability as score; boxes
    classified as background (0) or scoring below ``score_threshold`` are dropped, then class-wise NMS
    (:func:`torchvision.ops.batched_nms`) at ``nms_threshold``, and a class-agnostic suppression of boxes
    that mostly overlap a better one (``overlap_threshold``: intersection over the smaller box, which
    removes fragments of a digit found inside its detection), keep at most ``detections_per_image``.

    The output is a torchvision detection model's in eval mode: a list of one dict per image with
    ``"boxes"`` float32 ``(n, 4)`` ``xyxy``, ``"labels"`` int64 ``(n,)`` and ``"scores"`` ``(n,)``, sorted by
    decreasing score, on the module's device. The scores carry gradients to the classifier's weights
    and, through the crops, to the pixels. There is no training path: forward computes the same in
    train and eval mode and changes nothing in the module (train the classifier on crops instead, see
    ``recipes/train_zoo.py``).

    Args:
        classifier: maps crops ``(N, 3, crop_size, crop_size)`` to logits ``(N, K)``, class 0 background;
            ``None`` makes an untrained :func:`~dlguard.zoo.scene_classifier.scene_digits` (use
            :meth:`pretrained` for shipped weights).
        crop_size: side of the crops the classifier takes.
        context: margin added around a box on each side, as a fraction of its longer side.
        score_threshold: smallest score of a detection.
        nms_threshold: IoU above which the lower-scored of two same-class boxes is suppressed.
        overlap_threshold: after NMS, a box is also suppressed when this fraction of the smaller of it and a
            higher-scored detection of any class lies in their intersection (the scenes' objects never
            overlap, so such a box is a fragment of a detected digit or merges two); ``None`` disables.
        detections_per_image: most detections returned per image.
        levels: thresholds of :func:`~dlguard.zoo.proposals.object_proposals`.
        dilations: dilations of :func:`~dlguard.zoo.proposals.object_proposals`.
        min_side: smallest proposal (longer side, pixels).
        max_side: largest proposal (longer side, pixels).

    Example:
        >>> from dlguard.data import embedded_mnist, make_detection_scenes
        >>> digits, labels = embedded_mnist()
        >>> from torchvision.ops import box_iou
        >>> scenes = make_detection_scenes(digits[::500], labels[::500], objects=3, seed=0)
        >>> image, target = scenes[1]  # three digits: 3, 4 and 5
        >>> detection = ProposalDetector.pretrained()([image])[0]
        >>> sorted(detection), detection["boxes"].dtype, detection["labels"].dtype
        (['boxes', 'labels', 'scores'], torch.float32, torch.int64)
        >>> target["labels"].tolist(), detection["labels"].tolist()
        ([4, 5, 6], [4, 5, 6])
        >>> [round(iou, 2) for iou in box_iou(detection["boxes"], target["boxes"]).diagonal().tolist()]
        [0.91, 1.0, 0.87]
    """

    def __init__(
        self,
        classifier: nn.Module | None = None,
        *,
        crop_size: int = 28,
        context: float = 0.2,
        score_threshold: float = 0.5,
        nms_threshold: float = 0.5,
        overlap_threshold: float | None = 0.5,
        detections_per_image: int = 100,
        levels: Sequence[float] = DEFAULT_LEVELS,
        dilations: Sequence[int] = (1, 3),
        min_side: int = 4,
        max_side: int = 40,
    ) -> None:
        super().__init__()
        if classifier is not None and not isinstance(classifier, nn.Module):
            raise ValueError(f"classifier: expected an nn.Module or None, got {type(classifier).__name__}")
        self.crop_size = positive_int("crop_size", crop_size)
        if isinstance(context, bool) or not isinstance(context, Real) or not 0.0 <= context <= 2.0:
            raise ValueError(f"context: expected a margin fraction in [0, 2], got {context!r}")
        self.context = float(context)
        self.score_threshold = probability("score_threshold", score_threshold)
        self.nms_threshold = probability("nms_threshold", nms_threshold)
        self.overlap_threshold = (
            None if overlap_threshold is None else probability("overlap_threshold", overlap_threshold)
        )
        self.detections_per_image = positive_int("detections_per_image", detections_per_image)
        self.levels = _check_levels(levels)
        self.dilations = _check_dilations(dilations)
        self.min_side = positive_int("min_side", min_side)
        self.max_side = positive_int("max_side", max_side, minimum=self.min_side)
        self.classifier = scene_digits(crop_size=self.crop_size) if classifier is None else classifier

    @classmethod
    def pretrained(cls, map_location: str | torch.device = "cpu", **kwargs: object) -> ProposalDetector:
        """The detector with the shipped ``scene_digits`` classifier weights, in eval mode.

        The classifier is ``pretrained("scene_digits", map_location)``
        (:func:`~dlguard.zoo.pretrained.pretrained`, the one place that loads shipped weights by name).

        Args:
            map_location: device of the classifier (and of the detections).
            **kwargs: the other arguments of :class:`ProposalDetector` (thresholds, proposals).
        """
        return cls(pretrained("scene_digits", map_location), **kwargs).eval()  # type: ignore[arg-type]

    def _check_images(self, images: object) -> list[Tensor]:
        """``images`` as a list of checked ``(3, H, W)`` tensors (one reduction per image of a list)."""
        if isinstance(images, Tensor):
            if images.ndim != 4 or not images.is_floating_point() or images.shape[1] != 3:
                raise ValueError(
                    "images: expected a float batch (B, 3, H, W) in [0, 1] or a list of (3, H, W), got "
                    f"{images.dtype} of shape {tuple(images.shape)}"
                )
            check_values("images", images)
            return list(images.unbind(0))
        if not isinstance(images, list | tuple):
            raise ValueError(
                f"images: expected a tensor (B, 3, H, W) or a list of (3, H, W), got {type(images).__name__}"
            )
        for i, image in enumerate(images):
            _check_image(f"images[{i}]", image)
            if image.shape[0] != 3:
                raise ValueError(f"images[{i}]: expected 3 (RGB) channels, got shape {tuple(image.shape)}")
            check_values(f"images[{i}]", image)
        return list(images)

    def _propose(self, batch: list[Tensor]) -> list[Tensor]:
        settings = {"levels": self.levels, "dilations": self.dilations, "min_side": self.min_side}
        return [object_proposals(image, **settings, max_side=self.max_side, validate_args=False) for image in batch]

    def propose(self, images: Tensor | Sequence[Tensor]) -> list[Tensor]:
        """The proposals of each image, on the CPU.

        These are :func:`~dlguard.zoo.proposals.object_proposals` with this detector's settings.

        Args:
            images: float ``(B, 3, H, W)`` or a list of ``(3, H, W)`` in ``[0, 1]``.

        Returns:
            One float32 ``(n_i, 4)`` ``xyxy`` tensor per image.
        """
        return self._propose(self._check_images(images))

    def _crop(self, batch: list[Tensor], boxes: Sequence[Tensor]) -> Tensor:
        device = _module_device(self.classifier)
        squares = []
        for image, box in zip(batch, boxes, strict=True):
            box = box.to(image.device, image.dtype)
            centre = (box[:, :2] + box[:, 2:]) / 2
            half = (box[:, 2:] - box[:, :2]).amax(dim=1, keepdim=True) * (0.5 + self.context)
            squares.append(torch.cat((centre - half, centre + half), dim=1))
        if sum(len(square) for square in squares) == 0:
            return torch.empty(0, 3, self.crop_size, self.crop_size, device=device)
        if len({(image.shape, image.device, image.dtype) for image in batch}) == 1:  # one call for the batch
            crops = roi_align(torch.stack(batch), squares, self.crop_size, 1.0, sampling_ratio=2, aligned=True)
            return crops.to(device, torch.float32)
        crops = [
            roi_align(image[None], [square], self.crop_size, 1.0, sampling_ratio=2, aligned=True).to(
                device, torch.float32
            )
            for image, square in zip(batch, squares, strict=True)
        ]
        return torch.cat(crops)

    def crop(self, images: Tensor | Sequence[Tensor], boxes: Sequence[Tensor]) -> Tensor:
        """Square context crops of the boxes, resized to ``crop_size``, on the module's device.

        Args:
            images: float ``(B, 3, H, W)`` or a list of ``(3, H, W)`` in ``[0, 1]``.
            boxes: one float ``(n_i, 4)`` ``xyxy`` tensor per image.

        Returns:
            float32 ``(sum n_i, 3, crop_size, crop_size)``: the crops of all boxes, image by image.
        """
        batch = self._check_images(images)
        if not isinstance(boxes, Sequence) or len(boxes) != len(batch):
            raise ValueError(f"boxes: expected one (n, 4) tensor per image ({len(batch)} images), got {boxes!r}")
        for i, box in enumerate(boxes):
            if not isinstance(box, Tensor) or box.ndim != 2 or box.shape[1] != 4:
                raise ValueError(f"boxes: expected (n, 4) xyxy tensors, got {box!r} for image {i}")
        return self._crop(batch, boxes)

    def forward(self, images: Tensor | Sequence[Tensor]) -> list[dict[str, Tensor]]:
        """Detections of each image, in torchvision's format.

        Args:
            images: float ``(B, 3, H, W)`` or a list of ``(3, H, W)`` (sizes may differ) in ``[0, 1]``.

        Returns:
            One dict per image: ``"boxes"`` float32 ``(n, 4)`` ``xyxy``, ``"labels"`` int64 ``(n,)``
            (``digit + 1``), ``"scores"`` ``(n,)``, sorted by decreasing score.
        """
        batch = self._check_images(images)
        proposals = self._propose(batch)
        crops = self._crop(batch, proposals)
        device = crops.device
        probabilities = self.classifier(crops).softmax(dim=1) if len(crops) else torch.zeros(0, 2, device=device)
        scores, labels = probabilities.max(dim=1)
        counts = [len(p) for p in proposals]
        detections = []
        for boxes, score, label in zip(proposals, scores.split(counts), labels.split(counts), strict=True):
            boxes = boxes.to(device)
            keep = ((label != 0) & (score >= self.score_threshold)).nonzero().flatten()
            boxes, score, label = boxes[keep], score[keep], label[keep]
            keep = batched_nms(boxes, score.detach(), label, self.nms_threshold)
            if self.overlap_threshold is not None and len(keep) > 1:
                keep = keep[_overlap_keep(boxes[keep], self.overlap_threshold)]
            keep = keep[: self.detections_per_image]
            detections.append({"boxes": boxes[keep], "labels": label[keep].long(), "scores": score[keep]})
        return detections
