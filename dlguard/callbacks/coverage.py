"""Neuron coverage measured on the forward passes the evaluation loop already makes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from matplotlib.figure import Figure
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from dlguard._validation import check_values, optional_positive_int, positive_int, probability
from dlguard.callbacks.base import ProbeCallback, ProbeOptions
from dlguard.data.probe_set import ProbeSet
from dlguard.metrics.coverage import (
    KMultisectionCoverage,
    NeuronBoundaryCoverage,
    NeuronCoverage,
    StrongNeuronActivationCoverage,
    TopKNeuronCoverage,
)
from dlguard.metrics.functional.coverage import NeuronRange, input_bounds, neuron_values, scale_neuron_values
from dlguard.probes.evaluation import is_probing
from dlguard.probes.layers import LayerSpec
from dlguard.probes.neurons import neuron_layers, neuron_output, profile_neuron_ranges
from dlguard.report.logging import log_wandb_bars
from dlguard.utilities.plot import plot_coverage_by_layer

__all__ = ["CRITERIA", "SATURATED", "NeuronCoverageCallback"]

CRITERIA = ("nc", "kmnc", "nbc", "snac", "tknc")
"""Neuron coverage (DeepTest), k-multisection, neuron boundary, strong neuron activation, top-k."""
_RANGE_CRITERIA = {"kmnc", "nbc", "snac"}
SATURATED = 0.99
"""A criterion at or above this share of neurons is saturated: a warning names it and what to change."""
_HELD_VALUES = 1 << 22
"""Neuron values (4 Mi, 16 MiB in float32) held back before the metrics count them: few updates per epoch."""


def _join(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class NeuronCoverageCallback(ProbeCallback):
    """Measure coverage criteria on the evaluation loop's own forward passes (no second pass).

    Forward hooks on the selected layers live for one scheduled validation (or test) epoch and
    count only the forward passes the loop's own ``validation_step``/``test_step`` makes: passes
    other dlguard callbacks make to measure the model in the same epoch (mutants, sweeps) are
    neither counted nor paid for beyond a flag check. Each hook reads a layer output once, reducing
    it to per-neuron values shared by every criterion (and, for NC, each input's minimum and
    maximum). The values are held back and counted by every criterion at once, in one update per
    metric at the end of the epoch (or whenever 4 Mi values are held): hit counts are sums over
    inputs, so the numbers are those of per-batch updates. See
    :class:`~dlguard.callbacks.ProbeCallback` for the schedule and the arguments every dlguard
    callback takes (it has no probe set and no generator: it reads the loop's own passes, so
    ``dataloader_idx`` and ``seed`` do not apply). The inputs of every scheduled evaluation batch are
    checked for NaN (the error names the batch), the first batch is read through ``batch_keys`` before
    any training step.

    KMNC, NBC and SNAC need per-neuron ranges: pass ``ranges`` (from
    :func:`~dlguard.probes.profile_neuron_ranges`, e.g. on a finished model) or let the callback
    profile them once on the training data, at the first scheduled validation epoch of a fit -- on
    the model as trained so far -- with a loader of its own (training's shuffling and the global RNG
    are untouched), through the same ``preprocess`` and ``batch_keys`` as the rest of dlguard, so the
    ranges describe what the model sees during validation; under DDP each process profiles its
    slice and the bounds are reduced by min/max. ``trainer.validate``/``trainer.test`` without
    ranges profile on the datamodule's training loader. Ranges are kept in the checkpoint. Metric
    states reduce across processes, so DDP reports the whole validation set.

    Logged metrics:
        ``coverage/<criterion>`` per scheduled epoch (e.g. ``coverage/nc``). With a
        ``WandbLogger``, per-layer bar charts ``coverage/by_layer/<criterion>`` each epoch (native
        W&B charts); without, the latest per-layer chart is written once the run ends to
        ``<log_dir>/coverage/coverage_by_layer.png``.

    Args:
        criteria: any of ``"nc"``, ``"kmnc"``, ``"nbc"``, ``"snac"``, ``"tknc"``.
        layers: ``"auto"`` (every ``Linear``, ``Conv1d/2d/3d``, ``LSTM``/``GRU``/``RNN``) or names.
        threshold: NC threshold in ``[0, 1]``, on each input's layer output min-max scaled (DeepTest's
            scaling). Default 0.75, the strictest threshold DeepXplore and DeepGauge report, not
            DeepTest's 0.2: over a whole validation set the scaled means of nearly every channel pass
            0.2 at least once, so NC at 0.2 reads 1.000 on every layer -- measured on 1,000 validation
            inputs: ``mnist_a`` and ``mnist_b`` 1.000, a ResNet-18 trained on the RGB scenes 1.000 --
            while at 0.75 it reads 0.695, 0.386 and 0.015 and can still rise. A criterion that saturates
            all the same is named in a warning, with what to change.
        sections: KMNC's ``k``.
        top_k: TKNC's ``k``.
        ranges: per-neuron ``{layer: NeuronRange}``; profiled from training data when omitted.
        max_profile_batches: cap the profiling pass.
        **options: ``every_n_epochs``, ``preprocess`` (applied to the training loader's inputs when
            profiling, as the model sees them during validation, e.g. ``Normalize``),
            ``output_transform``, ``batch_keys`` (how to read the inputs of the training and
            evaluation batches), ``start_epoch`` (the first epoch counted; coverage draws no probe
            set, so ``min_accuracy``, ``redraw_every_n_epochs`` and ``budget`` do not apply: it reads
            the loop's own passes and spends none): see
            :class:`~dlguard.callbacks.ProbeCallback`.

    Example:
        >>> import lightning as L
        >>> callback = NeuronCoverageCallback(criteria=("nc", "tknc"))
        >>> trainer = L.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False)
    """

    prefix = "coverage"

    task = None  # coverage reads layer outputs, not the model's output

    def __init__(
        self,
        *,
        criteria: Sequence[str] = CRITERIA,
        layers: LayerSpec | str = "auto",
        threshold: float = 0.75,
        sections: int = 10,
        top_k: int = 2,
        ranges: Mapping[str, NeuronRange] | None = None,
        max_profile_batches: int | None = None,
        **options: Unpack[ProbeOptions],
    ) -> None:
        unknown = [c for c in criteria if c not in CRITERIA]
        if unknown or not criteria or isinstance(criteria, str):
            raise ValueError(f"criteria: unknown {unknown or criteria!r}; choose from {list(CRITERIA)}")
        probability("threshold", threshold)
        positive_int("sections", sections)
        positive_int("top_k", top_k)
        optional_positive_int("max_profile_batches", max_profile_batches)
        super().__init__(**options)
        self.criteria = tuple(dict.fromkeys(criteria))
        self.layers = layers
        self.threshold, self.sections, self.top_k = threshold, sections, top_k
        self.ranges = None if ranges is None else {k: NeuronRange(*v) for k, v in ranges.items()}
        self.max_profile_batches = max_profile_batches
        self._handles: list[RemovableHandle] = []
        # per layer, one entry per forward pass: values (B, N) and, for NC, each input's (low, high)
        self._held: dict[str, list[Tensor]] = {}
        self._held_bounds: dict[str, list[tuple[Tensor, Tensor]]] = {}
        self._held_values = 0
        self._metrics: dict[str, Any] = {}
        self._recording = False

    @property
    def state_key(self) -> str:
        return self._generate_state_key(criteria=self.criteria, layers=str(self.layers))

    @property
    def needs_ranges(self) -> bool:
        return bool(_RANGE_CRITERIA.intersection(self.criteria))

    # ---- set-up: check everything before any work -------------------------------------------

    def _check_model(self, pl_module: nn.Module) -> None:
        self._layers = neuron_layers(pl_module, self.layers)
        if self.ranges is not None and set(self.ranges) != set(self._layers):
            raise ValueError(f"ranges: expected the layers {list(self._layers)}, got {list(self.ranges)}")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.needs_ranges and self.ranges is None and stage != "fit" and not self._has_training_data(trainer):
            raise ValueError(
                f"ranges: criteria {sorted(_RANGE_CRITERIA.intersection(self.criteria))} need per-neuron ranges "
                f"and {getattr(stage, 'value', stage)} has no training data to profile them on; pass ranges="
                "dlguard.probes.profile_neuron_ranges(model, train_loader, layers) or a datamodule with training data"
            )

    def _profile(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ranges = profile_neuron_ranges(
            self.adapter,
            self._training_loader(trainer, shard=True, argument="ranges"),
            self._layers,
            max_batches=self.max_profile_batches,
            batch_inputs=self.accessor.inputs,
        )
        self.ranges = {name: self._reduce_over_ranks(pl_module, r) for name, r in ranges.items()}

    @staticmethod
    def _reduce_over_ranks(pl_module: L.LightningModule, bounds: NeuronRange) -> NeuronRange:
        low, high = pl_module.all_gather(bounds.low), pl_module.all_gather(bounds.high)
        if low.ndim == bounds.low.ndim + 1:  # (world, N) under DDP
            low, high = low.amin(dim=0), high.amax(dim=0)
        return NeuronRange(low, high)

    # ---- hooks live for one evaluation epoch, and count only the loop's own steps ------------

    def _start(self, trainer: L.Trainer, stage: str, loaders: int) -> None:
        self._remove_hooks()
        if not self._scheduled(trainer):
            return
        if self.needs_ranges and self.ranges is None:
            self._profile(trainer, trainer.lightning_module)  # once, on the model as trained so far
        device = trainer.lightning_module.device
        for metric in self._metrics.values():  # an epoch cut short by an exception left counts behind
            metric.reset()
            metric.to(device)  # where the module is now (a later trainer.validate may run it elsewhere)
        scaled = "nc" in self.criteria
        for name, module in self._layers.items():

            def read(module: nn.Module, _inputs: Any, output: Any, name: str = name) -> None:
                if not self._recording or is_probing():
                    return
                activation = neuron_output(module, output).detach()
                values = neuron_values(activation)
                if values is activation:  # (B, N) outputs are their own values: keep them from in-place ops after
                    values = values.clone()
                self._held.setdefault(name, []).append(values)
                self._held_values += values.numel()
                if scaled:  # the values are scaled when counted
                    self._held_bounds.setdefault(name, []).append(input_bounds(activation, values.dtype))

            self._handles.append(module.register_forward_hook(read))

    def _step_starts(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        if not self._read_eval_batch:  # an unreadable batch fails at the first batch (the sanity check's too)
            self._read_eval_batch = self._check_first_batch(batch)
        self._recording = bool(self._handles)
        if self._recording:  # the layer outputs of NaN inputs would poison every criterion: say which batch
            inputs = self.accessor.inputs(batch)
            if inputs.is_floating_point() and bool(torch.isnan(inputs).any()):
                check_values(f"inputs (evaluation loader {dataloader_idx}, batch {batch_idx})", inputs, None)

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._step_starts(batch, batch_idx, dataloader_idx)

    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._step_starts(batch, batch_idx, dataloader_idx)

    def _collect(self, pl_module: L.LightningModule, batch: Any, dataloader_idx: int) -> None:
        self._recording = False
        if self._held_values >= _HELD_VALUES:
            self._count(pl_module)

    def _count(self, pl_module: L.LightningModule) -> None:
        """Update every criterion once with the values held back since the last count."""
        if not self._held:
            return
        values = {name: _join(parts) for name, parts in self._held.items()}
        bounds = {
            name: (_join([b[0] for b in parts]), _join([b[1] for b in parts]))
            for name, parts in self._held_bounds.items()
        }
        scaled = scale_neuron_values(values, bounds) if bounds else {}
        self._forget_held()
        if not self._metrics:
            self._metrics = self._make_metrics({name: v.shape[1] for name, v in values.items()}, pl_module.device)
        for criterion, metric in self._metrics.items():
            metric.update(scaled if criterion == "nc" else values)

    def _make_metrics(self, sizes: dict[str, int], device: torch.device) -> dict[str, Any]:
        make = {
            "nc": lambda: NeuronCoverage(sizes, self.threshold, scale=False, per_layer=True),
            "kmnc": lambda: KMultisectionCoverage(self.ranges, self.sections, per_layer=True),
            "nbc": lambda: NeuronBoundaryCoverage(self.ranges, per_layer=True),
            "snac": lambda: StrongNeuronActivationCoverage(self.ranges, per_layer=True),
            "tknc": lambda: TopKNeuronCoverage(sizes, self.top_k, per_layer=True),
        }
        return {criterion: make[criterion]().to(device) for criterion in self.criteria}

    def _end(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        had_hooks = bool(self._handles)
        if had_hooks:
            self._count(pl_module)
        self._remove_hooks()
        if had_hooks and self._metrics:
            super()._end(trainer, pl_module, stage)

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        per_layer = {}
        for criterion, metric in self._metrics.items():
            ratios = metric.compute()
            per_layer[criterion] = dict(zip(ratios, torch.stack(list(ratios.values())).tolist(), strict=True))
            metric.reset()
        record = {
            **{criterion: values["all"] for criterion, values in per_layer.items()},
            "per_layer": {c: {k: v for k, v in values.items() if k != "all"} for c, values in per_layer.items()},
        }
        self._warn_if_saturated(trainer, record)
        return record, {f"coverage/{c}": record[c] for c in self.criteria}

    def _warn_if_saturated(self, trainer: L.Trainer, record: Mapping[str, Any]) -> None:
        """A criterion at (nearly) 1.0 measures nothing: name it, its full layers, and what to change."""
        advice = {
            "nc": f"raise threshold (now {self.threshold}; DeepXplore used up to 0.75)",
            "kmnc": f"raise sections (now {self.sections})",
            "nbc": "profile the ranges on more training data (max_profile_batches) or pass wider ranges",
            "snac": "profile the ranges on more training data (max_profile_batches) or pass wider ranges",
            "tknc": f"lower top_k (now {self.top_k})",
        }
        for criterion in self.criteria:
            if not record[criterion] >= SATURATED:  # NaN is not saturation
                continue
            layers = [name for name, ratio in record["per_layer"][criterion].items() if ratio >= 1.0]
            shown = ", ".join(layers[:6]) + (f" and {len(layers) - 6} more" if len(layers) > 6 else "")
            rank_zero_warn(
                f"NeuronCoverageCallback: {criterion} is saturated at epoch {trainer.current_epoch} "
                f"({record[criterion]:.3f}; every neuron covered in {len(layers)} of "
                f"{len(record['per_layer'][criterion])} layers: {shown or 'none, each nearly'}), so it can hardly "
                "rise with new inputs and "
                f"measures nothing; {advice[criterion]}"
            )

    def _figures(self, record: Mapping[str, Any]) -> dict[str, Figure]:
        return {"coverage/by_layer": plot_coverage_by_layer(record["per_layer"])}

    def _publish(self, trainer: L.Trainer, record: dict[str, Any]) -> None:
        # native W&B bar charts each epoch (drawn by W&B, not rendered here); PNG once at the end otherwise
        for criterion, layers in record["per_layer"].items():
            log_wandb_bars(trainer, f"coverage/by_layer/{criterion}", layers, f"{criterion.upper()} per layer")

    # ---- cleaning up ------------------------------------------------------------------------

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._forget_held()
        self._recording = False

    def _forget_held(self) -> None:
        self._held.clear()
        self._held_bounds.clear()
        self._held_values = 0

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._remove_hooks()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._remove_hooks()
        super().teardown(trainer, pl_module, stage)

    # ---- checkpointing ----------------------------------------------------------------------

    def _extra_state(self) -> dict[str, Any]:
        ranges = None if self.ranges is None else {k: (v.low.cpu(), v.high.cpu()) for k, v in self.ranges.items()}
        return {"ranges": ranges}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        if state.get("ranges") is not None:
            self.ranges = {k: NeuronRange(*v) for k, v in state["ranges"].items()}
