"""D-Score measured during validation, fed back through score-guided padding."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Unpack

import lightning as L
import torch
from matplotlib.figure import Figure
from torch import nn

from dlguard._validation import check_translation, one_of, optional_positive_int, positive_int
from dlguard.augment.score_guided_padding import ScoreGuidedPadding
from dlguard.callbacks.base import ProbeCallback, ProbeOptions
from dlguard.data.probe_set import ProbeSet, ProbeSetPolicy
from dlguard.generate.dscore import dscore_layers, dscore_test
from dlguard.metrics.dscore import DScore
from dlguard.metrics.functional.dscore import d_score
from dlguard.probes.layers import LayerSpec
from dlguard.utilities.plot import plot_dscore_heatmaps

__all__ = ["DScoreCallback"]

_LOGGED = ("d_score", "v_robust", "v_fitness", "baseline_acc")


class DScoreCallback(ProbeCallback):
    """Measure D-Score on a fixed probe set at the end of validation; optionally guide training.

    The probe set is a uniform random draw of ``probe_size`` inputs from the batches the first
    scheduled validation epoch loads (see :class:`~dlguard.callbacks.ProbeCallback` for the
    schedule, the probe-set policy and the arguments every dlguard callback takes). Each measurement
    runs the model, its ``n²`` region-deletion mutants and the ``n²`` padding translations of the
    probe set (:func:`~dlguard.generate.dscore_test`) in eval mode, leaving the model exactly as
    found (SPEC §0), and counts them in a :class:`~dlguard.metrics.DScore`. Under DDP each process
    measures its shard; counts are summed, so history, logs and figures hold the numbers of the
    whole probe set.

    With ``guide=ScoreGuidedPadding()`` the guide's ``p`` is set to ``clip(v_robust / g(n), 0, 1)``
    of a measurement and, from then on, pads every training batch (the guide protocol of
    :class:`~dlguard.callbacks.ProbeCallback`), so any LightningModule trains on them unchanged.
    Which measurement, ``p_from`` says:

    - ``"latest"``: every measurement in a fit sets ``p`` (SPEC §1: ``p`` follows the latest
      ``v_robust``). As the padding works, ``v_robust`` falls and ``p`` with it, so the loop settles
      where ``p`` equals what the padded model calls for, below what the unpadded model did.
    - ``"unpadded"``: the paper's protocol, ``p`` from a model trained *without* the augmentation,
      then held. Measurements set ``p`` until the guide has padded a batch; later ones are logged
      but leave ``p`` alone (``start_epoch`` chooses how long the model trains unpadded first). On
      the embedded MNIST this lands where a sweep of constant ``p`` peaks (the paper's Fig. 7; the
      recipe ``recipes/dscore_guided_augmentation.py --sweep``). The held ``p`` stays for the
      callback's life (its checkpoint carries it): give a new model a new callback.

    Either way nothing is padded before a fit's validation has measured: not at the guide's initial
    ``p``, nor after a ``trainer.validate`` before the fit (whose measurement does not set ``p``).

    Logged metrics:
        ``dscore/d_score``, ``dscore/v_robust``, ``dscore/v_fitness``, ``dscore/baseline_acc``, and
        ``dscore/guide_p`` with a guide. The feature/attention heatmaps go to W&B as
        ``dscore/distributions`` at every measurement when a ``WandbLogger`` is attached, else to
        ``<log_dir>/dscore/dscore_distributions.png`` when the run ends.

    Args:
        n: grid size (``>= 2``).
        t: padding step divisor of the translation (``> 1``).
        probe_size: probe inputs in total (over all processes).
        guide: a :class:`~dlguard.augment.ScoreGuidedPadding` to drive, or ``None``. Guides transform a batch
            in the ``Trainer``'s callback order: list this callback before one with a photometric guide, whose
            noise and blur the padding's resampling would otherwise shrink.
        p_from: which measurement sets the guide's ``p``: ``"latest"`` or ``"unpadded"`` (above).
        layers: conv layers to mutate (default every ``Conv2d``).
        num_classes: ``K``; default the width of the model's logits.
        max_batch: rows per forward pass (``None``: a memory budget, :func:`~dlguard.probes.default_max_batch`).
        **options: ``every_n_epochs``, ``preprocess``, ``output_transform``, ``batch_keys``, ``dataloader_idx``,
            ``seed``, ``start_epoch``, ``min_accuracy``, ``redraw_every_n_epochs``, ``budget`` (a probe
            input costs ``1 + 2n²`` passes): see
            :class:`~dlguard.callbacks.ProbeCallback`.

    Example:
        >>> import lightning as L
        >>> from dlguard.augment import ScoreGuidedPadding
        >>> callback = DScoreCallback(n=3, guide=ScoreGuidedPadding())
        >>> trainer = L.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False)
    """

    prefix = "dscore"

    guide: ScoreGuidedPadding | None

    def __init__(
        self,
        *,
        n: int = 3,
        t: int = 5,
        probe_size: int = 500,
        guide: ScoreGuidedPadding | None = None,
        p_from: Literal["latest", "unpadded"] = "latest",
        layers: LayerSpec | None = None,
        num_classes: int | None = None,
        max_batch: int | None = None,
        **options: Unpack[ProbeOptions],
    ) -> None:
        check_translation(n, t)  # before any work
        positive_int("probe_size", probe_size)
        optional_positive_int("max_batch", max_batch)
        optional_positive_int("num_classes", num_classes, minimum=2)
        if guide is not None and not isinstance(guide, ScoreGuidedPadding):
            raise ValueError(f"guide: expected a ScoreGuidedPadding or None, got {type(guide).__name__}")
        p_from = one_of("p_from", p_from, ("latest", "unpadded"))
        if p_from != "latest" and guide is None:
            raise ValueError(f"p_from={p_from!r} sets a guide's p: pass guide=ScoreGuidedPadding()")
        super().__init__(**options)
        self.p_from = p_from
        self._p_set = False  # a fit's measurement has set the guide's p (its initial p is not a measurement)
        self.n, self.t, self.probe_size = n, t, probe_size
        self.guide, self.layers, self.num_classes, self.max_batch = guide, layers, num_classes, max_batch

    @property
    def state_key(self) -> str:
        return self._generate_state_key(n=self.n, t=self.t)

    def _forward_passes(self, inputs: int) -> int:
        # the model, its n² region-deletion mutants and n² translations; two inputs size the passes
        return inputs * (1 + 2 * self.n**2) + 2

    def _probe_policy(self) -> ProbeSetPolicy:
        hint = "D-Score deletes and pads pixels: load [0, 1] images and pass the model's normalisation as preprocess"
        return ProbeSetPolicy(probe_size=self.probe_size, seed=self.seed, value_range_hint=hint)

    def _check_model(self, pl_module: nn.Module) -> None:
        dscore_layers(pl_module, self.layers)  # a model without the layers D-Score mutates fails here

    def _guide_ready(self) -> bool:  # a fit's measurement set p: not the guide's initial p, nor a validate()'s
        return self.guide is not None and self._p_set and self.guide.p > 0

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        assert probe is not None
        run = dscore_test(
            self.adapter,
            probe.inputs,
            probe.target,
            self.n,
            self.t,
            self.layers,
            num_classes=self.num_classes,
            max_batch=self.max_batch,
            validate_args=False,  # the probe draw checked the values
        )
        metric = DScore(self.n, run.num_classes).to(run.logits.device)
        metric.update(run.logits, run.mutant_logits, run.translated_logits, run.target)
        result = metric.compute()  # counts summed over every process
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
            "num_classes": run.num_classes,
        }
        logged = {f"dscore/{key}": record[key] for key in _LOGGED}
        if self.guide is not None and stage == "validation" and trainer.state.fn == "fit":
            if self.p_from == "latest" or not self._guided:  # "unpadded": held once a batch was padded
                self.guide.p = record["augment_probability"]
                self._p_set = True
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

    # ---- checkpointing ----------------------------------------------------------------------

    def _extra_state(self) -> dict[str, Any]:
        return {"guide_p": None if self.guide is None else self.guide.p, "guide_p_set": self._p_set}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        if self.guide is not None and state.get("guide_p") is not None:
            self.guide.p = float(state["guide_p"])
        fit_measured = any(record.get("fn") == "fit" and record.get("stage") == "validation" for record in self.history)
        self._p_set = bool(state.get("guide_p_set", fit_measured))  # older checkpoints: a fit measured
