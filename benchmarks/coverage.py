"""Coverage cost: validation with and without NeuronCoverageCallback; NC against DeepTest's loop.

    python benchmarks/coverage.py [--model mnist_b] [--batch 256] [--device cpu|cuda]

Prints, in one run on one machine:

1. a validation epoch (the 1,000 embedded MNIST validation digits, timed from the epoch's first
   hook to its last) of the model with the callback measuring all five criteria, as a multiple
   of the same epoch without it (target: at most 1.15x on CPU); ranges are profiled once
   beforehand, as the callback does once per fit; the once-per-run PNG is timed separately;
2. per-image NC cost of the metric fed a batch's activations against a straightforward
   reference that, like the DeepTest code, runs and scores one input at a time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch
from _timing import timed
from torch import nn

from dlguard.callbacks import NeuronCoverageCallback
from dlguard.data import MNISTDataModule
from dlguard.metrics import NeuronCoverage, profile_neuron_ranges
from dlguard.probes import capture_activations, neuron_layers
from dlguard.report import plot_coverage_by_layer
from dlguard.zoo import ClassifierModule, pretrained


class EpochClock(L.Callback):
    """Placed first and last around the measured callbacks: times the validation epoch itself."""

    def __init__(self, role: str, times: dict[str, float]) -> None:
        self.role, self.times = role, times

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.role == "start":
            self.times["start"] = time.perf_counter()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.role == "end":
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.times["end"] = time.perf_counter()


def epoch_seconds(module: L.LightningModule, dm: MNISTDataModule, callbacks: list, device: str) -> float:
    times: dict[str, float] = {}
    trainer = L.Trainer(
        accelerator=device,
        devices=1,
        callbacks=[EpochClock("start", times), *callbacks, EpochClock("end", times)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir="/tmp/dlguard-benchmark",
    )
    trainer.validate(module, datamodule=dm, verbose=False)
    return times["end"] - times["start"]


def deeptest_nc(model: nn.Module, layers: dict[str, nn.Module], images: torch.Tensor, threshold: float) -> float:
    """The DeepTest way: one input per forward pass, scale each layer output, test every neuron."""
    covered = {name: torch.zeros(0, dtype=torch.bool) for name in layers}
    with torch.no_grad(), capture_activations(model, layers) as acts:
        for image in images:
            model(image[None])
            for name, outputs in acts.items():
                out = outputs.pop()[0]
                scaled = (out - out.min()) / (out.max() - out.min())
                means = scaled.flatten(1).mean(1) if scaled.ndim > 1 else scaled
                hit = means > threshold
                covered[name] = hit if covered[name].numel() == 0 else covered[name] | hit
    return float(sum(c.sum() for c in covered.values()) / sum(c.numel() for c in covered.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mnist_b", choices=["mnist_a", "mnist_b"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.model}, batch {args.batch}, device: {name}, torch {torch.__version__}")

    dm = MNISTDataModule(batch_size=args.batch)
    dm.setup()
    module = ClassifierModule(pretrained(args.model)).to(args.device)
    ranges = profile_neuron_ranges(module, dm.train_dataloader(), "auto")

    def with_callback() -> float:
        return epoch_seconds(module, dm, [NeuronCoverageCallback(ranges=ranges)], args.device)

    def without_nc() -> float:
        callback = NeuronCoverageCallback(criteria=("kmnc", "nbc", "snac", "tknc"), ranges=ranges)
        return epoch_seconds(module, dm, [callback], args.device)

    def without() -> float:
        return epoch_seconds(module, dm, [], args.device)

    with_callback(), without(), without_nc()  # warm-up
    plain, covered, no_nc = [], [], []
    for _ in range(args.repeats):  # interleaved, so machine drift hits all alike
        plain.append(without())
        covered.append(with_callback())
        no_nc.append(without_nc())
    t_plain, t_cov, t_no_nc = statistics.median(plain), statistics.median(covered), statistics.median(no_nc)
    print(f"validation epoch, plain              : {t_plain * 1e3:8.1f} ms")
    print(
        f"validation epoch, 5 coverage criteria: {t_cov * 1e3:8.1f} ms   ratio {t_cov / t_plain:.3f}x (target <= 1.15x)"
    )
    print(f"validation epoch, without NC (4)     : {t_no_nc * 1e3:8.1f} ms   ratio {t_no_nc / t_plain:.3f}x")
    per_layer = {c: {layer: 0.5 for layer in neuron_layers(module)} for c in ("nc", "kmnc", "nbc", "snac", "tknc")}
    figure_s = timed(
        {"png": lambda: plot_coverage_by_layer(per_layer).savefig("/tmp/dlguard-benchmark-coverage.png")},
        torch.device("cpu"),
        1,
    )["png"]
    print(f"once per run without W&B, the PNG    : {figure_s * 1e3:8.1f} ms")

    images = torch.stack([dm.val_set[i][0] for i in range(200)]).to(args.device)
    net = module.net.eval()
    layers = neuron_layers(net)

    def dlguard_nc() -> float:
        with torch.no_grad(), capture_activations(net, layers) as acts:
            net(images)
        metric = NeuronCoverage({n: o[0].shape[1] for n, o in acts.items()}, threshold=0.2).to(args.device)
        metric.update({n: o[0] for n, o in acts.items()})
        return float(metric.compute())

    assert abs(dlguard_nc() - deeptest_nc(net, layers, images, 0.2)) < 1e-9, "NC disagrees with the reference"
    nc_times = timed({"ref": lambda: deeptest_nc(net, layers, images, 0.2), "ours": dlguard_nc}, images.device, 3)
    t_ref, t_ours = nc_times["ref"], nc_times["ours"]
    print(f"NC per image (forward included), DeepTest-style loop: {t_ref / len(images) * 1e6:8.1f} us")
    print(
        f"NC per image (forward included), dlguard batched    : {t_ours / len(images) * 1e6:8.1f} us   "
        f"loop / dlguard {t_ref / t_ours:.1f}x"
    )


if __name__ == "__main__":
    main()
