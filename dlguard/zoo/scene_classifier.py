"""The proposal classifier of :class:`~dlguard.zoo.detector.ProposalDetector`: background plus ten digits."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from dlguard._validation import positive_int

__all__ = ["scene_digits"]

NUM_SCENE_CLASSES = 11
"""Classes of :func:`scene_digits`: 0 is background, ``digit + 1`` the ten digits (torchvision's convention)."""


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
