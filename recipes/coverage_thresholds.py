"""Where neuron coverage saturates: NC at several thresholds on the zoo's MNIST models and a ResNet-18.

DeepTest counts a neuron as covered when its output, min-max scaled over its layer for each input
(a conv channel's value is its spatial mean), exceeds 0.2 for some input. Over a whole validation
set nearly every channel passes 0.2 at least once, so NC reads 1.000 and measures nothing. This
recipe prints NC over ``--inputs`` validation inputs at thresholds 0.2-0.75 for ``mnist_a`` and
``mnist_b`` (shipped weights, MNIST) and for a torchvision ResNet-18 with a 3x3 stride-1 stem,
trained from scratch for ``--epochs`` epochs on dlguard's RGB scenes with ImageNet normalisation:
the figures behind :class:`~dlguard.callbacks.NeuronCoverageCallback`'s default threshold (0.75).

Run: ``python recipes/coverage_thresholds.py`` (6 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torchvision
from torch import Tensor, nn

from dlguard.data import MNISTDataModule, SceneDataModule
from dlguard.metrics import NeuronCoverage
from dlguard.probes import capture_activations, neuron_layers
from dlguard.zoo import pretrained

THRESHOLDS = (0.2, 0.5, 0.6, 0.75)
MEAN, STD = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def resnet18_32px(num_classes: int = 10) -> nn.Module:
    net = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = nn.Identity()
    return net


def train_resnet(epochs: int) -> tuple[nn.Module, float]:
    torch.manual_seed(0)
    net, data = resnet18_32px(), SceneDataModule(batch_size=64)
    data.setup()
    optimizer = torch.optim.Adam(net.parameters(), 1e-3)
    for _ in range(epochs):
        net.train()
        for images, labels, *_ in data.train_dataloader():
            loss = nn.functional.cross_entropy(net((images - MEAN) / STD), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    net.eval()
    images, labels = data.val_set.images, data.val_set.labels
    with torch.no_grad():
        accuracy = float((net((images - MEAN) / STD).argmax(1) == labels).float().mean())
    return net, accuracy


def coverage(net: nn.Module, batches: list[Tensor]) -> list[float]:
    layers = neuron_layers(net)
    outputs: dict[str, list[Tensor]] = {}
    with capture_activations(net, layers) as captured, torch.no_grad():
        for batch in batches:
            for held in captured.values():
                held.clear()
            net(batch)
            for name, held in captured.items():
                outputs.setdefault(name, []).append(held[0])
    joined = {name: torch.cat(parts) for name, parts in outputs.items()}
    sizes = {name: values.shape[1] for name, values in joined.items()}
    ratios = []
    for threshold in THRESHOLDS:
        metric = NeuronCoverage(sizes, threshold=threshold)
        metric.update(joined)
        ratios.append(float(metric.compute()))
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    started = time.perf_counter()
    mnist = MNISTDataModule()
    mnist.setup()
    digits = torch.stack([mnist.val_set[i][0] for i in range(min(args.inputs, len(mnist.val_set)))])
    rows = {name: coverage(pretrained(name), list(digits.split(100))) for name in ("mnist_a", "mnist_b")}
    net, accuracy = train_resnet(args.epochs)
    scenes = SceneDataModule()
    scenes.setup()
    inputs = (scenes.val_set.images[: args.inputs] - MEAN) / STD
    rows[f"ResNet-18, {args.epochs} epochs on the RGB scenes (val acc {accuracy:.2f})"] = coverage(
        net, list(inputs.split(100))
    )
    print(f"NC over {args.inputs} validation inputs (per-input min-max scaling, as DeepTest)\n")
    print("| model | " + " | ".join(f"NC at {t}" for t in THRESHOLDS) + " |")
    print("| --- |" + " --- |" * len(THRESHOLDS))
    for name, ratios in rows.items():
        print(f"| {name} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
