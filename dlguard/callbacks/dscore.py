"""D-Score measured during validation, fed back through score-guided padding."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

from dlguard._validation import check_translation, positive_int
from dlguard.augment.score_guided_padding import ScoreGuidedPadding
from dlguard.callbacks.base import ProbeCallback
from dlguard.data.batch import BatchKeys
from dlguard.data.probe_set import ProbeSet, ProbeSetPolicy
from dlguard.generate.dscore import dscore_layers, logit_width, measure_dscore
from dlguard.metrics.functional.dscore import d_score
from dlguard.probes.layers import LayerSpec
from dlguard.report.figures import plot_dscore_heatmaps

__all__ = ["DScoreCallback"]

_LOGGED = ("d_score", "v_robust", "v_fitness", "baseline_acc")


class DScoreCallback(ProbeCallback):
    """Measure D-Score on a fixed probe set at the end of validation; optionally guide training.

    The probe set is a uniform random draw of ``probe_size`` inputs from the batches the first
    scheduled validation epoch loads (see :class:`~dlguard.callbacks.ProbeCallback` for the
    schedule, the probe-set policy, ``preprocess``/``output_transform`` and ``batch_keys``, shared by
    every dlguard callback). Each measurement runs the model, its ``n²`` region-deletion mutants and
    the ``n²`` padding translations of the probe set (:func:`~dlguard.generate.measure_dscore`) in
    eval mode and leaves the model exactly as found (SPEC §0). Under DDP each process measures its
    shard; counts are summed, so history, logs and figures hold the numbers of the whole probe set.

    With ``guide=ScoreGuidedPadding()`` the guide's ``p`` follows ``clip(v_robust / g(n), 0, 1)`` of
    the latest measurement, and from then on every training batch's inputs are replaced in place,
    on the device, in ``on_train_batch_start``, so any LightningModule trains on them unchanged.

    Logged metrics:
        ``dscore/d_score``, ``dscore/v_robust``, ``dscore/v_fitness``, ``dscore/baseline_acc``, and
        ``dscore/guide_p`` with a guide. The feature/attention heatmaps go to W&B as
        ``dscore/distributions`` at every measurement when a ``WandbLogger`` is attached, else to
        ``<log_dir>/dscore/dscore_distributions.png`` when the run ends.

    Args:
        n: grid size (``>= 2``).
        t: padding step divisor of the translation (``> 1``).
        every_n_epochs: measure at the validation run of every this many training epochs.
        probe_size: probe inputs in total (over all processes).
        guide: a :class:`~dlguard.augment.ScoreGuidedPadding` to drive, or ``None``.
        layers: conv layers to mutate (default every ``Conv2d``).
        num_classes: ``K``; default the width of the model's logits.
        max_batch: rows per forward pass for mutants and translations (default: a memory budget,
            see :func:`~dlguard.probes.region_deletion.default_max_batch`).
        preprocess: applied to images (after translating) before the model, e.g. ``Normalize``.
        output_transform: maps the model's output to logits.
        batch_keys: ``(inputs key, target key)`` of the batches, or a callable ``batch -> (inputs, target)``.
        dataloader_idx: the validation loader the probe set is drawn from.
        seed: seed of the probe draw.

    Example:
        >>> import lightning as L
        >>> from dlguard.augment import ScoreGuidedPadding
        >>> callback = DScoreCallback(n=3, guide=ScoreGuidedPadding())
        >>> trainer = L.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False)
    """

    prefix = "dscore"

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
        batch_keys: BatchKeys = (0, 1),
        dataloader_idx: int = 0,
        seed: int = 0,
    ) -> None:
        check_translation(n, t)  # before any work
        positive_int("probe_size", probe_size)
        if max_batch is not None:
            positive_int("max_batch", max_batch)
        if num_classes is not None:
            positive_int("num_classes", num_classes, minimum=2)
        if guide is not None and not isinstance(guide, ScoreGuidedPadding):
            raise ValueError(f"guide: expected a ScoreGuidedPadding or None, got {type(guide).__name__}")
        super().__init__(
            every_n_epochs=every_n_epochs,
            preprocess=preprocess,
            output_transform=output_transform,
            batch_keys=batch_keys,
            dataloader_idx=dataloader_idx,
            seed=seed,
        )
        self.n, self.t, self.probe_size = n, t, probe_size
        self.guide, self.layers, self.num_classes, self.max_batch = guide, layers, num_classes, max_batch

    @property
    def state_key(self) -> str:
        return self._generate_state_key(n=self.n, t=self.t)

    def _probe_policy(self) -> ProbeSetPolicy:
        hint = "D-Score deletes and pads pixels: load [0, 1] images and pass the model's normalisation as preprocess"
        return ProbeSetPolicy(size=self.probe_size, seed=self.seed, value_range_hint=hint)

    def _check_model(self, pl_module: nn.Module) -> None:
        dscore_layers(pl_module, self.layers)  # a model without the layers D-Score mutates fails here
        if self.guide is not None:
            self.guide.to(pl_module.device)

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        assert probe is not None
        classes = self.num_classes or logit_width(self.adapter, probe.inputs)
        result = measure_dscore(
            self.adapter,
            probe.inputs,
            probe.target,
            self.n,
            self.t,
            self.layers,
            num_classes=classes,
            max_batch=self.max_batch,
        )
        record = {
            **{key: float(getattr(result, key)) for key in ("d_score", "v_robust", "v_fitness")},
            "baseline_acc": float(result.baseline_accuracy),
            "deletion_acc": result.deletion_accuracy.tolist(),
            "translation_acc": result.translation_accuracy.tolist(),
            "feature_distribution": result.feature_distribution.tolist(),
            "attention_distribution": result.attention_distribution.tolist(),
            "augment_probability": float(result.augment_probability),
            "probe_size": probe.size,
            "class_counts": probe.class_counts,
            "num_classes": classes,
        }
        logged = {f"dscore/{key}": record[key] for key in _LOGGED}
        if self.guide is not None and stage == "validation" and trainer.state.fn == "fit":
            self.guide.p = record["augment_probability"]
            logged["dscore/guide_p"] = self.guide.p
        return record, logged

    def _figures(self, record: Mapping[str, Any]) -> dict[str, Figure]:
        result = d_score(
            record["baseline_acc"],
            torch.tensor(record["deletion_acc"]),
            torch.tensor(record["translation_acc"]),
            record["num_classes"],
        )
        return {"dscore/distributions": plot_dscore_heatmaps(result)}

    # ---- feeding back into training ---------------------------------------------------------

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.guide is None:
            return
        self._check_train_batch(batch)
        if not self.history or self.guide.p <= 0:
            return
        inputs = self.accessor.inputs(batch)
        with torch.no_grad():
            self.accessor.write(batch, self.guide(inputs))

    # ---- checkpointing ----------------------------------------------------------------------

    def _extra_state(self) -> dict[str, Any]:
        return {"guide_p": None if self.guide is None else self.guide.p}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        if self.guide is not None and state.get("guide_p") is not None:
            self.guide.p = float(state["guide_p"])
