"""What KeepOriginals costs a training batch: its bookkeeping, and the originals it appends, in one run.

    python benchmarks/keep_originals.py [--batch 64] [--changed 0.0 0.35 1.0] [--repeats 10]
                                        [--device cpu|cuda] [--clock cpu|wall]

A training batch of the scenes (``--batch`` 32x32 RGB images) goes through a ``FailureReplay``
that puts stored failures in ``--changed`` of its rows (``repeats=None``: that share of every
batch; 0.35 is the share of rows the anchored loops changed on the scenes over a fit), and then
through one training step of the benchmarks' ResNet-18 (forward, cross-entropy, backward, SGD),
with and without :class:`~dlguard.callbacks.KeepOriginals` around the replay. Printed, per share:

- the bookkeeping: the keeper's copy of the batch, the comparison and the appending, the hooks alone
  with the replay's own hook subtracted, per batch and as a share of the plain training step;
- the step with the originals appended, against the step on the replayed batch alone: what the
  larger batch costs (a batch of ``B`` rows trains on ``B`` plus the changed rows).

The hooks are called as a fit calls them (keeper, replay, KeepOriginals), without a ``Trainer``,
so Lightning's own per-batch work is in neither figure. Interleaved repeats, medians; ``--clock
cpu`` (the CPU default) times the process's CPU seconds, which other jobs on the machine move less
than the wall time.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial

import torch
from _resnet import Normalize, resnet18_cifar
from _timing import add_device_and_clock, device_and_clock, timed
from torch import Tensor, nn

from dlguard.callbacks import FailureReplay, KeepOriginals
from dlguard.data import SceneDataModule


def training_step(net: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[list[Tensor]], None]:
    normalize = Normalize()

    def step(batch: list[Tensor]) -> None:
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(normalize(batch[0])), batch[1]).backward()
        optimizer.step()

    return step


def replayed(images: Tensor, labels: Tensor, replay: FailureReplay, keep: KeepOriginals | None) -> list[Tensor]:
    """A copy of the batch through the replay's hook, and KeepOriginals' two around it (as a fit calls them)."""
    batch = [images.clone(), labels.clone()]
    if keep is not None:
        keep.keeper.on_train_batch_start(None, None, batch, 0)
    replay.on_train_batch_start(None, None, batch, 0)
    if keep is not None:
        keep.on_train_batch_start(None, None, batch, 0)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--changed", type=float, nargs="+", default=[0.0, 0.35, 1.0])
    parser.add_argument("--repeats", type=int, default=10)
    add_device_and_clock(parser)
    args = parser.parse_args()
    device, clock, header = device_and_clock(parser, args)
    print(header)

    torch.manual_seed(0)
    scenes = SceneDataModule()
    scenes.setup()
    images = scenes.train_set.images[: args.batch].to(device)
    labels = scenes.train_set.labels[: args.batch].to(device)
    failures = scenes.train_set.images[args.batch : args.batch + 256].to(device)
    net = resnet18_cifar().to(device).train()
    step = training_step(net, torch.optim.SGD(net.parameters(), lr=1e-3))

    for share in args.changed:
        replay = FailureReplay(fraction=share, repeats=None)
        replay.bank.add(failures, torch.randint(10, (len(failures),)), origin="benchmark")
        keep = KeepOriginals()

        plain = partial(replayed, images, labels, replay, None)
        keeping = partial(replayed, images, labels, replay, keep)
        appended = len(keeping()[1]) - args.batch
        times = timed(
            {
                "replay hook": plain,
                "replay + KeepOriginals hooks": keeping,
                "step": lambda: step(plain()),  # noqa: B023 (timed at once)
                "step, originals appended": lambda: step(keeping()),  # noqa: B023
            },
            device,
            args.repeats,
            clock,
        )
        bookkeeping = times["replay + KeepOriginals hooks"] - times["replay hook"]
        print(
            f"{share:.2f} of the rows changed ({appended} originals appended): bookkeeping "
            f"{bookkeeping * 1e3:.2f} ms a batch, {bookkeeping / times['step']:.2%} of the step's "
            f"{times['step'] * 1e3:.1f} ms; the step with the originals "
            f"{times['step, originals appended'] / times['step']:.2f}x the step without "
            f"(batch {args.batch + appended} / {args.batch} = {(args.batch + appended) / args.batch:.2f})"
        )


if __name__ == "__main__":
    main()
