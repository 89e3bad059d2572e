"""Local and global robustness swept at the end of validation, fed back as error-guided augmentation."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import Tensor

from dlguard.augment.error_guided import ErrorGuidedAugmentation
from dlguard.augment.properties import Property, default_properties
from dlguard.callbacks._final_figure import _FinalFigureCallback
from dlguard.data.sampling import balanced_correct_subset
from dlguard.generate.sweep import robustness_sweep
from dlguard.metrics.functional.robustness import digit_sum
from dlguard.metrics.robustness import AdderGlobalRobustness, LocalRobustness
from dlguard.probes import evaluation
from dlguard.report.errors import summarize_errors
from dlguard.report.figures import plot_robustness_curves
from dlguard.report.logging import find_wandb_logger

__all__ = ["RobustnessCallback"]


class RobustnessCallback(_FinalFigureCallback):
    """The comprehensive framework (SPEC §5) at the end of validation, on a fixed balanced probe set.

    The probe set is drawn once, at the first scheduled validation epoch, with
    :func:`~dlguard.data.balanced_correct_subset` from the validation dataset (``per_class``
    correctly predicted inputs per class, fixed seed; fewer are used whole, with a warning). Every
    property is applied at every severity level, batched on the device; the local robustness metric
    gets the logits, the adder gets ``pairs`` random input pairs (both perturbed alike), and
    :func:`~dlguard.report.summarize_errors` explains the failed pairs. Under DDP each rank sweeps its
    shard of the probe set and its share of the pairs; metric states sum, the pair records are
    gathered for the summary.

    With ``guide=ErrorGuidedAugmentation()`` the guide takes each summary's proposal and augments
    every training batch (``batch[0]`` images, ``batch[1]`` labels) in place, on the device, in
    ``on_train_batch_start``.

    Logged metrics:
        ``robustness/<property>`` (mean ``LR_p`` over severities), ``robustness/<property>@<level>``,
        ``global_robustness/<property>`` (adder, mean over severities). With a ``WandbLogger``,
        robustness curves as ``wandb.plot.line_series`` each epoch; without, a PNG when the run
        ends. ``error_summary.json``, ``error_summary.md``, ``failure_rates.png`` and
        ``top_confusions.png`` go to ``<log_dir>/robustness/``.

    Args:
        properties: the properties to sweep, each with increasing levels.
        per_class: probe inputs per class.
        pairs: adder pairs per property and level.
        every_n_epochs: sweep after every this many validation epochs.
        guide: an :class:`~dlguard.augment.ErrorGuidedAugmentation` to drive, or ``None``.
        num_classes: ``C``; default: the width of the model's logits.
        combine: the adder's combination of two labels (default: their sum).
        max_batch: rows per forward pass during the sweep.
        seed: seed of the probe draw and of the pairs.

    Example:
        >>> import lightning as L
        >>> from dlguard.augment import ErrorGuidedAugmentation
        >>> callback = RobustnessCallback(per_class=50, pairs=200, guide=ErrorGuidedAugmentation())
        >>> trainer = L.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False)
    """

    def __init__(
        self,
        properties: Sequence[Property] | None = None,
        per_class: int = 200,
        pairs: int = 1000,
        every_n_epochs: int = 1,
        guide: ErrorGuidedAugmentation | None = None,
        num_classes: int | None = None,
        combine: Callable[[Tensor, Tensor], Tensor] = digit_sum,
        max_batch: int = 1024,
        seed: int = 0,
    ) -> None:
        self.properties = list(properties) if properties is not None else default_properties()
        names = [p.name for p in self.properties]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"properties: expected distinct property names, got {names}")
        for name, value in (("per_class", per_class), ("pairs", pairs), ("every_n_epochs", every_n_epochs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if guide is not None and [p.name for p in guide.properties] != names:
            raise ValueError(f"guide: its properties {[p.name for p in guide.properties]} must be {names}")
        self.per_class, self.pairs, self.every_n_epochs = per_class, pairs, every_n_epochs
        self.guide, self.num_classes, self.combine = guide, num_classes, combine
        self.max_batch, self.seed = max_batch, seed
        self.history: list[dict[str, Any]] = []
        self.summary: dict[str, Any] | None = None
        self._probe: tuple[Tensor, Tensor] | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(properties=[p.name for p in self.properties])

    # ---- the sweep --------------------------------------------------------------------------

    def _draw_probe(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dataset = trainer.val_dataloaders.dataset
        subset = balanced_correct_subset(pl_module, dataset, self.per_class, self.seed, num_classes=self.num_classes)
        shard = subset.indices[trainer.global_rank :: trainer.world_size]
        images = torch.stack([dataset[i][0] for i in shard]).to(pl_module.device)
        labels = torch.tensor([int(dataset[i][1]) for i in shard], device=pl_module.device)
        self._probe = (images, labels)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        if self._probe is None:
            self._draw_probe(trainer, pl_module)
        images, labels = self._probe
        generator = torch.Generator().manual_seed(self.seed + trainer.global_rank)
        levels = max(len(p.levels) for p in self.properties)
        devices = [images.device.index or 0] if images.device.type == "cuda" else []
        # the global RNG is seeded for the sweep (noise sees the same draws each epoch) and
        # restored afterwards, so training's randomness is untouched
        with torch.random.fork_rng(devices=devices), evaluation(pl_module), torch.no_grad():
            classes = self.num_classes or pl_module(images[:1]).shape[-1]
            local = LocalRobustness(classes, [p.name for p in self.properties], levels).to(images.device)
            adder = AdderGlobalRobustness(classes, [p.name for p in self.properties], levels, self.combine)
            adder = adder.to(images.device)
            share = max(1, self.pairs // trainer.world_size)
            torch.manual_seed(self.seed)  # random properties (noise) see the same draws each epoch
            records = robustness_sweep(
                pl_module, images, labels, self.properties, local, adder, share, generator, self.max_batch
            )
            local_results, global_results = local.compute(), adder.compute()
        gathered = {k: self._gather(pl_module, v) for k, v in records.items()}
        summary = summarize_errors(
            [p.name for p in self.properties], num_classes=classes, combine=self.combine, **gathered
        )
        self._record(trainer, pl_module, local_results, global_results, summary)

    @staticmethod
    def _gather(pl_module: L.LightningModule, tensor: Tensor) -> Tensor:
        gathered = pl_module.all_gather(tensor)
        return gathered.flatten(0, 1) if gathered.ndim == tensor.ndim + 1 else gathered

    def _record(self, trainer: L.Trainer, pl_module: L.LightningModule, local: dict, adder: dict, summary: Any) -> None:
        record: dict[str, Any] = {"epoch": trainer.current_epoch, "local": {}, "global": {}}
        logged: dict[str, float] = {}
        for prop in self.properties:
            if prop.name not in local:
                continue
            curve = local[prop.name].per_level.reshape(-1)[: len(prop.levels)].tolist()
            global_curve = adder[prop.name][0].reshape(-1)[: len(prop.levels)].tolist()
            record["local"][prop.name] = {"levels": list(prop.levels), "lr_p": curve}
            record["global"][prop.name] = global_curve
            logged[f"robustness/{prop.name}"] = sum(curve) / len(curve)
            logged.update({f"robustness/{prop.name}@{level:g}": v for level, v in zip(prop.levels, curve, strict=True)})
            logged[f"global_robustness/{prop.name}"] = sum(global_curve) / len(global_curve)
        self.history.append(record)
        self.summary = json.loads(summary.to_json())
        pl_module.log_dict(logged, sync_dist=False)  # already reduced over ranks
        if self.guide is not None:
            self.guide.set_proposal(summary.proposal)
        directory = Path(trainer.log_dir or trainer.default_root_dir) / "robustness"  # a collective: all ranks
        if trainer.is_global_zero:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "error_summary.json").write_text(summary.to_json(indent=2))
            (directory / "error_summary.md").write_text(summary.to_markdown())
            for name, figure in (
                ("failure_rates", summary.plot_failure_rates()),
                ("top_confusions", summary.plot_top_confusions()),
            ):
                figure.savefig(directory / f"{name}.png", dpi=110)
                plt.close(figure)
            wandb_logger = find_wandb_logger(trainer)
            if wandb_logger is not None:
                import wandb

                names = list(record["local"])
                chart = wandb.plot.line_series(
                    xs=list(range(1, max(len(p.levels) for p in self.properties) + 1)),
                    ys=[record["local"][n]["lr_p"] for n in names],
                    keys=names,
                    title="local robustness LR_p",
                    xname="severity level",
                )
                wandb_logger.experiment.log({"robustness/curves": chart, "trainer/global_step": trainer.global_step})

    def _final_figure(self) -> tuple[str, Figure] | None:
        if not self.history:
            return None
        curves = {name: entry["lr_p"] for name, entry in self.history[-1]["local"].items()}
        levels = {name: entry["levels"] for name, entry in self.history[-1]["local"].items()}
        return "robustness/curves", plot_robustness_curves(curves, levels)

    # ---- feeding back -----------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.guide is not None:
            self.guide.to(pl_module.device)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.guide is None or self.summary is None:
            return
        images, labels = batch[0], batch[1]
        with torch.no_grad():
            images.copy_(self.guide(images, labels))

    # ---- checkpointing ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "summary": self.summary}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        self.summary = state_dict.get("summary")
        if self.guide is not None and self.summary is not None:
            self.guide.set_proposal(self.summary["proposal"])
