"""D-Score cost: batched mutants against a one-mutant-at-a-time loop, and the callback's cost.

    python benchmarks/dscore.py [--model mnist_b] [--probe 500] [--n 3] [--device cpu|cuda]

Prints, in one run on one machine:
1. all n² region-deletion mutants evaluated batched (``deletion_mutant_logits``) against a loop
   that runs one mutant at a time over the same probe set; ratio = loop / batched (> 1: faster);
2. one full D-Score measurement (baseline, n² mutants, n² translated sets) as a multiple of a
   plain validation pass (one forward) over the same probe set.
"""

from __future__ import annotations

import argparse

import torch
from _timing import timed
from torch import nn

from dlguard.data import MNISTDataModule
from dlguard.generate import dscore_test
from dlguard.probes import (
    default_max_batch,
    deletion_mutant_logits,
    evaluation,
    intervene,
    region_keep_masks,
    select_layers,
)
from dlguard.zoo import pretrained


def mutants_one_at_a_time(model: nn.Module, images: torch.Tensor, n: int) -> torch.Tensor:
    """Baseline: the usual way, one mutant model per forward pass over the probe set."""
    convs = select_layers(model, types=nn.Conv2d)
    outputs = []
    with evaluation(model), torch.no_grad():
        for region in range(n * n):

            def zero_region(_name: str, out: torch.Tensor, region: int = region) -> torch.Tensor:
                return out * region_keep_masks(*out.shape[-2:], n, out.device)[region]

            with intervene(model, convs, zero_region):
                outputs.append(model(images))
    return torch.stack(outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mnist_b", choices=["mnist_a", "mnist_b"])
    parser.add_argument("--probe", type=int, default=500)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)

    dm = MNISTDataModule(batch_size=args.probe)
    dm.setup()
    images, target = (t.to(device) for t in next(iter(dm.val_dataloader())))
    model = pretrained(args.model).to(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.model}, probe {len(images)}, n = {args.n}, device: {name}, torch {torch.__version__}")

    with torch.no_grad():
        rows = default_max_batch(model, images, select_layers(model, types=nn.Conv2d))
    print(f"batched mutants: up to {rows} rows per forward pass (activation budget on this device)")
    batched = deletion_mutant_logits(model, images, args.n)
    looped = mutants_one_at_a_time(model, images, args.n)
    assert torch.allclose(batched, looped, atol=1e-4), "batched and looped mutants disagree"
    times = timed(
        {
            "batched": lambda: deletion_mutant_logits(model, images, args.n),
            "loop": lambda: mutants_one_at_a_time(model, images, args.n),
        },
        device,
        args.repeats,
    )
    t_batched, t_loop = times["batched"], times["loop"]
    print(f"mutants, one at a time : {t_loop * 1e3:8.1f} ms")
    print(f"mutants, batched       : {t_batched * 1e3:8.1f} ms   loop / batched = {t_loop / t_batched:.2f}x")

    def plain_validation() -> torch.Tensor:
        with evaluation(model), torch.no_grad():
            return model(images)

    times = timed(
        {"plain": plain_validation, "measure": lambda: dscore_test(model, images, target, n=args.n)},
        device,
        args.repeats,
    )
    t_plain, t_measure = times["plain"], times["measure"]
    print(f"plain validation pass  : {t_plain * 1e3:8.1f} ms")
    print(
        f"D-Score measurement    : {t_measure * 1e3:8.1f} ms   = {t_measure / t_plain:.1f}x a validation pass "
        f"(it makes {2 * args.n**2 + 1} passes' worth of forwards)"
    )


if __name__ == "__main__":
    main()
