"""The three CNNs of the D-Score paper's Table I (papers/000_…), returning logits.

The paper ends each network with a softmax; here the last layer returns logits so that
cross-entropy and every dlguard metric receive what they expect (SPEC §0, model contract).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

__all__ = ["cifar_cnn", "mnist_a", "mnist_b"]


def _conv_out(size: int, kernel: int) -> int:
    if size < kernel:
        raise ValueError(f"input_size: too small for this network (a {kernel}x{kernel} conv met {size})")
    return size - kernel + 1


def _check(num_classes: int, in_channels: int) -> None:
    if num_classes < 2:
        raise ValueError(f"num_classes: expected at least 2, got {num_classes}")
    if in_channels < 1:
        raise ValueError(f"in_channels: expected at least 1, got {in_channels}")


def mnist_a(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> nn.Sequential:
    """MNIST model A (LeNet-5 style): two 5x5 convs with pooling, then FC 120-84-``num_classes``.

    Example:
        >>> import torch
        >>> mnist_a()(torch.zeros(2, 1, 28, 28)).shape
        torch.Size([2, 10])
    """
    _check(num_classes, in_channels)
    side = _conv_out(_conv_out(input_size, 5) // 2, 5) // 2
    return nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(in_channels, 6, 5),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(6, 16, 5),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc1=nn.Linear(16 * side * side, 120),
            relu3=nn.ReLU(),
            fc2=nn.Linear(120, 84),
            relu4=nn.ReLU(),
            fc3=nn.Linear(84, num_classes),
        )
    )


def _double_conv_net(
    in_channels: int, widths: tuple[int, int], hidden: tuple[int, ...], num_classes: int, input_size: int
) -> nn.Sequential:
    """Two blocks of two 3x3 convs + ReLU and a 2x2 max-pool, then FC layers: Table I's B and CIFAR."""
    side = _conv_out(_conv_out(_conv_out(_conv_out(input_size, 3), 3) // 2, 3), 3) // 2
    channels = [in_channels, widths[0], widths[0], widths[1], widths[1]]
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for i in range(4):
        layers[f"conv{i + 1}"] = nn.Conv2d(channels[i], channels[i + 1], 3)
        layers[f"relu{i + 1}"] = nn.ReLU()
        if i % 2:
            layers[f"pool{i // 2 + 1}"] = nn.MaxPool2d(2)
    layers["flatten"] = nn.Flatten()
    features = [widths[1] * side * side, *hidden]
    for i, (width_in, width_out) in enumerate(zip(features, hidden, strict=False)):
        layers[f"fc{i + 1}"] = nn.Linear(width_in, width_out)
        layers[f"relu{i + 5}"] = nn.ReLU()
    layers[f"fc{len(hidden) + 1}"] = nn.Linear(features[-1], num_classes)
    return nn.Sequential(layers)


def mnist_b(num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> nn.Sequential:
    """MNIST model B: conv 32-32, pool, conv 64-64, pool (all 3x3), then FC 200-``num_classes``.

    Example:
        >>> import torch
        >>> mnist_b()(torch.zeros(2, 1, 28, 28)).shape
        torch.Size([2, 10])
    """
    _check(num_classes, in_channels)
    return _double_conv_net(in_channels, (32, 64), (200,), num_classes, input_size)


def cifar_cnn(num_classes: int = 10, in_channels: int = 3, input_size: int = 32) -> nn.Sequential:
    """CIFAR-10 model: conv 64-64, pool, conv 128-128, pool (all 3x3), then FC 256-256-``num_classes``.

    Example:
        >>> import torch
        >>> cifar_cnn()(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """
    _check(num_classes, in_channels)
    return _double_conv_net(in_channels, (64, 128), (256, 256), num_classes, input_size)
