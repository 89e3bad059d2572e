"""D-Score measured during validation, fed back through score-guided padding."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

from dlguard._validation import check_translation as _check_translation
from dlguard.augment.functional.translate import region_translations
from dlguard.augment.score_guided_padding import ScoreGuidedPadding
from dlguard.callbacks._final_figure import _FinalFigureCallback
from dlguard.metrics.dscore import DScore
from dlguard.metrics.functional.dscore import d_score
from dlguard.probes import deletion_mutant_logits, evaluation, resolve_layers, select_layers
from dlguard.probes.layers import LayerSpec
from dlguard.probes.region_deletion import default_max_batch
from dlguard.report.figures import plot_dscore_heatmaps
from dlguard.report.logging import find_wandb_logger, log_figure

__all__ = ["DScoreCallback"]


class DScoreCallback(_FinalFigureCallback):
    """Measure D-Score on a fixed probe set at the end of validation; optionally guide training.

    The probe set is drawn once, uniformly at random with a fixed seed, from the ``(images,
    target)`` batches the first validation epoch already loads (no extra pass over the data;
    never from the sanity check).
    Under DDP each rank draws ``probe_size / world_size`` from its own shard and the metric's
    count states are summed across ranks. The model runs in eval mode and is left exactly as
    found (SPEC §0).

    With ``guide=ScoreGuidedPadding()`` the guide's ``p`` follows ``clip(v_robust / g(n), 0, 1)``
    of the latest measurement, and from then on every training batch's images (``batch[0]``)
    are replaced in place, on the device, in ``on_train_batch_start``, so any LightningModule
    trains on them without code changes.

    Logged metrics:
        ``dscore/d_score``, ``dscore/v_robust``, ``dscore/v_fitness``, ``dscore/baseline_acc``,
        and ``dscore/guide_p`` with a guide. The feature/attention heatmaps go to W&B as
        ``dscore/distributions`` when a ``WandbLogger`` is attached, else to
        ``<log_dir>/dscore/epoch=<e>.png``.

    Args:
        n: grid size (``>= 2``).
        t: padding step divisor of the translation (``> 1``).
        every_n_epochs: measure after every this many epochs.
        probe_size: probe inputs in total (over all ranks).
        guide: a :class:`~dlguard.augment.ScoreGuidedPadding` to drive, or ``None``.
        layers: conv layers to mutate (default every ``Conv2d``).
        num_classes: ``K``; default: the width of the model's logits.
        max_batch: rows per forward pass for mutants and translations (default: a memory budget,
            see :func:`~dlguard.probes.region_deletion.default_max_batch`).
        preprocess: applied to images (after translating) before the model, e.g. ``Normalize``.
        output_transform: adapts the model's output to logits.
        seed: seed of the probe draw.

    Example:
        >>> import lightning as L
        >>> from dlguard.augment import ScoreGuidedPadding
        >>> callback = DScoreCallback(n=3, guide=ScoreGuidedPadding())
        >>> trainer = L.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False)
    """

    def __init__(
        self,
        n: int = 3,
        t: int = 5,
        every_n_epochs: int = 1,
        probe_size: int = 500,
        guide: ScoreGuidedPadding | None = None,
        layers: LayerSpec | None = None,
        num_classes: int | None = None,
        max_batch: int | None = None,
        preprocess: Callable[[Tensor], Tensor] | None = None,
        output_transform: Callable[[Any], Tensor] | None = None,
        seed: int = 0,
    ) -> None:
        _check_translation(n, t)  # before any work
        for name, value in (
            ("every_n_epochs", every_n_epochs),
            ("probe_size", probe_size),
            ("max_batch", max_batch or 1),
        ):
            if value < 1:
                raise ValueError(f"{name}: expected at least 1, got {value}")
        if guide is not None and not isinstance(guide, ScoreGuidedPadding):
            raise ValueError(f"guide: expected a ScoreGuidedPadding or None, got {type(guide).__name__}")
        self.n, self.t, self.every_n_epochs, self.probe_size = n, t, every_n_epochs, probe_size
        self.guide, self.layers, self.num_classes, self.max_batch = guide, layers, num_classes, max_batch
        self.preprocess, self.output_transform, self.seed = preprocess, output_transform, seed
        self.history: list[dict[str, Any]] = []
        self._probe: tuple[Tensor, Tensor] | None = None
        self._draw: dict[str, Tensor] | None = None
        # made in setup: a torch.Generator cannot be pickled into ddp_spawn workers
        self._generator: torch.Generator | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(n=self.n, t=self.t)

    @property
    def latest(self) -> dict[str, Any] | None:
        """The latest measurement (``None`` before the first)."""
        return self.history[-1] if self.history else None

    # ---- set-up ---------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._mutated_layers(pl_module)  # a model without the layers D-Score mutates fails here, before training
        self._generator = torch.Generator().manual_seed(self.seed + trainer.global_rank)
        if self.guide is not None:
            self.guide.to(pl_module.device)

    # ---- drawing the probe set during the first validation epoch ----------------------------

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking or self._probe is not None or dataloader_idx != 0:
            return
        images, target = batch[0], batch[1]
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed + trainer.global_rank)
        keys = torch.rand(len(images), generator=self._generator).to(images.device)
        draw = {"key": keys, "images": images.detach(), "target": target.detach()}
        if self._draw is not None:
            draw = {k: torch.cat([self._draw[k], v]) for k, v in draw.items()}
        per_rank = -(-self.probe_size // trainer.world_size)
        keep = draw["key"].argsort()[:per_rank]  # the smallest keys: a uniform draw, in one pass
        self._draw = {k: v[keep] for k, v in draw.items()}

    # ---- measuring ------------------------------------------------------------------------

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self._probe is None and self._draw is not None:
            self._probe, self._draw = (self._draw["images"], self._draw["target"]), None
        if self._probe is None or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        result = self.measure(pl_module, *self._probe)
        record = {
            "epoch": trainer.current_epoch,
            **{key: float(getattr(result, key)) for key in ("d_score", "v_robust", "v_fitness")},
            "baseline_acc": float(self._metric.baseline_correct / self._metric.total),
            "deletion_acc": (self._metric.deletion_correct / self._metric.total).tolist(),
            "translation_acc": (self._metric.translation_correct / self._metric.total).tolist(),
            "feature_distribution": result.feature_distribution.tolist(),
            "attention_distribution": result.attention_distribution.tolist(),
            "augment_probability": float(result.augment_probability),
            "probe_size": int(self._metric.total),
            "num_classes": self._metric.num_classes,
        }
        self.history.append(record)
        logged = {f"dscore/{key}": record[key] for key in ("d_score", "v_robust", "v_fitness", "baseline_acc")}
        if self.guide is not None:
            self.guide.p = record["augment_probability"]
            logged["dscore/guide_p"] = self.guide.p
        pl_module.log_dict(logged, sync_dist=True)
        if find_wandb_logger(trainer) is not None:  # a heatmap per epoch; without W&B one PNG at the end
            directory = Path(trainer.log_dir or trainer.default_root_dir) / "dscore"
            log_figure(trainer, "dscore/distributions", self._metric.plot(result)[0], directory)

    def _final_figure(self) -> tuple[str, Figure] | None:
        if self.latest is None:
            return None
        latest = self.latest
        accuracies = (latest["baseline_acc"], latest["deletion_acc"], latest["translation_acc"])
        result = d_score(*accuracies, num_classes=latest.get("num_classes", self.num_classes or 10))
        return "dscore/distributions", plot_dscore_heatmaps(result)

    def _mutated_layers(self, model: nn.Module) -> dict[str, nn.Module]:
        return select_layers(model, types=nn.Conv2d) if self.layers is None else resolve_layers(model, self.layers)

    def measure(self, model: nn.Module, images: Tensor, target: Tensor) -> Any:
        """D-Score of ``model`` on ``images``/``target`` (summed over ranks under DDP)."""
        prepare = self.preprocess or (lambda x: x)

        def predict(batch: Tensor) -> Tensor:
            out = model(prepare(batch))
            return self.output_transform(out) if self.output_transform is not None else out

        layers = self._mutated_layers(model)
        with evaluation(model), torch.no_grad():
            baseline = predict(images)
            rows = self.max_batch or default_max_batch(model, prepare(images), layers)
            mutants = deletion_mutant_logits(
                model, prepare(images), self.n, layers, max_batch=rows, output_transform=self.output_transform
            )
            moved = region_translations(images, self.n, self.t).flatten(0, 1)
            translated = torch.cat([predict(part) for part in moved.split(rows)])
        if not hasattr(self, "_metric") or self._metric.num_classes != baseline.shape[-1]:
            self._metric = DScore(self.n, self.num_classes or baseline.shape[-1]).to(images.device)
        self._metric.reset()
        self._metric.update(baseline, mutants, translated.reshape(self.n**2, *baseline.shape), target)
        return self._metric.compute()

    # ---- feeding back into training ---------------------------------------------------------

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.guide is None or not self.history or self.guide.p <= 0:
            return
        images = batch[0]
        with torch.no_grad():
            images.copy_(self.guide(images))

    # ---- checkpointing --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "guide_p": None if self.guide is None else self.guide.p}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        if self.guide is not None and state_dict.get("guide_p") is not None:
            self.guide.p = float(state_dict["guide_p"])
