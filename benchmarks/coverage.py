"""Coverage cost: validation with and without NeuronCoverageCallback; NC against DeepTest's loop.

    python benchmarks/coverage.py [--model mnist_b] [--batch 256] [--device cpu|cuda]

Prints, in one run on one machine:

1. a validation epoch (the 1,000 embedded MNIST validation digits, timed from the epoch's first
   hook to its last) of the model with the callback measuring all five criteria, as a multiple
   of the same epoch without it (target: at most 1.15x on CPU); ranges are profiled once
   beforehand, as the callback does once per fit; the once-per-run PNG is timed separately;
2. the same with a callback that probes the model in the same epoch (``DScoreCallback``, whose
   mutants and translations run at the end of the epoch, listed first so that coverage's hooks
   are still in place): what coverage adds there should be what it adds alone, since it neither
   counts nor pays for forward passes other than the loop's own;
3. per-image NC cost of the metric fed a batch's activations against a straightforward
   reference that, like the DeepTest code, runs and scores one input at a time.

Every tensor follows the module's device: Lightning moves the module back to the CPU when a
``trainer.validate`` ends, so the module is put back on ``--device`` before the last part.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import lightning as L
import torch
from _timing import timed
from torch import nn

from dlguard.callbacks import DScoreCallback, NeuronCoverageCallback
from dlguard.data import MNISTDataModule
from dlguard.metrics import NeuronCoverage
from dlguard.probes import capture_activations, model_device, neuron_layers, profile_neuron_ranges
from dlguard.report import plot_coverage_by_layer
from dlguard.zoo import ClassifierModule, pretrained


class EpochClock(L.Callback):
    """Placed first and last around the measured callbacks: times the validation epoch itself."""

    def __init__(self, role: str, times: dict[str, float]) -> None:
        self.role, self.times = role, times

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.role == "start":
            if torch.cuda.is_available():
                torch.cuda.synchronize()
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
    parser.add_argument("--repeats", type=int, default=15)
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

    def dscore() -> DScoreCallback:  # probes 100 digits, its 4 mutants and 4 translations at the epoch's end
        return DScoreCallback(n=2, probe_size=100)

    def probing_alone() -> float:
        return epoch_seconds(module, dm, [dscore()], args.device)

    def probing_with_callback() -> float:
        return epoch_seconds(module, dm, [dscore(), NeuronCoverageCallback(ranges=ranges)], args.device)

    arms = {
        "plain": without,
        "covered": with_callback,
        "no_nc": without_nc,
        "probing": probing_alone,
        "probing_covered": probing_with_callback,
    }
    for arm in arms.values():  # warm-up
        arm()
    samples: dict[str, list[float]] = {name: [] for name in arms}
    for repeat in range(args.repeats):  # interleaved in a new order each round, so machine drift hits all alike
        for name in random.Random(repeat).sample(list(arms), len(arms)):
            samples[name].append(arms[name]())
    t = {name: statistics.median(values) for name, values in samples.items()}

    def paired(arm: str, base: str = "plain") -> float:  # median over rounds of the ratio within a round
        return statistics.median(a / b for a, b in zip(samples[arm], samples[base], strict=True))

    def added(arm: str, base: str) -> float:  # median over rounds of the difference within a round
        return statistics.median(a - b for a, b in zip(samples[arm], samples[base], strict=True))

    t_plain, t_cov = t["plain"], t["covered"]
    print(f"medians of {args.repeats} rounds; 'paired': median of the ratios within a round")
    print(f"validation epoch, plain              : {t_plain * 1e3:8.1f} ms")
    print(
        f"validation epoch, 5 coverage criteria: {t_cov * 1e3:8.1f} ms   ratio {t_cov / t_plain:.3f}x, "
        f"paired {paired('covered'):.3f}x (target <= 1.15x)"
    )
    print(
        f"validation epoch, without NC (4)     : {t['no_nc'] * 1e3:8.1f} ms   ratio {t['no_nc'] / t_plain:.3f}x, "
        f"paired {paired('no_nc'):.3f}x"
    )
    print(f"validation epoch, DScore probing     : {t['probing'] * 1e3:8.1f} ms")
    print(
        f"validation epoch, DScore + 5 criteria: {t['probing_covered'] * 1e3:8.1f} ms   coverage adds "
        f"{added('probing_covered', 'probing') * 1e3:.1f} ms there, {added('covered', 'plain') * 1e3:.1f} ms alone "
        "(medians of the differences within a round)"
    )
    per_layer = {c: {layer: 0.5 for layer in neuron_layers(module)} for c in ("nc", "kmnc", "nbc", "snac", "tknc")}
    figure_s = timed(
        {"png": lambda: plot_coverage_by_layer(per_layer).savefig("/tmp/dlguard-benchmark-coverage.png")},
        torch.device("cpu"),
        1,
    )["png"]
    print(f"once per run without W&B, the PNG    : {figure_s * 1e3:8.1f} ms")

    net = module.net.to(args.device).eval()  # trainer.validate left the module on the CPU
    images = torch.stack([dm.val_set[i][0] for i in range(200)]).to(model_device(net))
    layers = neuron_layers(net)

    def dlguard_nc() -> float:
        with torch.no_grad(), capture_activations(net, layers) as acts:
            net(images)
        metric = NeuronCoverage({n: o[0].shape[1] for n, o in acts.items()}, threshold=0.2).to(images.device)
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
