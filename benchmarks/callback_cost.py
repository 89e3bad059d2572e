"""What each callback costs: a validation epoch with it, against the plain validation epoch, in one run.

    python benchmarks/callback_cost.py [--model mnist_a|resnet18] [--val-size 500] [--train-epochs 0]
                                       [--epochs 2] [--only NAME ...] [--budget B] [--device cpu|cuda]

For each dlguard callback alone at its default settings (``budget=0.15`` of a validation
epoch's forward passes per measurement), and for all six together, a ``trainer.fit`` of
``--epochs`` epochs (one training batch each) validates on ``--val-size`` inputs (batches of 100),
and each validation epoch -- from its start to the end of the last callback's measurement -- is
timed against the same epoch of a fit without callbacks: the first measurement (the probe set is
drawn, coverage profiles its neuron ranges on the training data, object relevancy makes its
follow-ups) and the later ones (what every further validation epoch of a fit costs, their mean:
on a small loader, where a callback's smallest set costs more than its budget, fit spaces its
measurements out, so take ``--epochs`` of 10 or more there). The figures a callback writes once,
when the fit ends, are outside both. The script prints

- the ratio of the wall times (what attaching the callback costs a validation epoch),
- the seconds spent inside the callback's own validation hooks, and
- the callback's throughput: the images its own forward passes pushed through the model, per second
  spent in its hooks, over the plain loop's images per second (1.0: the callback's work runs as
  fast as validation's own passes; the issue's target is at least 0.8). Timing the hooks, not the
  difference of two epochs' wall times, keeps the loop's run-to-run noise (a few percent of an
  epoch, as much as a callback's whole share) out of it.

Models: ``mnist_a`` (shipped weights) on the embedded MNIST; ``resnet18``, torchvision's ResNet-18
with a 3x3 stride-1 stem on dlguard's 32x32 RGB scenes with ImageNet normalisation as
``preprocess`` (``min_accuracy=None``, so that even an untrained network is measured). With
``--train-epochs E`` the network is first trained for ``E`` epochs (Adam, 1e-3, batches of 100) on
the training set, outside every timing, so that the callbacks measure a network that gets inputs
right (robustness's balanced set and HDA's seeds need correct inputs). The scenes' validation set
is 1,000 digits; a ``--val-size`` above that composites the same digits on further backgrounds
(1,000 new scenes per copy), e.g. 10,000 for a CIFAR-10-sized test split. HDA gets a PCA
distribution fitted beforehand on 2,000 training inputs (the callback
fits the same one itself, once per fit). Probe sets are drawn inside the timed validation, as at a
callback's first measurement. Forward passes are counted with a hook on the network.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

import lightning as L
import torch
from _resnet import Normalize, resnet18_cifar
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from dlguard.callbacks import (
    DScoreCallback,
    HDACallback,
    MetamorphicCallback,
    NeuronCoverageCallback,
    ObjectRelevancyCallback,
    RobustnessCallback,
)
from dlguard.data import MNISTDataModule, SceneDataModule
from dlguard.generate.distribution import PCADistribution
from dlguard.zoo import ClassifierModule, pretrained

ROOT = tempfile.mkdtemp(prefix="dlguard-callback-cost-")  # the callbacks' end-of-run figures land here
atexit.register(shutil.rmtree, ROOT, ignore_errors=True)


class Classifier(ClassifierModule):
    """``ClassifierModule`` whose steps read ``(image, label, ...)`` and normalise when told to."""

    def __init__(self, net: nn.Module, normalize: bool) -> None:
        super().__init__(net)
        self.normalize = Normalize() if normalize else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)  # the fit's training step leaves the weights as trained

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return nn.functional.cross_entropy(self(self.normalize(batch[0])), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = batch[0], batch[1]
        self.log("val_acc", (self(self.normalize(images)).argmax(1) == labels).float().mean())


class Data(L.LightningDataModule):
    """Fixed training and validation sets, batches of 100."""

    def __init__(self, train: Dataset, val: Dataset) -> None:
        super().__init__()
        self.train, self.val = train, val

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=100)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=100)


def pretrain(net: nn.Module, data: Data, epochs: int, normalize: bool, model: str) -> None:
    """``epochs`` of Adam (1e-3) on the training set, before any timing; kept in the temporary folder for reruns."""
    cache = Path(tempfile.gettempdir()) / f"dlguard-callback-cost-{model}-{epochs}-epochs.pt"
    if epochs and cache.exists():
        net.load_state_dict(torch.load(cache))
        net.eval()
        return
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    prepare = Normalize() if normalize else nn.Identity()
    net.train()
    for _ in range(epochs):
        for batch in DataLoader(data.train, batch_size=100, shuffle=True):
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(prepare(batch[0])), batch[1]).backward()
            optimizer.step()
    net.eval()
    if epochs:
        torch.save(net.state_dict(), cache)


def accuracy(net: nn.Module, data: Data, normalize: bool) -> float:
    prepare = Normalize() if normalize else nn.Identity()
    right = seen = 0
    with torch.no_grad():
        for batch in data.val_dataloader():
            right += int((net(prepare(batch[0])).argmax(1) == batch[1]).sum())
            seen += len(batch[1])
    return right / seen


def setting(model: str, val_size: int) -> tuple[nn.Module, Data, dict[str, Any], Tensor]:
    if model == "mnist_a":
        data = MNISTDataModule()
        data.setup()
        train = torch.stack([data.train_set[i][0] for i in range(2000)])
        return pretrained("mnist_a"), Data(data.train_set, Subset(data.val_set, range(val_size))), {}, train
    scenes = SceneDataModule()
    scenes.setup()
    net = resnet18_cifar()
    options = {"preprocess": Normalize(), "min_accuracy": None}
    val, copies = scenes.val_set, -(-val_size // len(scenes.val_set))
    copies_of_val = [val] + [val.with_backgrounds(val.kinds, seed=100 + copy) for copy in range(1, copies)]
    val_set = Subset(ConcatDataset(copies_of_val), range(val_size))
    return net, Data(scenes.train_set, val_set), options, scenes.train_set.images[:2000]


def callbacks(options: dict[str, Any], train: Tensor) -> dict[str, Callable[[], L.Callback]]:
    distribution = PCADistribution().fit(train)
    masks = {"masks": lambda x: x.amax(1) > 0.3} if train.shape[1] == 1 else {}
    return {
        "DScoreCallback": lambda: DScoreCallback(**options),
        "NeuronCoverageCallback": lambda: NeuronCoverageCallback(
            **{k: v for k, v in options.items() if k != "min_accuracy"}
        ),
        "RobustnessCallback": lambda: RobustnessCallback(**options),
        "MetamorphicCallback": lambda: MetamorphicCallback(**options),
        "HDACallback": lambda: HDACallback(distribution=distribution, **options),
        "ObjectRelevancyCallback": lambda: ObjectRelevancyCallback(**masks, **options),
    }


_HOOKS = ("on_validation_epoch_start", "on_validation_batch_start", "on_validation_batch_end")
_HOOKS += ("on_validation_epoch_end",)


class EpochTimer(L.Callback):
    """Seconds of each validation epoch, the images the network ran in it, and the seconds spent in dlguard's hooks.

    :meth:`starter` goes first in the trainer's callbacks (it starts the clock before any callback's
    epoch start: coverage profiles there), the timer itself last (it stops after every measurement).
    The attached callbacks' validation hooks are timed one by one: their sum is the time the callbacks'
    own work took (their measurements, draws and checks), free of the run-to-run noise of the loop
    around them; the forward hooks they leave on the loop's own passes (coverage's activation reading,
    the draw's reuse of the step's logits) count in the epoch's wall time only.
    """

    def __init__(self, net: nn.Module, device: str, attached: list[L.Callback]) -> None:
        self.net, self.device = net, device
        self.epochs: list[tuple[float, int, float]] = []
        self.in_hooks = 0.0
        timer = self

        class Starter(L.Callback):
            def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
                timer.rows, timer.in_hooks = [0], 0.0
                timer.handle = net.register_forward_hook(
                    lambda _, a, out: timer.rows.__setitem__(0, timer.rows[0] + len(a[0]))
                )
                timer.start = time.perf_counter()

        self.starter = Starter()
        for callback in attached:
            for name in _HOOKS:
                setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook: Callable[..., None]) -> Callable[..., None]:
        def timed(*args: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            try:
                hook(*args, **kwargs)
            finally:
                if self.device == "cuda":
                    torch.cuda.synchronize()
                self.in_hooks += time.perf_counter() - started

        return timed

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.epochs.append((time.perf_counter() - self.start, self.rows[0], self.in_hooks))
        self.handle.remove()


def validation_epochs(
    net: nn.Module, normalize: bool, data: Data, attached: list[L.Callback], device: str, epochs: int
) -> list[tuple[float, int, float]]:
    """``(seconds, images, seconds in dlguard's hooks)`` of each validation epoch of a fit (one training batch each)."""
    module = Classifier(copy.deepcopy(net), normalize=normalize)
    timer = EpochTimer(module.net, device, attached)
    trainer = L.Trainer(
        accelerator=device, devices=1, callbacks=[timer.starter, *attached, timer], logger=False,
        enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=ROOT, max_epochs=epochs,
        limit_train_batches=1, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    return timer.epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("mnist_a", "resnet18"), default="mnist_a")
    parser.add_argument("--val-size", type=int, default=500)
    parser.add_argument("--train-epochs", type=int, default=0, help="train the network first (outside the timing)")
    parser.add_argument("--only", nargs="+", default=None, help="time these rows only (e.g. 'all six together')")
    parser.add_argument("--budget", default=None, help="every callback's budget: 0.2 (a share) or 4200 (passes)")
    parser.add_argument("--epochs", type=int, default=2, help="validation epochs per fit: the first and the later ones")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error(f"--epochs: at least 2 (a first and a later validation epoch), got {args.epochs}")
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.manual_seed(0)
    net, data, options, train = setting(args.model, args.val_size)
    if args.budget is not None:
        options["budget"] = float(args.budget) if "." in args.budget else int(args.budget)
    normalize = args.model == "resnet18"
    started = time.perf_counter()
    pretrain(net, data, args.train_epochs, normalize, args.model)
    seconds = time.perf_counter() - started
    trained = f"trained {args.train_epochs} epochs ({seconds:.0f} s), " if args.train_epochs else ""
    makers = callbacks(options, train)
    validation_epochs(net, normalize, data, [], args.device, 2)  # warm-up
    plain_epochs = validation_epochs(net, normalize, data, [], args.device, args.epochs)
    plain_first, plain, plain_rows = plain_epochs[0][0], mean([s for s, _, _ in plain_epochs[1:]]), plain_epochs[1][1]
    plain_rate = plain_rows / plain
    print(f"{args.model}, {trained}validation accuracy {accuracy(net, data, normalize):.3f}, {args.val_size} "
          f"validation inputs, {args.device}: plain validation epoch {plain_first:.2f} s first, {plain:.2f} s later "
          f"({plain_rate:.0f} images/s)\n")  # fmt: skip
    print("| callback | measurement | validation with it | ratio | images its passes took |", end="")
    print(" seconds in its hooks | its images/s over the loop's |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    runs = {name: [make()] for name, make in makers.items()}
    runs["all six together"] = [make() for make in makers.values()]
    unknown = sorted(set(args.only or ()) - set(runs))
    if unknown:
        parser.error(f"--only: no row named {unknown}; choose from {list(runs)}")
    later = "later" if args.epochs == 2 else f"later (mean of {args.epochs - 1})"
    for name, attached in runs.items():
        if args.only and name not in args.only:
            continue
        epochs = validation_epochs(net, normalize, data, attached, args.device, args.epochs)
        for which, timed, baseline in (("first", epochs[:1], plain_first), (later, epochs[1:], plain)):
            seconds, hooks = mean([t[0] for t in timed]), mean([t[2] for t in timed])
            extra_rows = mean([t[1] - plain_rows for t in timed])
            speed = f"{extra_rows / hooks / plain_rate:.2f}" if extra_rows else "–"
            cells = [name, which, f"{seconds:.2f} s", f"{seconds / baseline:.1f}x", f"{extra_rows:,.0f}"]
            print("| " + " | ".join([*cells, f"{hooks:.2f} s", speed]) + " |")


if __name__ == "__main__":
    main()
