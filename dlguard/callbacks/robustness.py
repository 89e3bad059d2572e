"""Local and global robustness swept at the end of validation, fed back as error-guided augmentation."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure
from torch import Tensor

from dlguard._validation import positive_int
from dlguard.augment.error_guided import ErrorGuidedAugmentation
from dlguard.augment.properties import Property, default_properties
from dlguard.callbacks.base import ProbeCallback
from dlguard.data.batch import BatchKeys
from dlguard.data.failure_bank import FailureBank
from dlguard.data.probe_set import ProbeSet, ProbeSetPolicy
from dlguard.generate.sweep import RobustnessSweep, robustness_sweep
from dlguard.report.errors import ErrorSummary, summarize_errors
from dlguard.report.figures import plot_robustness_curves

__all__ = ["RobustnessCallback"]


def _local_proposal(sweep: RobustnessSweep, properties: Sequence[Property]) -> list[list[float]]:
    """``[class][property]`` augmentation probabilities from local robustness alone (no adder).

    The failure rate of class ``c`` under property ``p`` is ``1 − LR_{c,p}`` averaged over the
    levels (classes absent from the probe set: 0); as in the error summary's proposal, the weakest
    cell gets probability 1 and the others their rate relative to it.
    """
    rates = torch.stack(
        [(1 - sweep.local[p.name].per_class[: len(p.levels)]).nan_to_num(0.0).mean(dim=0) for p in properties], dim=1
    )  # (classes, properties)
    top = float(rates.max()) if rates.numel() else 0.0
    return (rates / top if top > 0 else torch.zeros_like(rates)).clamp(0, 1).tolist()


class RobustnessCallback(ProbeCallback):
    """The comprehensive framework (SPEC §5) at the end of validation, on a fixed balanced probe set.

    The probe set holds ``per_class`` inputs of every class that the model, as trained at the first
    scheduled validation epoch, classifies correctly, drawn uniformly (content-keyed) from the
    batches that epoch loads; classes with fewer are used whole, with a warning giving the counts,
    and classes with none are reported (their ``LR_{c,p}`` is NaN and ``LR_p`` averages the others).
    See :class:`~dlguard.callbacks.ProbeCallback` for the schedule, the probe-set policy, the model
    adapter and ``batch_keys``, shared by every dlguard callback.

    Each measurement applies every property at every severity level
    (:func:`~dlguard.generate.robustness_sweep`, batched, the model in eval mode and left as found,
    training's RNG untouched, noise keyed by input so every epoch and every process sees the same
    draws). With ``combine`` (e.g. :func:`~dlguard.metrics.functional.digit_sum` for digits), ``pairs``
    input pairs per property are judged by the adder and :func:`~dlguard.report.summarize_errors`
    explains the failed pairs. Under DDP N processes report the numbers of one process.

    Feedback: with ``guide=ErrorGuidedAugmentation()`` the guide takes each measurement's proposal --
    the error summary's with ``combine``, else one made the same way from ``1 − LR_{c,p}`` -- and
    augments every training batch in place, on the device; with ``bank=`` the perturbed inputs the
    model got wrong (at most ``bank.capacity`` per measurement) are deposited, labelled, for
    :class:`~dlguard.callbacks.FailureReplay`.

    Logged metrics:
        ``robustness/<property>`` (mean ``LR_p`` over levels), ``robustness/<property>@<level>``, and
        with ``combine`` ``global_robustness/<property>`` (adder, mean over levels). With a
        ``WandbLogger``, one chart per property with its own levels (σ, θ, β...) on the x axis,
        ``robustness/curve/<property>``, each measurement; without, ``robustness_curves.png`` when
        the run ends. ``error_summary.json``/``.md`` go to ``<log_dir>/robustness/`` (and into the
        W&B run) at each measurement with ``combine``.

    Args:
        properties: the properties to sweep, each with increasing levels (default: noise, rotation,
            brightness, :func:`~dlguard.augment.default_properties`).
        per_class: probe inputs per class.
        pairs: adder pairs per property and level.
        every_n_epochs: measure at the validation run of every this many training epochs.
        guide: an :class:`~dlguard.augment.ErrorGuidedAugmentation` over the same properties, or ``None``.
        num_classes: ``C``; default the width of the model's logits.
        combine: the adder's combination of two labels; ``None`` measures local robustness only.
        bank: a :class:`~dlguard.data.FailureBank` to deposit failures into, or ``None``.
        max_batch: rows per forward pass during the sweep.
        preprocess: applied to perturbed inputs before the model, e.g. ``Normalize``.
        output_transform: maps the model's output to logits.
        batch_keys: ``(inputs key, target key)`` of the batches, or a callable ``batch -> (inputs, target)``.
        dataloader_idx: the validation loader the probe set is drawn from.
        seed: seed of the probe draw, the pairs and unkeyed random properties.

    Example:
        >>> import lightning as L
        >>> from dlguard.augment import ErrorGuidedAugmentation
        >>> from dlguard.metrics.functional import digit_sum
        >>> callback = RobustnessCallback(per_class=50, pairs=200, combine=digit_sum, guide=ErrorGuidedAugmentation())
        >>> trainer = L.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False)
    """

    prefix = "robustness"

    def __init__(
        self,
        properties: Sequence[Property] | None = None,
        per_class: int = 200,
        pairs: int = 1000,
        every_n_epochs: int = 1,
        guide: ErrorGuidedAugmentation | None = None,
        num_classes: int | None = None,
        combine: Callable[[Tensor, Tensor], Tensor] | None = None,
        bank: FailureBank | None = None,
        max_batch: int = 1024,
        preprocess: Callable[[Tensor], Tensor] | None = None,
        output_transform: Callable[[Any], Tensor] | None = None,
        batch_keys: BatchKeys = (0, 1),
        dataloader_idx: int = 0,
        seed: int = 0,
    ) -> None:
        self.properties = list(properties) if properties is not None else default_properties()
        names = [getattr(p, "name", None) for p in self.properties]
        if not names or len(set(names)) != len(names) or not all(isinstance(p, Property) for p in self.properties):
            raise ValueError(f"properties: expected Property objects with distinct names, got {names}")
        positive_int("per_class", per_class)
        positive_int("pairs", pairs)
        positive_int("max_batch", max_batch)
        if num_classes is not None:
            positive_int("num_classes", num_classes, minimum=2)
        if guide is not None and [p.name for p in guide.properties] != names:
            raise ValueError(f"guide: its properties {[p.name for p in guide.properties]} must be {names}")
        if combine is not None and not callable(combine):
            raise ValueError(f"combine: expected a callable of two label tensors or None, got {type(combine).__name__}")
        if bank is not None and not isinstance(bank, FailureBank):
            raise ValueError(f"bank: expected a FailureBank or None, got {type(bank).__name__}")
        super().__init__(
            every_n_epochs=every_n_epochs,
            preprocess=preprocess,
            output_transform=output_transform,
            batch_keys=batch_keys,
            dataloader_idx=dataloader_idx,
            seed=seed,
        )
        self.per_class, self.pairs, self.max_batch = per_class, pairs, max_batch
        self.guide, self.num_classes, self.combine, self.bank = guide, num_classes, combine, bank
        self.proposal: list[list[float]] | None = None
        """The guide's latest ``[class][property]`` probabilities, or ``None`` before a measurement."""
        self.error_summary: dict[str, Any] | None = None
        """The latest error summary as plain values (without its per-pair failure list), or ``None``."""
        self._pending_summary: ErrorSummary | None = None  # written out by rank zero after the measurement

    @property
    def state_key(self) -> str:
        return self._generate_state_key(properties=[p.name for p in self.properties])

    def _probe_policy(self) -> ProbeSetPolicy:
        ranges = {getattr(p, "value_range", (0.0, 1.0)) for p in self.properties}
        bounds = next(iter(ranges)) if len(ranges) == 1 else (0.0, 1.0)
        hint = (
            "the bounds are the properties' value_range; for inputs that are not [0, 1] pixels pass "
            "properties=default_properties(value_range=None) or properties whose value_range fits"
        )
        return ProbeSetPolicy(
            per_class=self.per_class, correct_only=True, seed=self.seed, value_range=bounds, value_range_hint=hint
        )

    def _check_batch(self, inputs: Tensor, target: Tensor) -> None:
        for prop in self.properties:
            if getattr(prop, "needs_images", False) and inputs.ndim != 4:
                raise ValueError(
                    f"properties: {prop.name!r} needs images (B, C, H, W) but the batches hold inputs of shape "
                    f"{tuple(inputs.shape)}; for other tensors use properties that take any shape (noise, brightness)"
                )

    def _check_model(self, pl_module: torch.nn.Module) -> None:
        if self.guide is not None:
            self.guide.to(pl_module.device)

    # ---- the sweep --------------------------------------------------------------------------

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        assert probe is not None
        self._warn_short_classes(probe)
        sweep = robustness_sweep(
            self.adapter,
            probe.inputs,
            probe.target,
            self.properties,
            num_classes=self.num_classes,
            pairs=self.pairs,
            combine=self.combine,
            keys=probe.keys,
            seed=self.seed,
            max_batch=self.max_batch,
            max_failures=0 if self.bank is None else self.bank.capacity,
        )
        absent = [c for c in range(sweep.num_classes) if c not in probe.class_counts]
        record: dict[str, Any] = {
            "local": {},
            "global": {},
            "probe_size": probe.size,
            "class_counts": probe.class_counts,
            "absent_classes": absent,
        }
        logged: dict[str, float] = {}
        for prop in self.properties:
            curve = sweep.local[prop.name].per_level.reshape(-1)[: len(prop.levels)].tolist()
            record["local"][prop.name] = {"levels": list(prop.levels), "lr_p": curve}
            logged[f"robustness/{prop.name}"] = sum(curve) / len(curve)
            logged.update({f"robustness/{prop.name}@{level:g}": v for level, v in zip(prop.levels, curve, strict=True)})
            if prop.name in sweep.adder:
                global_curve = sweep.adder[prop.name][0].reshape(-1)[: len(prop.levels)].tolist()
                record["global"][prop.name] = global_curve
                logged[f"global_robustness/{prop.name}"] = sum(global_curve) / len(global_curve)
        if sweep.pairs is not None:
            summary = summarize_errors(
                [p.name for p in self.properties], num_classes=sweep.num_classes, combine=self.combine, **sweep.pairs
            )
            self.error_summary = summary.to_dict(include_failures=False)
            self._pending_summary = summary
            proposal = summary.proposal
        else:
            proposal = _local_proposal(sweep, self.properties)
        if self.guide is not None and stage == "validation":
            self.proposal = proposal
            self.guide.set_proposal(proposal)
        if self.bank is not None and stage == "validation":
            self.bank.add(*sweep.failures, origin="robustness")
        return record, logged

    def _warn_short_classes(self, probe: ProbeSet) -> None:
        if probe.found_per_class is None:
            return
        short = {c: n for c, n in probe.found_per_class.items() if n < self.per_class}
        if short:
            warnings.warn(
                f"RobustnessCallback: fewer than per_class={self.per_class} correctly predicted inputs for classes "
                f"{short} (class: count found); those classes are used whole",
                stacklevel=2,
            )

    # ---- reporting --------------------------------------------------------------------------

    def _files(self, record: dict[str, Any]) -> dict[str, str | Figure]:
        summary, self._pending_summary = self._pending_summary, None
        if summary is None:
            return {}
        return {
            "error_summary.json": summary.to_json(indent=2),
            "error_summary.md": summary.to_markdown(),
            "failure_rates.png": summary.plot_failure_rates(),
            "top_confusions.png": summary.plot_top_confusions(),
        }

    def _figures(self, record: Mapping[str, Any]) -> dict[str, Figure]:
        curves = {name: entry["lr_p"] for name, entry in record["local"].items()}
        levels = {name: entry["levels"] for name, entry in record["local"].items()}
        return {"robustness/curves": plot_robustness_curves(curves, levels)}

    def _wandb_figures(self, record: dict[str, Any]) -> dict[str, Figure]:
        return {}  # W&B draws the curves natively (below); rendering the figure each epoch costs ~0.5 s

    def _log_wandb(self, trainer: L.Trainer, experiment: Any, record: dict[str, Any]) -> None:
        import wandb

        for name, entry in record["local"].items():
            ys, keys = [entry["lr_p"]], ["LR_p (local)"]
            if name in record["global"]:
                ys.append(record["global"][name])
                keys.append("adder GR (global)")
            chart = wandb.plot.line_series(
                xs=entry["levels"], ys=ys, keys=keys, title=f"robustness under {name}", xname=f"{name} level"
            )
            experiment.log({f"robustness/curve/{name}": chart, "trainer/global_step": trainer.global_step})

    # ---- feeding back -----------------------------------------------------------------------

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.guide is None:
            return
        self._check_train_batch(batch)
        if self.proposal is None:
            return
        images, labels = self.accessor.read(batch)
        with torch.no_grad():
            self.accessor.write(batch, self.guide(images, labels))

    # ---- checkpointing ----------------------------------------------------------------------

    def _extra_state(self) -> dict[str, Any]:
        return {"summary": self.error_summary, "proposal": self.proposal}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.error_summary = state.get("summary")
        self.proposal = state.get("proposal", None if self.error_summary is None else self.error_summary["proposal"])
        if self.guide is not None and self.proposal is not None:
            self.guide.set_proposal(self.proposal)
