"""Neuron coverage measured on the forward passes validation already makes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset
from torch.utils.hooks import RemovableHandle

from dlguard.callbacks._final_figure import _FinalFigureCallback
from dlguard.metrics.coverage import (
    KMultisectionCoverage,
    NeuronBoundaryCoverage,
    NeuronCoverage,
    StrongNeuronActivationCoverage,
    TopKNeuronCoverage,
    _LayerCoverage,
)
from dlguard.metrics.functional.coverage import (
    NeuronRange,
    _check_k,
    _check_threshold,
    _scaled_neuron_values,
    neuron_values,
)
from dlguard.probes.capture import _first_tensor
from dlguard.probes.layers import LayerSpec
from dlguard.probes.neurons import neuron_layers, neuron_output, profile_neuron_ranges
from dlguard.report.figures import plot_coverage_by_layer
from dlguard.report.logging import log_wandb_bars

__all__ = ["CRITERIA", "NeuronCoverageCallback"]

CRITERIA = ("nc", "kmnc", "nbc", "snac", "tknc")
"""Neuron coverage (DeepTest), k-multisection, neuron boundary, strong neuron activation, top-k."""
_RANGE_CRITERIA = {"kmnc", "nbc", "snac"}


def _profiling_loader(trainer: L.Trainer) -> DataLoader:
    """The training data in a loader of its own, each rank its own slice.

    Iterating the trainer's shuffling loader would advance its sampler's generator and change the
    batches training sees; the loader's own generator keeps its base seed off the global RNG
    that augmentations and dropout draw from.
    """
    train = trainer.train_dataloader
    if not isinstance(train, DataLoader):
        raise ValueError("ranges: profiling needs a single training DataLoader; pass ranges= instead")
    dataset = train.dataset
    if trainer.world_size > 1:
        dataset = Subset(dataset, range(trainer.global_rank, len(dataset), trainer.world_size))
    return DataLoader(
        dataset,
        batch_size=train.batch_size or 1,
        shuffle=False,
        collate_fn=train.collate_fn,
        generator=torch.Generator(),
    )


def _join(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class NeuronCoverageCallback(_FinalFigureCallback):
    """Measure coverage criteria on the validation loop's own forward passes (no second pass).

    Forward hooks are registered on the selected layers when a scheduled validation epoch starts
    and removed when it ends (also when an exception escapes the loop, and at teardown). Each
    hook reads a layer output once, reducing it to per-neuron values shared by every criterion.
    KMNC, NBC and SNAC need per-neuron ranges: pass ``ranges`` (from
    :func:`~dlguard.metrics.profile_neuron_ranges`, e.g. on a finished model) or let the callback
    profile them once, on the training dataloader, at the first scheduled validation epoch of a
    fit -- on the model as trained so far, not the untrained one of ``on_train_start`` -- with a
    loader of its own, so training's shuffling is untouched (min/max reduced over ranks); they
    are kept in the checkpoint. Metric states reduce across processes, so DDP reports the whole validation set.

    Logged metrics:
        ``coverage/<criterion>`` per scheduled epoch (e.g. ``coverage/nc``). With a
        ``WandbLogger``, per-layer bar charts ``coverage/by_layer/<criterion>`` each epoch (native
        W&B charts); without, the latest per-layer chart is written once the run ends to
        ``<log_dir>/coverage/coverage_by_layer.png``.

    Args:
        criteria: any of ``"nc"``, ``"kmnc"``, ``"nbc"``, ``"snac"``, ``"tknc"``.
        layers: ``"auto"`` (every ``Linear``, ``Conv1d/2d/3d``, ``LSTM``/``GRU``/``RNN``) or names.
        every_n_epochs: measure during every this many validation epochs.
        threshold: NC threshold in ``[0, 1]``.
        sections: KMNC's ``k``.
        top_k: TKNC's ``k``.
        ranges: per-neuron ``{layer: NeuronRange}``; profiled from training data when omitted.
        max_profile_batches: cap the profiling pass.

    Example:
        >>> import lightning as L
        >>> callback = NeuronCoverageCallback(criteria=("nc", "tknc"))
        >>> trainer = L.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False)
    """

    def __init__(
        self,
        criteria: Sequence[str] = CRITERIA,
        layers: LayerSpec | str = "auto",
        every_n_epochs: int = 1,
        threshold: float = 0.2,
        sections: int = 10,
        top_k: int = 2,
        ranges: Mapping[str, NeuronRange] | None = None,
        max_profile_batches: int | None = None,
    ) -> None:
        unknown = [c for c in criteria if c not in CRITERIA]
        if unknown or not criteria:
            raise ValueError(f"criteria: unknown {unknown}; choose from {list(CRITERIA)}")
        _check_threshold(threshold)
        _check_k(sections, "sections")
        _check_k(top_k, "top_k")
        _check_k(every_n_epochs, "every_n_epochs")
        self.criteria = tuple(dict.fromkeys(criteria))
        self.layers, self.every_n_epochs = layers, every_n_epochs
        self.threshold, self.sections, self.top_k = threshold, sections, top_k
        self.ranges = None if ranges is None else {k: NeuronRange(*v) for k, v in ranges.items()}
        self.max_profile_batches = max_profile_batches
        self.history: list[dict[str, Any]] = []
        self._handles: list[RemovableHandle] = []
        self._batch: dict[str, list[tuple[Tensor, Tensor]]] = {}
        self._metrics: dict[str, _LayerCoverage] = {}

    @property
    def state_key(self) -> str:
        return self._generate_state_key(criteria=self.criteria, layers=str(self.layers))

    @property
    def needs_ranges(self) -> bool:
        return bool(_RANGE_CRITERIA.intersection(self.criteria))

    # ---- set-up: check everything before any work -------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._layers = neuron_layers(pl_module, self.layers)
        if self.ranges is not None and set(self.ranges) != set(self._layers):
            raise ValueError(f"ranges: expected the layers {list(self._layers)}, got {list(self.ranges)}")
        if self.needs_ranges and self.ranges is None and stage != "fit":
            raise ValueError(
                f"ranges: criteria {sorted(_RANGE_CRITERIA.intersection(self.criteria))} need per-neuron ranges "
                "and there is no training data to profile outside fit; pass ranges="
                "dlguard.metrics.profile_neuron_ranges(model, train_loader, layers)"
            )

    def _profile(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ranges = profile_neuron_ranges(
            pl_module, _profiling_loader(trainer), self._layers, max_batches=self.max_profile_batches
        )
        self.ranges = {name: self._reduce_over_ranks(pl_module, r) for name, r in ranges.items()}

    @staticmethod
    def _reduce_over_ranks(pl_module: L.LightningModule, bounds: NeuronRange) -> NeuronRange:
        low, high = pl_module.all_gather(bounds.low), pl_module.all_gather(bounds.high)
        if low.ndim == bounds.low.ndim + 1:  # (world, N) under DDP
            low, high = low.amin(dim=0), high.amax(dim=0)
        return NeuronRange(low, high)

    # ---- hooks live for one validation epoch ------------------------------------------------

    def _scheduled(self, trainer: L.Trainer) -> bool:
        return not trainer.sanity_checking and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._scheduled(trainer):
            return
        if self.needs_ranges and self.ranges is None:
            self._profile(trainer, pl_module)  # once, on the model as trained so far
        self._remove_hooks()
        for metric in self._metrics.values():  # an epoch cut short by an exception left counts behind
            metric.reset()
        for name, module in self._layers.items():

            def read(module: nn.Module, _inputs: Any, output: Any, name: str = name) -> None:
                activation = neuron_output(module, _first_tensor(output)).detach()
                values = neuron_values(activation)
                scaled = _scaled_neuron_values(activation, values) if "nc" in self.criteria else values
                self._batch.setdefault(name, []).append((values, scaled))

            self._handles.append(module.register_forward_hook(read))

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self._handles or not self._batch:
            return
        values = {name: _join([v for v, _ in parts]) for name, parts in self._batch.items()}
        scaled = {name: _join([s for _, s in parts]) for name, parts in self._batch.items()}
        self._batch.clear()
        if not self._metrics:
            self._metrics = self._make_metrics({name: v.shape[1] for name, v in values.items()}, pl_module.device)
        for criterion, metric in self._metrics.items():
            metric.update(scaled if criterion == "nc" else values)

    def _make_metrics(self, sizes: dict[str, int], device: torch.device) -> dict[str, _LayerCoverage]:
        make = {
            "nc": lambda: NeuronCoverage(sizes, self.threshold, scale=False, per_layer=True),
            "kmnc": lambda: KMultisectionCoverage(self.ranges, self.sections, per_layer=True),
            "nbc": lambda: NeuronBoundaryCoverage(self.ranges, per_layer=True),
            "snac": lambda: StrongNeuronActivationCoverage(self.ranges, per_layer=True),
            "tknc": lambda: TopKNeuronCoverage(sizes, self.top_k, per_layer=True),
        }
        return {criterion: make[criterion]().to(device) for criterion in self.criteria}

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._handles:
            return
        self._remove_hooks()
        if not self._metrics:
            return
        per_layer = {criterion: metric.compute() for criterion, metric in self._metrics.items()}
        for metric in self._metrics.values():
            metric.reset()
        record = {
            "epoch": trainer.current_epoch,
            **{criterion: float(values["all"]) for criterion, values in per_layer.items()},
            "per_layer": {c: {k: float(v) for k, v in values.items() if k != "all"} for c, values in per_layer.items()},
        }
        self.history.append(record)
        # compute() already reduced the states over ranks: every rank logs the same values
        pl_module.log_dict({f"coverage/{c}": record[c] for c in self.criteria}, sync_dist=False)
        for criterion, layers in record["per_layer"].items():
            log_wandb_bars(trainer, f"coverage/by_layer/{criterion}", layers, f"{criterion.upper()} per layer")

    def _final_figure(self) -> tuple[str, Figure] | None:
        return ("coverage/by_layer", plot_coverage_by_layer(self.history[-1]["per_layer"])) if self.history else None

    # ---- cleaning up ------------------------------------------------------------------------

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._batch.clear()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._remove_hooks()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._remove_hooks()

    # ---- checkpointing ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        ranges = None if self.ranges is None else {k: (v.low.cpu(), v.high.cpu()) for k, v in self.ranges.items()}
        return {"ranges": ranges, "history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        if state_dict.get("ranges") is not None:
            self.ranges = {k: NeuronRange(*v) for k, v in state_dict["ranges"].items()}
