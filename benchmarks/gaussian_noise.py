"""What GaussianNoise's keyed draws cost a training batch, against the benchmark's global-RNG noise, in one run.

    python benchmarks/gaussian_noise.py [--batch 64] [--repeats 20] [--device cpu|cuda] [--clock cpu|wall]

A training batch of the scenes (``--batch`` 32x32 RGB images) gets ``σ ~ U(0, 0.3)`` noise two
ways: :class:`~dlguard.callbacks.GaussianNoise`'s hook, whose draws are keyed by each image's
content and the epoch (a hash of every pixel, then two counter-based hashes per element for the
normal draws), and the closed-loop benchmark's ``gaussian_noise`` (``torch.rand`` and
``torch.randn_like`` from the global RNG), which the anchored figures were trained with. Printed:
both per batch, their ratio, and each as a share of one training step of the benchmarks' ResNet-18
(forward, cross-entropy, backward, SGD). Interleaved repeats, medians; ``--clock cpu`` (the CPU
default) times the process's CPU seconds.
"""

from __future__ import annotations

import argparse

import torch
from _resnet import Normalize, resnet18_cifar
from _timing import add_device_and_clock, device_and_clock, timed
from closed_loop import gaussian_noise
from torch import nn

from dlguard.callbacks import GaussianNoise
from dlguard.data import SceneDataModule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    add_device_and_clock(parser)
    args = parser.parse_args()
    device, clock, header = device_and_clock(parser, args)
    print(header)

    torch.manual_seed(0)
    scenes = SceneDataModule()
    scenes.setup()
    images = scenes.train_set.images[: args.batch].to(device)
    labels = scenes.train_set.labels[: args.batch].to(device)
    net = resnet18_cifar().to(device).train()
    optimizer, normalize = torch.optim.SGD(net.parameters(), lr=1e-3), Normalize()
    noise = GaussianNoise()

    def keyed() -> None:
        noise.on_train_batch_start(None, None, [images.clone(), labels], 0)

    def global_rng() -> None:
        gaussian_noise(images.clone())

    def step() -> None:
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(normalize(images)), labels).backward()
        optimizer.step()

    times = timed({"keyed": keyed, "global RNG": global_rng, "step": step}, device, args.repeats, clock)
    print(
        f"GaussianNoise (keyed) {times['keyed'] * 1e3:.2f} ms a batch, the benchmark's global-RNG noise "
        f"{times['global RNG'] * 1e3:.2f} ms ({times['keyed'] / times['global RNG']:.1f}x); as a share of the "
        f"training step's {times['step'] * 1e3:.1f} ms: {times['keyed'] / times['step']:.1%} and "
        f"{times['global RNG'] / times['step']:.1%}"
    )


if __name__ == "__main__":
    main()
