"""The RGB benchmarks' network: torchvision's ResNet-18 with the CIFAR stem, behind ImageNet's normalisation."""

from __future__ import annotations

import torch
import torchvision
from torch import Tensor, nn

MEAN, STD = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


class Normalize(nn.Module):
    """ImageNet's normalisation, as the ResNet-18 expects its input (a callback's ``preprocess``)."""

    def forward(self, x: Tensor) -> Tensor:
        return (x - MEAN.to(x)) / STD.to(x)


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    """ResNet-18 for 32x32 inputs: a 3x3 stride-1 first convolution and no max-pool, random weights."""
    net = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = nn.Identity()
    return net
