"""ErrorGuidedAugmentation on a training batch: only the chosen rows against the whole batch, in one run.

    python benchmarks/error_guided.py [--batch 64] [--size 28] [--channels 1] [--repeats 30] [--device cpu|cuda]

Times one call of an ``ErrorGuidedAugmentation`` over the nine label-preserving properties with a
uniform proposal at each probability (strength 1): ``rows_only=True`` (each property transforms the
rows that drew it; a host sync per property: the CPU's default) against ``rows_only=False`` (every
property transforms the whole batch and ``torch.where`` keeps the chosen rows; no host sync: an
accelerator's default), and prints the ratio. The training step of ``mnist_a`` on the same batch is
timed alongside, for scale.
"""

from __future__ import annotations

import argparse

import torch
from _timing import timed

from dlguard.augment import ErrorGuidedAugmentation, label_preserving_properties
from dlguard.zoo import mnist_a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.channels}x{args.size}x{args.size}, batch {args.batch}, device: {name}, torch {torch.__version__}")
    torch.manual_seed(0)
    images = torch.rand(args.batch, args.channels, args.size, args.size, device=device)
    labels = torch.randint(10, (args.batch,), device=device)
    augmentations = {}
    for rows_only in (True, False):
        augmentations[rows_only] = ErrorGuidedAugmentation(label_preserving_properties(), 1.0, rows_only).to(device)
    if args.channels == 1 and args.size == 28:
        net = mnist_a().to(device)
        optimizer = torch.optim.Adam(net.parameters())

        def step() -> None:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(images), labels).backward()
            optimizer.step()

        print(f"mnist_a's training step: {timed({'step': step}, device, args.repeats)['step'] * 1e3:.2f} ms")
    print("| probability | rows only (ms) | whole batch (ms) | whole batch / rows only |")
    print("| --- | --- | --- | --- |")
    for probability in (0.03, 0.1, 0.3, 1.0):
        for aug in augmentations.values():
            aug.set_proposal(torch.full((10, len(aug.properties)), probability))
            aug(images, labels)  # the checked call
        seconds = timed(
            {str(rows_only): (lambda aug=aug: aug(images, labels)) for rows_only, aug in augmentations.items()},
            device,
            args.repeats,
        )
        rows, whole = seconds["True"], seconds["False"]
        print(f"| {probability} | {rows * 1e3:.2f} | {whole * 1e3:.2f} | {whole / rows:.1f}x |")


if __name__ == "__main__":
    main()
