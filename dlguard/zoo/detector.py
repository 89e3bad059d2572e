"""Detectors of the digit scenes to test object relevancy with (SPEC §3): one classical, one torchvision.

:class:`ProposalDetector` is the R-CNN recipe (Girshick et al., 2014, "Rich feature hierarchies for
accurate object detection") with classical proposals: OpenCV finds candidate boxes in the image, each
box's crop is warped to a fixed size and classified by a small CNN (:func:`scene_digits`: background
plus ten digits), background and unsure boxes are dropped, and class-wise non-maximum suppression keeps
the best of overlapping boxes. Its output is exactly a torchvision detection model's in eval mode: one
dict per image with ``"boxes"`` (float32 ``(n, 4)`` ``xyxy`` in pixels), ``"labels"`` (int64 ``(n,)``,
``digit + 1``, 0 being background) and ``"scores"`` (float ``(n,)``), sorted by decreasing score.

The proposals (:func:`object_proposals`) are extremal regions of the image's channel minimum: the
scenes of :func:`~dlguard.data.detection_scenes.make_detection_scenes` draw digits in bright colours (every channel
at least 0.7) over backgrounds kept in ``[0.05, 0.6]``, so the channel minimum is high on a digit and low
elsewhere. Thresholding it at a few levels (as MSER and selective search take regions at several
scales) and taking connected components, with and without a small dilation that joins broken strokes,
gives a handful of boxes per scene that cover nearly every digit; the classifier rejects the rest.

:func:`random_torchvision_detector` is a torchvision Faster R-CNN with random weights (no download): it
detects nothing meaningful, but proves that code written for torchvision's output format runs on a real
torchvision model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from numbers import Real

import cv2
import numpy as np
import torch
from torch import Tensor, nn
from torchvision.ops import batched_nms, box_iou, roi_align

from dlguard._validation import check_values, positive_int, probability

__all__ = ["ProposalDetector", "label_proposals", "object_proposals", "random_torchvision_detector", "scene_digits"]

NUM_SCENE_CLASSES = 11
"""Classes of :func:`scene_digits`: 0 is background, ``digit + 1`` the ten digits (torchvision's convention)."""

DEFAULT_LEVELS: tuple[float, ...] = (0.45, 0.55, 0.65, 0.75)
"""Thresholds of the channel minimum at which :func:`object_proposals` takes regions."""


def scene_digits(num_classes: int = NUM_SCENE_CLASSES, crop_size: int = 28) -> nn.Sequential:
    """The proposal classifier: per-crop standardisation, three 3x3 conv blocks (12, 24, 48 channels), FC 128.

    It maps RGB crops ``(N, 3, crop_size, crop_size)`` in ``[0, 1]`` to logits ``(N, num_classes)``;
    the shipped weights (``pretrained("scene_digits")``) classify 28x28 crops into background (0) and
    the digits (``digit + 1``). Each crop is first standardised per channel
    (:class:`~torch.nn.InstanceNorm2d` without parameters, ``eps = 0.05²``), so that a digit reads the same
    whatever its colour and background brightness. There is no batch normalisation or dropout: train and
    eval mode compute the same function, and running the network changes none of its state.

    Args:
        num_classes: outputs, background included.
        crop_size: side of the square crops, at least 8.

    Example:
        >>> import torch
        >>> net = scene_digits()
        >>> net(torch.zeros(2, 3, 28, 28)).shape, sum(p.numel() for p in net.parameters())
        (torch.Size([2, 11]), 70211)
    """
    num_classes = positive_int("num_classes", num_classes, minimum=2)
    crop_size = positive_int("crop_size", crop_size, minimum=8)
    side = crop_size // 2 // 2 // 2
    layers: OrderedDict[str, nn.Module] = OrderedDict(standardize=nn.InstanceNorm2d(3, eps=0.05**2))
    for i, (width_in, width_out) in enumerate(((3, 12), (12, 24), (24, 48))):
        layers[f"conv{i + 1}"] = nn.Conv2d(width_in, width_out, 3, padding=1)
        layers[f"relu{i + 1}"] = nn.ReLU()
        layers[f"pool{i + 1}"] = nn.MaxPool2d(2)
    layers["flatten"] = nn.Flatten()
    layers["fc1"] = nn.Linear(48 * side * side, 128)
    layers["relu4"] = nn.ReLU()
    layers["fc2"] = nn.Linear(128, num_classes)
    return nn.Sequential(layers)


def _check_levels(levels: object) -> tuple[float, ...]:
    try:
        values = tuple(levels)  # type: ignore[arg-type]
    except TypeError:
        values = ()
    if not values or not all(isinstance(v, Real) and not isinstance(v, bool) and 0.0 < v < 1.0 for v in values):
        raise ValueError(f"levels: expected a non-empty sequence of thresholds in (0, 1), got {levels!r}")
    return tuple(float(v) for v in values)


def _check_dilations(dilations: object) -> tuple[int, ...]:
    try:
        values = tuple(dilations)  # type: ignore[arg-type]
    except TypeError:
        values = ()
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ValueError(f"dilations: expected a non-empty sequence of kernel sides >= 1, got {dilations!r}")
    return tuple(values)


def _check_image(name: str, image: object) -> Tensor:
    if not isinstance(image, Tensor):
        raise ValueError(f"{name}: expected a tensor image (C, H, W), got {type(image).__name__}")
    if image.ndim != 3 or image.shape[1] < 1 or image.shape[2] < 1:
        raise ValueError(f"{name}: expected an image (C, H, W), got shape {tuple(image.shape)}")
    if not image.is_floating_point():
        raise ValueError(f"{name}: expected floating-point values in [0, 1], got {image.dtype}")
    return image


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
    check_values("image", image)
    return _proposals(image, levels, dilations, min_side, max_side)


def _proposals(
    image: Tensor, levels: tuple[float, ...], dilations: tuple[int, ...], min_side: int, max_side: int
) -> Tensor:
    """:func:`object_proposals` of a checked image with checked settings."""
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

    For each image, :func:`object_proposals` finds candidate boxes (on the CPU, with OpenCV; not
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
            ``None`` makes an untrained :func:`scene_digits` (use :meth:`pretrained` for shipped weights).
        crop_size: side of the crops the classifier takes.
        context: margin added around a box on each side, as a fraction of its longer side.
        score_threshold: smallest score of a detection.
        nms_threshold: IoU above which the lower-scored of two same-class boxes is suppressed.
        overlap_threshold: after NMS, a box is also suppressed when this fraction of the smaller of it and a
            higher-scored detection of any class lies in their intersection (the scenes' objects never
            overlap, so such a box is a fragment of a detected digit or merges two); ``None`` disables.
        detections_per_image: most detections returned per image.
        levels: thresholds of :func:`object_proposals`.
        dilations: dilations of :func:`object_proposals`.
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

        Args:
            map_location: device of the classifier (and of the detections).
            **kwargs: the other arguments of :class:`ProposalDetector` (thresholds, proposals).
        """
        from dlguard.zoo.pretrained import pretrained

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
        return [_proposals(image, self.levels, self.dilations, self.min_side, self.max_side) for image in batch]

    def propose(self, images: Tensor | Sequence[Tensor]) -> list[Tensor]:
        """The proposals of each image (:func:`object_proposals` with this detector's settings), on the CPU.

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


def random_torchvision_detector(num_classes: int = NUM_SCENE_CLASSES, seed: int = 0, image_size: int = 64) -> nn.Module:
    """A torchvision Faster R-CNN (MobileNetV3-Large FPN backbone) with random weights, in eval mode.

    Nothing is downloaded (``weights=None, weights_backbone=None``); the weights are drawn with
    ``torch.manual_seed(seed)`` inside :func:`torch.random.fork_rng`, so the global random state is left
    alone and the same seed gives the same network. Images are resized so that their shorter side is
    ``image_size`` (the scenes' 64 pixels: no resizing, fast on a CPU). Its detections mean nothing; it
    proves that code consuming torchvision's output format runs on a real torchvision model.

    Args:
        num_classes: classes, background included (``11``: background and ten digits).
        seed: seed of the random weights.
        image_size: ``min_size`` and ``max_size`` of torchvision's ``GeneralizedRCNNTransform``.

    Example:
        >>> import torch
        >>> model = random_torchvision_detector(seed=0)
        >>> out = model([torch.rand(3, 64, 64)])[0]
        >>> sorted(out), out["boxes"].shape[1], out["labels"].dtype, model.training
        (['boxes', 'labels', 'scores'], 4, torch.int64, False)
    """
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    num_classes = positive_int("num_classes", num_classes, minimum=2)
    image_size = positive_int("image_size", image_size, minimum=16)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = fasterrcnn_mobilenet_v3_large_320_fpn(
            weights=None, weights_backbone=None, num_classes=num_classes, min_size=image_size, max_size=image_size
        )
    return model.eval()
