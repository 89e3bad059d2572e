"""Local and global robustness swept at the end of validation, fed back as error-guided augmentation."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from matplotlib.figure import Figure
from torch import Tensor

from dlguard._validation import optional_positive_int, positive_int
from dlguard.augment.error_guided import ErrorGuidedAugmentation, guide_p, proposal_from_rates, rates_with_prior
from dlguard.augment.properties import Property, check_properties, check_property_inputs, default_properties
from dlguard.callbacks.base import ProbeCallback, ProbeOptions
from dlguard.data.failure_bank import FailureBank
from dlguard.data.probe_set import ProbeSet, ProbeSetPolicy
from dlguard.generate.sweep import robustness_sweep
from dlguard.metrics.functional.robustness import LocalRobustnessResult
from dlguard.metrics.robustness import AdderGlobalRobustness, LocalRobustness
from dlguard.report.errors import ErrorSummary, summarize_errors
from dlguard.utilities.plot import plot_robustness_curves

__all__ = ["RobustnessCallback"]


def _local_proposal(
    local: Mapping[str, LocalRobustnessResult], properties: Sequence[Property], class_counts: Mapping[int, int]
) -> list[list[float]]:
    """``[class][property]`` augmentation probabilities from local robustness alone (no adder).

    The failure rate of class ``c`` under property ``p`` is ``1 − LR_{c,p}`` averaged over the
    levels. A class holding fewer probe inputs than the fullest class is topped up to its count at the
    property's rate over all probe inputs, so a class absent from the probe set (not learnt yet)
    gets that rate, not 0 (:func:`~dlguard.augment.rates_with_prior`). As in the error summary's
    proposal, the weakest cell gets probability 1 and the others their rate relative to it.
    """
    rates = torch.stack([(1 - local[p.name].per_class).mean(dim=0) for p in properties], dim=1)  # (classes, props)
    counts = torch.tensor([class_counts.get(c, 0) for c in range(rates.shape[0])], dtype=rates.dtype)
    return proposal_from_rates(rates_with_prior(rates, counts.to(rates.device), counts.max())).tolist()


class RobustnessCallback(ProbeCallback):
    """The comprehensive framework (SPEC §5) at the end of validation, on a fixed balanced probe set.

    The probe set holds ``per_class`` inputs of every class that the model, as trained at the
    validation epoch the set is drawn at, classifies correctly, drawn uniformly (content-keyed) from
    the batches that epoch loads; classes with fewer are used whole, with a warning giving the counts,
    and classes with none are reported (their ``LR_{c,p}`` is NaN and ``LR_p`` averages the others).
    Measuring starts once more than half of the classes (two at least) are at least half filled;
    until every class is, the set is drawn again at each measured validation of ``fit`` and replaced
    when it fills a class more, so the guide's proposal gains the classes the model learns late. A
    short class counts in ``LR_p`` like any other, from the inputs it holds; in the proposal the inputs
    it lacks count at the property's rate over all probe inputs, so a class absent from the set gets
    that rate rather than 0 and the guide is not kept off it (:func:`~dlguard.augment.rates_with_prior`;
    with ``combine`` the error summary's proposal does this for the classes no pair drew). A
    property no probe input fails at any level (robustness 1.0 throughout) is named in a warning, once:
    its figure is at the ceiling, and the guide never applies it. See
    :class:`~dlguard.callbacks.ProbeCallback` for the schedule, the probe-set policy and the
    arguments every dlguard callback takes.

    Each measurement applies every property at every severity level
    (:func:`~dlguard.generate.robustness_sweep`, batched, the model in eval mode and left as found,
    training's RNG untouched, noise keyed by input so every epoch and every process sees the same
    draws) and counts the outcome in :class:`~dlguard.metrics.LocalRobustness`. With ``combine``
    (e.g. :func:`~dlguard.metrics.functional.digit_sum` for digits), ``pairs`` input pairs per property
    are judged by the adder (:class:`~dlguard.metrics.AdderGlobalRobustness`) and
    :func:`~dlguard.report.summarize_errors` explains the failed pairs. Under DDP N processes report
    the numbers of one process.

    Feedback: with ``guide=ErrorGuidedAugmentation()`` the guide takes each measurement's proposal --
    the error summary's with ``combine``, else one made the same way from ``1 − LR_{c,p}`` -- and
    augments every training batch (the guide protocol of :class:`~dlguard.callbacks.ProbeCallback`);
    with ``bank=`` the perturbed inputs the model got wrong (at most ``bank.capacity`` per
    measurement) are deposited, labelled, for :class:`~dlguard.callbacks.FailureReplay`.

    Logged metrics:
        ``robustness/<property>`` (mean ``LR_p`` over levels), ``robustness/<property>@<level>``,
        with ``combine`` ``global_robustness/<property>`` (adder, mean over levels), and with a guide
        ``robustness/guide_p`` (the probability it now applies a property to a row, mean over the
        classes and properties: ``strength`` x the proposal's mean). With a
        ``WandbLogger``, one chart per property with its own levels (σ, θ, β...) on the x axis,
        ``robustness/curve/<property>``, each measurement, robustness over training as one chart per
        property with a line per measured epoch, ``robustness/over_training/<property>``, and the per
        class x property failure rates (``1 − LR_c,p`` over the levels, with or without ``combine``) as
        a table, ``robustness/class_failure_rates``; without W&B, ``robustness_curves.png`` when the
        run ends. ``error_summary.json``/``.md`` go to ``<log_dir>/robustness/`` (and into the
        W&B run) at each measurement with ``combine``.

    Args:
        properties: the properties to sweep, each with increasing levels (default: noise, rotation,
            brightness, :func:`~dlguard.augment.default_properties`).
        per_class: probe inputs per class.
        pairs: adder pairs per property and level.
        guide: an :class:`~dlguard.augment.ErrorGuidedAugmentation` over the same properties, or ``None``.
        num_classes: ``C``; default the width of the model's logits.
        combine: the adder's combination of two labels; ``None`` measures local robustness only.
        bank: a :class:`~dlguard.data.FailureBank` to deposit failures into, or ``None``.
        max_batch: rows per forward pass (``None``: a memory budget, :func:`~dlguard.probes.default_max_batch`).
        **options: ``every_n_epochs``, ``preprocess``, ``output_transform``, ``batch_keys``, ``dataloader_idx``,
            ``seed`` (here also the seed of the pairs and of unkeyed random properties), ``start_epoch``,
            ``min_accuracy``, ``redraw_every_n_epochs``, ``budget`` (a probe input costs one pass per
            property level; the budget cuts ``per_class``): see :class:`~dlguard.callbacks.ProbeCallback`.

    Example:
        >>> import lightning as L
        >>> from dlguard.augment import ErrorGuidedAugmentation
        >>> from dlguard.metrics.functional import digit_sum
        >>> guide = ErrorGuidedAugmentation()
        >>> callback = RobustnessCallback(per_class=50, pairs=200, combine=digit_sum, guide=guide)
        >>> trainer = L.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False)
    """

    prefix = "robustness"

    guide: ErrorGuidedAugmentation | None

    def __init__(
        self,
        *,
        properties: Sequence[Property] | None = None,
        per_class: int = 200,
        pairs: int = 1000,
        guide: ErrorGuidedAugmentation | None = None,
        num_classes: int | None = None,
        combine: Callable[[Tensor, Tensor], Tensor] | None = None,
        bank: FailureBank | None = None,
        max_batch: int | None = None,
        **options: Unpack[ProbeOptions],
    ) -> None:
        self.properties = check_properties(default_properties() if properties is None else properties)
        names = [p.name for p in self.properties]
        positive_int("per_class", per_class)
        positive_int("pairs", pairs)
        optional_positive_int("max_batch", max_batch)
        optional_positive_int("num_classes", num_classes, minimum=2)
        if guide is not None and not isinstance(guide, ErrorGuidedAugmentation):
            raise ValueError(f"guide: expected an ErrorGuidedAugmentation or None, got {type(guide).__name__}")
        if guide is not None and [p.name for p in guide.properties] != names:
            raise ValueError(f"guide: its properties {[p.name for p in guide.properties]} must be {names}")
        if combine is not None and not callable(combine):
            raise ValueError(f"combine: expected a callable of two label tensors or None, got {type(combine).__name__}")
        self._check_bank(bank)
        super().__init__(**options)
        self.per_class, self.pairs, self.max_batch = per_class, pairs, max_batch
        self.guide, self.num_classes, self.combine, self.bank = guide, num_classes, combine, bank
        self.proposal: list[list[float]] | None = None
        """The guide's latest ``[class][property]`` probabilities, or ``None`` before a measurement."""
        self.error_summary: dict[str, Any] | None = None
        """The latest error summary as plain values (without its per-pair failure list), or ``None``."""
        self._pending_summary: ErrorSummary | None = None  # written out by rank zero after the measurement
        self._said_saturated: set[str] = set()  # properties a warning has named as saturated

    @property
    def state_key(self) -> str:
        return self._generate_state_key(properties=[p.name for p in self.properties])

    def _probe_policy(self) -> ProbeSetPolicy:
        ranges = {p.value_range for p in self.properties}
        bounds = next(iter(ranges)) if len(ranges) == 1 else (0.0, 1.0)
        hint = (
            "the bounds are the properties' value_range; for inputs that are not [0, 1] pixels pass "
            "properties=default_properties(value_range=None) or properties whose value_range fits"
        )
        return ProbeSetPolicy(
            per_class=self.per_class, correct_only=True, seed=self.seed, value_range=bounds, value_range_hint=hint
        )

    def _forward_passes(self, inputs: int) -> int:
        # every level of every property, and one input for the logits' width and one for the pass size
        return inputs * sum(len(p.levels) for p in self.properties) + 2

    def _check_batch(self, inputs: Tensor, target: Tensor) -> None:
        check_property_inputs(self.properties, inputs)

    def _properties(self) -> Sequence[Property]:
        return self.properties

    def _guide_ready(self) -> bool:
        return self.proposal is not None

    # ---- the sweep --------------------------------------------------------------------------

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        assert probe is not None
        self._warn_short_classes(probe, stage)
        run = robustness_sweep(
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
            validate_args=False,  # the probe draw checked the values
        )
        levels = max(len(p.levels) for p in self.properties)
        metric = LocalRobustness(run.num_classes, self.properties, levels).to(run.target.device)
        for prop in self.properties:
            metric.update(run.logits[prop.name], run.target, prop.name)
        local = metric.compute()  # counts summed over every process
        adder = None
        if run.adder_share is not None:
            assert self.combine is not None
            metric_adder = AdderGlobalRobustness(run.num_classes, self.properties, levels, self.combine)
            metric_adder.to(run.target.device).update(*run.adder_share)
            adder = metric_adder.compute()
        absent = [c for c in range(run.num_classes) if c not in probe.class_counts]
        record: dict[str, Any] = {
            "local": {},
            "global": {},
            "probe_size": probe.size,
            "class_counts": probe.class_counts,
            "absent_classes": absent,
            "class_failure_rates": {  # 1 − LR_c,p averaged over the levels; None for a class not in the probe set
                prop.name: [
                    None if c in absent else float(v)
                    for c, v in enumerate((1 - local[prop.name].per_class).mean(dim=0).tolist())
                ]
                for prop in self.properties
            },
        }
        logged: dict[str, float] = {}
        for prop in self.properties:
            curve = local[prop.name].per_level.reshape(-1).tolist()
            record["local"][prop.name] = {"levels": list(prop.levels), "lr_p": curve}
            logged[f"robustness/{prop.name}"] = sum(curve) / len(curve)
            logged.update({f"robustness/{prop.name}@{level:g}": v for level, v in zip(prop.levels, curve, strict=True)})
            if adder is not None and prop.name in adder:
                global_curve = adder[prop.name][0].reshape(-1).tolist()
                record["global"][prop.name] = global_curve
                logged[f"global_robustness/{prop.name}"] = sum(global_curve) / len(global_curve)
        if run.pairs is not None:
            summary = summarize_errors(
                [p.name for p in self.properties], num_classes=run.num_classes, combine=self.combine, **run.pairs
            )
            self.error_summary = summary.to_dict(include_failures=False)
            self._pending_summary = summary
            proposal = summary.proposal
        else:
            proposal = _local_proposal(local, self.properties, probe.class_counts)
        self._warn_if_saturated(trainer, record)
        if self.guide is not None and stage == "validation":
            self.proposal = proposal
            self.guide.set_proposal(proposal)
            logged["robustness/guide_p"] = guide_p(self.guide)
        if self.bank is not None and stage == "validation":
            self.bank.add(*run.failures, origin="robustness")
        return record, logged

    def _warn_if_saturated(self, trainer: L.Trainer, record: Mapping[str, Any]) -> None:
        """A property no input fails at any level is at the ceiling: said once, and what it means for the guide."""
        saturated = [name for name, entry in record["local"].items() if min(entry["lr_p"]) >= 1.0]
        if not saturated or set(saturated) <= self._said_saturated:  # said once per property, when it first is
            return
        self._said_saturated |= set(saturated)
        one = len(saturated) == 1
        guide = ""
        if self.guide is not None:
            every = len(saturated) == len(record["local"])
            guide = (
                "; the guide's proposal is all zeros: it applies nothing"
                if every
                else (f"; the guide never applies {'it' if one else 'them'}")
            )
        rank_zero_warn(
            f"RobustnessCallback: robustness is 1.0 at every level of {saturated} at epoch {trainer.current_epoch}: "
            f"no probe input failed, so {'it is' if one else 'they are'} at the ceiling and cannot show the model "
            f"growing more robust{guide}; for a figure that can move, give harsher levels "
            "(properties=[Property(name, op, levels)])"
        )

    def _warn_short_classes(self, probe: ProbeSet, stage: str) -> None:
        if probe.found_per_class is None:
            return
        wanted = self._drawn_size.get(stage) or self.per_class  # per_class, or what the budget cut it to
        named = self._short.get(stage, {})  # classes short of half: the probe callback has named them
        short = {c: n for c, n in probe.found_per_class.items() if n < wanted and c not in named}
        if short:
            cut = "" if wanted == self.per_class else f" (cut from {self.per_class} by budget={self.budget})"
            warnings.warn(
                f"RobustnessCallback: fewer than per_class={wanted}{cut} correctly predicted inputs for classes "
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

        charts: dict[str, Any] = {}
        epochs = [r for r in self.history if r.get("fn") == "fit"] if record.get("fn") == "fit" else []
        for name, entry in record["local"].items():
            ys, keys = [entry["lr_p"]], ["LR_p (local)"]
            if name in record["global"]:
                ys.append(record["global"][name])
                keys.append("adder GR (global)")
            charts[f"robustness/curve/{name}"] = wandb.plot.line_series(
                xs=entry["levels"], ys=ys, keys=keys, title=f"robustness under {name}", xname=f"{name} level"
            )
            if epochs:  # robustness over training: one line per measured epoch, each over the property's levels
                charts[f"robustness/over_training/{name}"] = wandb.plot.line_series(
                    xs=entry["levels"],
                    ys=[r["local"][name]["lr_p"] for r in epochs],
                    keys=[f"epoch {r['epoch']}" for r in epochs],
                    title=f"LR_p under {name}, epoch by epoch",
                    xname=f"{name} level",
                )
        rows = [
            [cls, name, rate]
            for name, rates in record["class_failure_rates"].items()
            for cls, rate in enumerate(rates)
            if rate is not None
        ]
        charts["robustness/class_failure_rates"] = wandb.Table(
            columns=["class", "property", "failure rate"], data=rows
        )  # per class x property, 1 - LR_c,p over the levels: the error summary's table, with or without combine
        experiment.log({**charts, "trainer/global_step": trainer.global_step})

    # ---- checkpointing ----------------------------------------------------------------------

    def _extra_state(self) -> dict[str, Any]:
        return {"summary": self.error_summary, "proposal": self.proposal}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.error_summary = state.get("summary")
        self.proposal = state.get("proposal", None if self.error_summary is None else self.error_summary["proposal"])
        if self.guide is not None and self.proposal is not None:
            self.guide.set_proposal(self.proposal)
