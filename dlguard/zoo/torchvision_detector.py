"""A torchvision detection model with random weights, to run detection code on a real torchvision model.

:func:`random_torchvision_detector` is a torchvision Faster R-CNN with random weights (no download): it
detects nothing meaningful, but proves that code written for torchvision's output format (which
:class:`~dlguard.zoo.detector.ProposalDetector` also returns) runs on a real torchvision model.
"""

from __future__ import annotations

import torch
from torch import nn

from dlguard._validation import positive_int
from dlguard.zoo.scene_classifier import NUM_SCENE_CLASSES

__all__ = ["random_torchvision_detector"]


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
