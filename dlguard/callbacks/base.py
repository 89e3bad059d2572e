"""The spine every dlguard callback shares: schedule, probe set, model adapter, batch access, history, figures."""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from math import ceil
from pathlib import Path
from typing import Any, ClassVar, Literal, TypedDict

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from matplotlib.figure import Figure
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from dlguard import _distributed
from dlguard._own_random import RankGenerator, drawing_from
from dlguard._validation import check_budget, check_values, optional_positive_int, positive_int, probability
from dlguard.augment.guide import Guide
from dlguard.augment.properties import Property
from dlguard.data.batch import BatchAccessor, BatchKeys
from dlguard.data.failure_bank import FailureBank
from dlguard.data.probe_set import ProbeSet, ProbeSetDraw, ProbeSetPolicy
from dlguard.generate.outputs import Task, correct_predictions, model_outputs
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.counting import count_forward_passes
from dlguard.probes.loop_outputs import LoopOutputs
from dlguard.report.logging import find_wandb_logger, log_figure

__all__ = ["ProbeCallback", "ProbeOptions"]


class ProbeOptions(TypedDict, total=False):
    """The arguments every dlguard callback takes, with the same meaning (see :class:`ProbeCallback`).

    Subclasses take them as ``**options: Unpack[ProbeOptions]`` and pass them on: declared and
    documented once, here.
    """

    every_n_epochs: int
    preprocess: Callable[[Tensor], Tensor] | None
    output_transform: Callable[[Any], Tensor] | None
    batch_keys: BatchKeys
    dataloader_idx: int
    seed: int
    start_epoch: int
    min_accuracy: float | Literal["auto"] | None
    redraw_every_n_epochs: int | None
    budget: int | float | None


_STAGES = {"validation", "test"}
_FEW = 5
"""A class the loader offers fewer inputs of than this does not hold back a balanced draw."""
FEWEST_PROBE_INPUTS = 16
"""The smallest uniform probe set a budget cuts to: fewer make no number worth logging."""
DEFAULT_BUDGET = 0.15
"""The default ``budget``: 0.15 of the forward passes of the validation loader the probe set comes from.

The five callbacks that spend then add three quarters of a validation epoch's passes together, and the
work around them (transformations, hooks) fits in the last quarter: a later epoch with all six costs
1.8x a plain one on ResNet-18 with 10,000 validation inputs, 2.1x at 0.2 each; with 1,000, where the
smallest sets cost more and are spaced out, 2.0x on average (``benchmarks/callback_cost.py``; the
first measurement adds one-off work).
"""


class ProbeCallback(Callback, ABC):
    """Base of dlguard's callbacks: a thin driver that measures a model during validation (and test).

    What every subclass gets, with the same argument names and meaning:

    - **Schedule.** During ``fit`` a measurement happens at the end of the validation run of every
      training epoch ``e`` with ``(e + 1) % every_n_epochs == 0`` -- the epochs Lightning's
      ``ModelCheckpoint(every_n_epochs=...)`` counts -- never in the sanity check; a warning at
      set-up says when that can never meet a validation epoch (``check_val_every_n_epoch``,
      ``max_epochs``, ``limit_val_batches=0``). ``trainer.validate`` and ``trainer.test`` measure
      once, at the end of their loop, on their own loader.
    - **Model adapter.** The model is called as ``output_transform(model(preprocess(x)))`` on its
      device and dtype (:class:`~dlguard.probes.ModelAdapter`): perturbations happen in pixel space,
      ``preprocess`` (e.g. ``Normalize``) after them.
    - **Batch access.** ``batch_keys`` reads ``(inputs, target)`` from tuple, list or dict batches or
      through a callable (:class:`~dlguard.data.BatchAccessor`); guides write back into the same
      structure (new tensors in a list or dict batch, so the loader's own stay as they were).
    - **Probe set** (callbacks that need a fixed one). Drawn from the batches the evaluation loop
      already loads -- after the module's batch transfer hooks, so ``limit_val_batches``, custom
      datasets and transforms just work -- from loader ``dataloader_idx``, with a content-keyed draw
      (:class:`~dlguard.data.ProbeSetDraw`): N processes draw the set one process draws, each keeping
      its own shard. The set's keys go into the checkpoint, so a resumed run measures the same inputs.
    - **When the model can be measured.** A probe set is kept only from a validation where the model
      can be measured: a training epoch of at least ``start_epoch``, a validation accuracy (over every
      distinct input of the loader) of at least ``min_accuracy`` (classification), and, for a balanced
      draw, more than half of the loader's classes (two at least) filled: holding at least half the
      inputs they could give (``per_class``, or the class's own count when smaller) among those the
      model gets right. Until then nothing is logged -- no number measured on a collapsed model or a
      one-class probe set -- and a warning says what was missing, with the counts (:attr:`skipped`
      keeps them); the next scheduled validation draws again. A balanced set with classes short of
      half (a class the model does not get yet) is measured on -- so feedback starts as soon as most
      classes can be measured -- with a warning naming them and their counts (kept in the record's
      ``"short_classes"``): their per-class numbers come from the inputs they hold, or are absent, and
      the set is drawn again (its seed) at each later measured validation of ``fit``, replaced when it
      fills a class more, until every class is filled; the redraw clock below keeps the first draw's
      epoch.
      ``min_accuracy="auto"`` (default) is a third of the way from chance ``1/K`` to 1 (0.40 for 10
      classes, 0.47 for 5): a from-scratch network that has collapsed onto one class waits until it
      has learnt something, and a trained one is measured at once. With
      ``redraw_every_n_epochs`` the set is drawn again (seed ``seed + epoch``) once it is that many
      epochs old, so it follows the inputs the model gets right as it trains; a redraw that cannot be
      measured keeps the set in use.
    - **Cost budget.** ``budget`` bounds the forward passes (inputs through the model) one measurement
      spends beyond the evaluation loop's own: an ``int`` is a count, a ``float`` that multiple of the
      distinct inputs of the loader the probe set is drawn from (as ``limit_val_batches`` reads an int
      or a fraction; with the default ``0.15`` a validation epoch with all six costs, on average, about
      two plain ones), ``None`` no bound. A callback sizes its probe set to ``budget / (forward passes
      per probe input)`` when the set is drawn, and HDA its seeds, populations and GA iterations too,
      never below what a number needs (5 per class for a balanced set, 16 inputs for a uniform one,
      one HDA seed of 2 individuals). A measurement that costs more than the budget -- the smallest
      set, on a small loader -- is spaced out in ``fit`` so that spending averages within the budget:
      a validation measures only while what the measurements cost so far is within the budget of the
      validation epochs so far, this one included (a set that costs 3x the budget is measured at about
      one validation epoch in 3, said once in a warning; ``trainer.validate`` and ``trainer.test``
      measure at once). What a measurement spent is counted on the model itself, logged as
      ``<prefix>/forward_passes`` (summed over processes: N processes each add their one-input checks
      of the logits' width and pass size) and kept with the limit and probe size in the record's
      ``"budget"``. The draw reuses the validation step's own logits when the step ran the model on
      the same prepared inputs; otherwise it runs each loader input once, at a draw only, counted as
      ``draw_passes`` beside the budget. Coverage reads the loop's own passes and spends none.
    - **History and checkpoint.** One record per measurement in ``history``; ``state_dict`` keeps
      the history and the probe set's keys.
    - **Figures.** With a ``WandbLogger`` every measurement's figures go to W&B; without, the latest
      figures are written once, as PNG files under ``<log_dir>/<prefix>/``, when the run ends.
    - **Checks before any work.** At the first evaluation batch (the sanity check's, if any) the
      batch is read, its inputs are checked against the probe set's value range, and the model is
      run on two of them: an output that is not what the callback reads (logits ``(B, K)``, or
      predictions for a regression task) fails there, naming ``output_transform``.
    - **Guide protocol.** A callback with a ``guide`` (:class:`~dlguard.augment.Guide`) sets its
      strength from each measurement; from the first measurement on, every training batch is read
      through the batch accessor, augmented as ``guide(inputs, target)`` and written back through it,
      on the device, in ``on_train_batch_start``. The guide's random numbers come from a generator of
      the callback's own (seeded from ``seed``, the callback's class and the process's rank; in the
      checkpoint): a resumed run in one process trains on the draws an uninterrupted run makes (under
      DDP the checkpoint holds rank zero's generator and the other ranks reseed), and the global RNG
      that dropout, the user's augmentations and the loader's shuffling use goes on as without a guide.
      Two guided callbacks of one class need different ``seed`` values to draw different numbers.

    How a callback is built (``docs/architecture.md``): it schedules, takes its probe set from this
    base, calls one generator of :mod:`dlguard.generate` that returns a run record, updates its
    metric from that record, logs, and deposits failures; it never calls the model itself.
    Subclasses set :attr:`prefix`, return a :class:`~dlguard.data.ProbeSetPolicy` from
    :meth:`_probe_policy` (or ``None``) and implement :meth:`_measure`; they take their own
    arguments keyword-only and these through ``**options``.

    Args:
        every_n_epochs: measure at the validation run of every this many training epochs.
        preprocess: applied to (perturbed) inputs before the model, e.g. ``Normalize``.
        output_transform: maps the model's output to what the callback reads: logits ``(B, K)``
            (predictions ``(B,)`` for a regression task).
        batch_keys: ``(inputs key, target key)`` or a callable ``batch -> (inputs, target)``.
        dataloader_idx: the evaluation loader probe sets are drawn from.
        seed: seed of the probe draw (and of any other random choice the callback makes). Two callbacks of
            one class in a ``Trainer`` need different arguments -- a ``seed``, a ``dataloader_idx`` or their
            own settings -- so that their checkpoint keys differ.
        start_epoch: first training epoch whose validation may measure (``fit`` only).
        min_accuracy: validation accuracy the model must reach before a probe set is drawn
            (classification callbacks); ``"auto"``: a third of the way from chance ``1/K`` to 1; ``None``: none.
        redraw_every_n_epochs: draw the probe set again once it is this many training epochs old
            (``None``: keep the first set for the whole fit).
        budget: forward passes one measurement may spend: an ``int`` count, a ``float`` multiple of the
            probe loader's distinct inputs, or ``None`` (no bound).
    """

    prefix: ClassVar[str] = "dlguard"
    """Logged keys are ``<prefix>/<name>``; files and figures go to ``<log_dir>/<prefix>/``."""
    task: Task | None = "classification"
    """What the callback reads from the model's output, checked at the first batch (``None``: nothing)."""
    guide: Guide | None = None
    """The guide the callback drives, or ``None``."""
    num_classes: int | None = None
    """``K``, when the callback was told the width of the logits (checked at the first batch)."""

    def __init__(
        self,
        *,
        every_n_epochs: int = 1,
        preprocess: Callable[[Tensor], Tensor] | None = None,
        output_transform: Callable[[Any], Tensor] | None = None,
        batch_keys: BatchKeys = (0, 1),
        dataloader_idx: int = 0,
        seed: int = 0,
        start_epoch: int = 0,
        min_accuracy: float | Literal["auto"] | None = "auto",
        redraw_every_n_epochs: int | None = None,
        budget: int | float | None = DEFAULT_BUDGET,
        **unexpected: Any,
    ) -> None:
        if unexpected:  # name the callback the user called, not this base
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {sorted(unexpected)}")
        self.every_n_epochs = positive_int("every_n_epochs", every_n_epochs)
        self.dataloader_idx = positive_int("dataloader_idx", dataloader_idx, minimum=0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed: expected an integer, got {seed!r}")
        self.seed = seed
        # the guide's draws: one stream per callback class, so two guides do not draw the same numbers
        self._guide_random = RankGenerator.named(seed, type(self).__name__)
        self._guided = 0  # training batches the guide augmented (a restarted rank reseeds from it)
        self.start_epoch = positive_int("start_epoch", start_epoch, minimum=0)
        if min_accuracy is not None and min_accuracy != "auto":
            probability("min_accuracy", min_accuracy)
        self.min_accuracy = min_accuracy
        self.redraw_every_n_epochs = optional_positive_int("redraw_every_n_epochs", redraw_every_n_epochs)
        self.budget = check_budget(budget)
        ModelAdapter(nn.Identity(), preprocess, output_transform)  # validates both, before any work
        self.preprocess, self.output_transform = preprocess, output_transform
        self.batch_keys = batch_keys
        self.accessor = BatchAccessor(batch_keys)
        self.history: list[dict[str, Any]] = []
        self._adapter: ModelAdapter | None = None
        self._log_dir: Path | None = None
        self._draw: ProbeSetDraw | None = None
        self._restore_draw: ProbeSetDraw | None = None  # finds a checkpoint's probe set again
        self._probes: dict[str, ProbeSet] = {}
        self._drawn_epoch: dict[str, int] = {}  # the training epoch each stage's probe set was drawn at
        self._short: dict[str, dict[int, str]] = {}  # each stage's classes short of half in the set in use
        self._refilling = False  # the running draw fills a set short of classes (its seed, its redraw clock)
        self._restored_probe: dict[str, Any] | None = None
        self._logits_width: int | None = None  # K, read at the first evaluation batch
        self._skipped_before_fit = 0
        self.skipped: list[dict[str, Any]] = []
        """Probe set draws refused because the model could not be measured yet: ``{"epoch", "stage", "reason",
        "kept"}`` each, the reason with its counts (also said in a warning); ``kept`` is ``True`` when that
        validation measured on the set already in use (a refused redraw), ``False`` when it measured nothing
        (``None``: a checkpoint from before it was recorded)."""
        self._read_train_batch = False
        self._read_eval_batch = False
        self._measured_in_fit = False
        self._rests_in_fit = 0  # this fit's validations that saved their budget (_rests)
        self._allowed: dict[str, int | None] = {}  # the forward passes a measurement on each stage's set may spend
        self._drawn_size: dict[str, int | None] = {}  # each stage's per_class (or probe_size) after the budget's cut
        self._draw_passes = 0  # forward passes the running draw made to find the correct inputs
        self._loop_outputs = LoopOutputs()  # the loop's own outputs on the batch, so the draw need not run the model
        self._warned_over_budget = False
        self._spacing: dict[str, int | None] = {"credit": 0, "cost": 0, "allowed": None}  # see _rests
        self._resting = False  # this fit validation measures nothing: it saves its budget (_rests)
        self._warned_spacing = False

    def _generate_state_key(self, **kwargs: Any) -> str:
        # two callbacks of one class in a Trainer need two keys: one per validation loader, or per seed, is a
        # setting users have (added only when not the default, so that default callbacks keep their key)
        shared = {
            name: value for name, value in (("dataloader_idx", self.dataloader_idx), ("seed", self.seed)) if value
        }
        return super()._generate_state_key(**kwargs, **shared)

    @staticmethod
    def _check_bank(bank: object) -> None:
        if bank is not None and not isinstance(bank, FailureBank):
            raise ValueError(f"bank: expected a FailureBank or None, got {type(bank).__name__}")

    # ---- what subclasses provide -----------------------------------------------------------

    def _probe_policy(self) -> ProbeSetPolicy | None:
        """The probe set this callback measures on, or ``None`` when it needs none."""
        return None

    @abstractmethod
    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        """Measure: ``(record for history, {logged key: value})``, both with global (all-rank) numbers."""

    def _figures(self, record: dict[str, Any]) -> dict[str, Figure]:
        """Figures of one record, ``{key: figure}``."""
        return {}

    def _files(self, record: dict[str, Any]) -> dict[str, str | Figure]:
        """Files of one measurement, ``{file name: text or figure}``, written under ``<log_dir>/<prefix>/``."""
        return {}

    def _log_wandb(self, trainer: L.Trainer, experiment: Any, record: dict[str, Any]) -> None:
        """Native W&B charts of one record (rank zero, W&B attached), drawn by W&B, not rendered here."""

    def _wandb_figures(self, record: dict[str, Any]) -> dict[str, Figure]:
        """Figures sent to W&B at every measurement: :meth:`_figures`, unless native charts replace them."""
        return self._figures(record)

    def _forward_passes(self, inputs: int) -> int:
        """Forward passes a measurement on ``inputs`` probe inputs spends (linear in ``inputs``; 0: not sized)."""
        return 0

    def _measurement_cost(self, probe: ProbeSet, allowed: int) -> int:
        """Forward passes a measurement on ``probe`` spends when ``allowed`` this many (what spacing pays)."""
        return self._forward_passes(probe.size)

    def _check_model(self, pl_module: nn.Module) -> None:
        """Raise before any work when the model lacks what the callback needs."""

    def _properties(self) -> Sequence[Property]:
        """The properties the callback applies (warned about at set-up when they draw globally under DDP)."""
        return ()

    def _guide_ready(self) -> bool:
        """Whether a measurement has set the guide's strength, so training batches go through it."""
        return False

    def _check_batch(self, inputs: Tensor, target: Tensor) -> None:
        """Raise at the first evaluation batch (the sanity check's, if any) when the callback cannot use it."""

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        pass

    # ---- what the callback offers ----------------------------------------------------------

    @property
    def latest(self) -> dict[str, Any] | None:
        """The latest measurement record (``None`` before the first)."""
        return self.history[-1] if self.history else None

    @property
    def adapter(self) -> ModelAdapter:
        """The model adapter (set up with the trainer's model)."""
        if self._adapter is None:
            raise RuntimeError(f"{type(self).__name__}: the adapter exists once the trainer has set the callback up")
        return self._adapter

    def probe_set(self, stage: str = "validation") -> ProbeSet | None:
        """The probe set drawn for ``stage`` (``"validation"`` or ``"test"``), if any yet."""
        return self._probes.get(stage)

    def summary(self) -> dict[str, Any]:
        """The latest logged numbers, rounded: what a run report shows."""
        latest = self.latest
        logged = {} if latest is None else latest.get("logged", {})
        return {key.removeprefix(f"{self.prefix}/"): round(value, 4) for key, value in logged.items()}

    def final_figures(self) -> dict[str, Figure]:
        """Figures of the latest measurement (``{}`` before the first)."""
        return {} if self.latest is None else self._figures(self.latest)

    # ---- set-up ----------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # trainer.log_dir broadcasts from rank zero: resolve it here, while more collectives follow. As the
        # last collective of a ddp_spawn run, its work object can outlive the interpreter and abort the worker
        self._log_dir = Path(trainer.log_dir or trainer.default_root_dir)
        self._adapter = ModelAdapter(pl_module, self.preprocess, self.output_transform)
        self._check_model(pl_module)
        if self.guide is not None and isinstance(self.guide, nn.Module):
            self.guide.to(pl_module.device)
        self._guide_random.setup(trainer.global_rank)
        if stage == "fit":
            self._measured_in_fit, self._rests_in_fit = False, 0
            self._skipped_before_fit = len(self.skipped)
            self._warn_if_never_scheduled(trainer)
        self._warn_if_drawn_globally(trainer)

    def _warn_if_drawn_globally(self, trainer: L.Trainer) -> None:
        unkeyed = [p.name for p in self._properties() if p.draws_globally]
        if unkeyed and trainer.world_size > 1:
            warnings.warn(
                f"{type(self).__name__}: properties {unkeyed} are not keyed, so their random draws come from the "
                f"global RNG and {trainer.world_size} processes report other numbers than one process would; "
                "make them keyed=True (draw from the keys they are given, dlguard._random.keyed_normal) or, if "
                "they draw nothing, deterministic=True",
                stacklevel=2,
            )

    def _warn_if_never_scheduled(self, trainer: L.Trainer) -> None:
        name = type(self).__name__
        if trainer.limit_val_batches == 0:
            warnings.warn(f"{name}: validation is off (limit_val_batches=0), so it never measures", stacklevel=2)
            return
        check, epochs = trainer.check_val_every_n_epoch, trainer.max_epochs
        if check is None or epochs is None or epochs < 0:
            return
        if not any(self._scheduled_epoch(e) and (e + 1) % check == 0 for e in range(epochs)):
            warnings.warn(
                f"{name}: every_n_epochs={self.every_n_epochs} with start_epoch={self.start_epoch} never meets a "
                f"validation epoch: validation runs after every {check} training epoch(s) (check_val_every_n_epoch) "
                f"and training stops after max_epochs={epochs}, so it never measures; choose every_n_epochs and "
                "start_epoch that meet a validation epoch",
                stacklevel=2,
            )

    def _scheduled(self, trainer: L.Trainer) -> bool:
        if trainer.sanity_checking:
            return False
        if trainer.state.fn != "fit":
            return True
        return self._scheduled_epoch(trainer.current_epoch)

    def _scheduled_epoch(self, epoch: int) -> bool:
        """Whether training epoch ``epoch``'s validation is one this callback measures at (``fit``)."""
        return epoch >= self.start_epoch and (epoch + 1) % self.every_n_epochs == 0

    # ---- the training data, read without touching training's own loader ----------------------

    @staticmethod
    def _has_training_data(trainer: L.Trainer) -> bool:
        datamodule = trainer.datamodule
        return (
            datamodule is not None and type(datamodule).train_dataloader is not L.LightningDataModule.train_dataloader
        )

    @staticmethod
    def _training_loader(trainer: L.Trainer, shard: bool, argument: str) -> DataLoader:
        """The training data in a loader of its own, unshuffled; with ``shard`` each rank its own slice.

        ``argument`` is what the user passes instead when there is no single training loader (named in
        the error).

        Iterating the trainer's shuffling loader would advance its sampler's generator and change
        the batches training sees; the loader's own generator keeps its base seed off the global
        RNG that augmentations and dropout draw from. ``trainer.validate``/``test`` read the
        datamodule's training loader.
        """
        train = trainer.train_dataloader if trainer.state.fn == "fit" else trainer.datamodule.train_dataloader()
        if not isinstance(train, DataLoader):
            raise ValueError(
                f"{argument}: reading the training data needs a single training DataLoader; pass {argument}="
            )
        dataset = train.dataset
        if shard and trainer.world_size > 1:
            dataset = Subset(dataset, range(trainer.global_rank, len(dataset), trainer.world_size))
        return DataLoader(
            dataset,
            batch_size=train.batch_size or 1,
            shuffle=False,
            collate_fn=train.collate_fn,
            generator=torch.Generator(),
        )

    # ---- drawing the probe set from the evaluation loop's own batches ------------------------

    def _start(self, trainer: L.Trainer, stage: str, loaders: int) -> None:
        if self.dataloader_idx >= loaders:
            raise ValueError(
                f"dataloader_idx: {self.dataloader_idx}, but the {stage} loop has {loaders} dataloader(s) "
                f"(0..{loaders - 1})"
            )
        self._resting = False
        policy = self._probe_policy()
        if policy is None or not self._scheduled(trainer):
            return
        if self._spaced_stage(trainer, stage) and self._rests():
            self._resting = True
            self._rests_in_fit += 1
            return
        restore = self._restored_probe if stage == "validation" else None
        drawn = self._drawn_epoch.get(stage, None if restore is None else restore.get("epoch"))
        scheduled = self._redraw_due(trainer, stage, drawn)
        short = self._short.get(stage, {}) if stage in self._probes else (restore or {}).get("short_classes")
        due = scheduled or (bool(short) and self._spaced_stage(trainer, stage))  # a set short of classes: again
        if stage in self._probes and not due:
            return
        context = f"{stage} loader {self.dataloader_idx}"
        if restore is not None:  # the checkpoint's set: measured on, or kept in case a due redraw is refused
            restored = replace(policy, seed=int(restore["seed"]))
            self._restore_draw = ProbeSetDraw(restored, restore=torch.as_tensor(restore["keys"]), context=context)
            if not due:
                return
        if scheduled:  # a redraw: another seed, so even a uniform draw renews its inputs
            policy = replace(policy, seed=self.seed + trainer.current_epoch)
        elif drawn is not None:  # filling a set short of classes: the seed of the set in use
            in_use = self._probes[stage].seed if stage in self._probes else int((restore or {})["seed"])
            policy = replace(policy, seed=in_use)
        self._draw = ProbeSetDraw(policy, context=context, empty_ok=True)
        self._refilling = not scheduled and drawn is not None
        self._draw_passes = 0

    @staticmethod
    def _spaced_stage(trainer: L.Trainer, stage: str) -> bool:
        """Whether this evaluation is one that spacing may skip and pays for: a fit's validation."""
        return stage == "validation" and trainer.state.fn == "fit"

    def _rests(self) -> bool:
        """Whether this fit validation measures nothing, so that measurements dearer than the budget average within it.

        A credit of forward passes gains the budget's ``allowed`` at every scheduled validation (never
        more than one epoch's worth saved) and pays each measurement's cost; the validation measures
        when the credit is not negative. A set that fits the budget measures at every scheduled
        validation; one that costs ``c`` times the budget (the smallest set a number needs, on a
        small loader) measures at about one in ``c``. The credit is global (every process the same)
        and kept in the checkpoint, so resumed and uninterrupted runs measure at the same epochs.
        """
        allowed, cost, credit = self._spacing["allowed"], self._spacing["cost"] or 0, self._spacing["credit"] or 0
        if self.budget is None or allowed is None or cost <= allowed or min(credit + allowed, allowed) >= 0:
            return False
        self._spacing["credit"] = credit + allowed
        return True

    def _pay(self, stage: str, probe: ProbeSet) -> int | None:
        """A fit validation measured ``probe``: its cost comes off the credit (:meth:`_rests`) and is returned.

        Warns once when the cost is over the budget, so that fit spaces the measurements out.
        """
        allowed = None if self.budget is None else self._allowed.get(stage)
        if allowed is None:
            self._spacing = {"credit": 0, "cost": 0, "allowed": None}
            return None
        cost = self._measurement_cost(probe, allowed)
        credit = min((self._spacing["credit"] or 0) + allowed, allowed) - cost
        self._spacing = {"credit": credit, "cost": cost, "allowed": allowed}
        if cost > allowed and not self._warned_spacing:
            self._warned_spacing = True
            rank_zero_warn(
                f"{type(self).__name__}: the smallest measurement a number needs ({probe.size} probe inputs) costs "
                f"{cost} forward passes, {cost / allowed:.1f}x budget={self.budget} ({allowed}): to keep within the "
                f"budget on average, fit measures at about one scheduled validation in {cost / allowed:.1f} "
                "(trainer.validate and trainer.test measure at once; a metric monitored by ModelCheckpoint or "
                "EarlyStopping is missing in between); raise budget to measure at every one, or lower the "
                "callback's per-input cost (fewer properties, levels, mutants)"
            )
        return cost

    def _redraw_due(self, trainer: L.Trainer, stage: str, drawn: int | None) -> bool:
        if self.redraw_every_n_epochs is None or drawn is None or stage != "validation" or trainer.state.fn != "fit":
            return False
        return trainer.current_epoch - drawn >= self.redraw_every_n_epochs

    def _collect(self, pl_module: L.LightningModule, batch: Any, dataloader_idx: int) -> None:
        self._loop_outputs.stop()
        try:
            self._collect_batch(pl_module, batch, dataloader_idx)
        finally:
            self._loop_outputs.clear()

    def _collect_batch(self, pl_module: L.LightningModule, batch: Any, dataloader_idx: int) -> None:
        if dataloader_idx != self.dataloader_idx:
            return
        if not self._read_eval_batch:  # an unusable batch fails at the first batch (the sanity check's too)
            self._read_eval_batch = self._check_first_batch(batch)
        if self._draw is None and self._restore_draw is None:
            return
        inputs, target = self.accessor.read(batch)
        if self._restore_draw is not None:
            self._restore_draw.add(inputs, target)
        if self._draw is not None:
            correct = None
            if self._needs_correct():
                logits = self._loop_outputs.logits(self.adapter, inputs, self._logits_width)
                if logits is not None:  # the validation step ran the model on these inputs: its prediction
                    correct = logits.argmax(dim=1) == target.to(logits.device)
                else:
                    correct = correct_predictions(self.adapter, inputs, target)
                    self._draw_passes += len(inputs)
            self._draw.add(inputs, target, correct)

    def _needs_correct(self) -> bool:
        """Whether the running draw needs each input's correct prediction (correct-only, or an accuracy to reach)."""
        return self._draw is not None and (self._draw.policy.correct_only or self._accuracy_threshold() is not None)

    def _batch_starts(self, pl_module: L.LightningModule, dataloader_idx: int) -> None:
        if dataloader_idx == self.dataloader_idx and self._draw is not None:
            self._loop_outputs.start(pl_module)

    def _accuracy_threshold(self) -> float | None:
        """The validation accuracy a classification model must reach before it is measured, if any."""
        if self.task != "classification" or self.min_accuracy is None:
            return None
        if self.min_accuracy != "auto":
            return float(self.min_accuracy)
        if self._logits_width is None:
            return None
        chance = 1.0 / self._logits_width
        return chance + (1.0 - chance) / 3  # a third of the way from chance to every input right

    def _check_first_batch(self, batch: Any) -> bool:
        """Inputs, targets and the model's output on two inputs, checked before any work is done.

        Returns whether the batch held inputs (an empty one leaves the check to the next batch).
        """
        inputs, target = self.accessor.read(batch)
        self._check_batch(inputs, target)
        policy = self._probe_policy()
        if policy is not None:
            check_values("inputs (first evaluation batch)", inputs, policy.value_range, policy.value_range_hint)
        if self.task is not None and len(inputs):
            outputs = model_outputs(self.adapter, inputs[:2], self.task)
            if self.task == "classification":
                self._check_logits(outputs)
                self._logits_width = outputs.shape[1]
        return len(inputs) > 0

    def _short_classes(self, probe: ProbeSet, policy: ProbeSetPolicy | None = None) -> dict[int, str]:
        """``{class: "found of needed"}`` for the classes a balanced set holds fewer than half their inputs of.

        A class counts when the loader offered at least ``_FEW`` of its inputs; it needs half of
        ``min(per_class, its inputs in the loader)`` among those the model gets right. Empty for a
        uniform draw or a restored set.
        """
        policy = policy or self._probe_policy()
        if policy is None or policy.per_class is None or probe.found_per_class is None:
            return {}
        per_class, offered = policy.per_class, probe.offered_per_class or {}
        return {
            c: f"{probe.class_counts.get(c, 0)} of {ceil(min(per_class, n) / 2)}"
            for c, n in offered.items()
            if n >= _FEW and probe.class_counts.get(c, 0) < ceil(min(per_class, n) / 2)
        }

    def _not_measurable(self, probe: ProbeSet, policy: ProbeSetPolicy | None = None) -> str | None:
        """Why a freshly drawn probe set cannot be measured on yet (with the counts), or ``None``.

        ``policy`` is the one the draw used (its size cut to the budget); default the callback's.

        Every process reaches the same answer: the counts are global, and the width of the logits is
        agreed (a process whose shard gave no batch learns it from the others).
        """
        if self.task == "classification" and self.min_accuracy == "auto":
            width = torch.tensor([self._logits_width or 0])
            self._logits_width = int(_distributed.gather_cat(width).max()) or None
        if probe.size == 0:
            return f"none of the {probe.seen} inputs qualified (classified correctly)"
        threshold = self._accuracy_threshold()
        if threshold is not None and probe.accuracy is not None and probe.accuracy < threshold:
            how = (
                f"min_accuracy={self.min_accuracy}"
                if self.min_accuracy != "auto"
                else (f"min_accuracy='auto' (a third of the way from chance 1/{self._logits_width} to 1)")
            )
            return (
                f"the validation accuracy {probe.accuracy:.3f} over {probe.seen} inputs is below {how}: {threshold:.3f}"
            )
        policy = policy or self._probe_policy()
        short = self._short_classes(probe, policy)
        counted = sum(n >= _FEW for n in (probe.offered_per_class or {}).values())
        filled = counted - len(short)
        if short and policy is not None and (2 * filled <= counted or filled < 2):  # a majority, two at least
            return (
                f"{self._short_text(short, policy.per_class)}; {filled} of {counted} classes are filled, more than "
                "half (two at least) are needed"
            )
        return None

    @staticmethod
    def _short_text(short: dict[int, str], per_class: int | None) -> str:
        return (
            f"classes {short} hold too few correctly predicted inputs for per-class numbers (found of needed: "
            f"half of min(per_class={per_class}, the class's inputs in the loader))"
        )

    def _spent(
        self, stage: str, probe: ProbeSet | None, spent: int, draw_passes: int, paid: int | None
    ) -> dict[str, Any]:
        """What a measurement was allowed, measured on and spent; warns (once) when it spent more.

        The budget bounds the measurement; a draw that could not reuse the validation step's logits
        (``draw_passes``, one per loader input, at a draw only) is counted in ``forward_passes`` beside it.
        A fit validation that :meth:`_pay` spaced out for its cost (``paid``) says so there instead.
        """
        allowed, measured = self._allowed.get(stage), spent - draw_passes
        spaced = paid is not None and allowed is not None and paid > allowed
        if allowed is not None and measured > allowed and not spaced and not self._warned_over_budget:
            self._warned_over_budget = True
            rank_zero_warn(
                f"{type(self).__name__}: a measurement spent {measured} forward passes, over budget={self.budget} "
                f"({allowed}): the smallest probe set a number needs ({probe.size if probe else 0} inputs) costs "
                "more; raise budget, or lower the callback's per-input cost (fewer properties, levels, mutants)"
            )
        return {
            "budget": self.budget,
            "allowed": allowed,
            "probe_inputs": 0 if probe is None else probe.size,
            "forward_passes": spent,
            "draw_passes": draw_passes,
        }

    def _warn_short(self, trainer: L.Trainer, stage: str, per_class: int | None) -> None:
        """A set measured on without every class filled says which, with the counts, and when it is drawn again."""
        again = (
            "; the set is drawn again at the next measured validation until every class is filled"
            if self._spaced_stage(trainer, stage)
            else ""
        )
        rank_zero_warn(
            f"{type(self).__name__}: measuring at epoch {trainer.current_epoch} without every class: "
            f"{self._short_text(self._short[stage], per_class)}; their per-class numbers come from the inputs they "
            f"hold, or are absent{again}"
        )

    def _skip(self, trainer: L.Trainer, stage: str, reason: str, kept: bool) -> None:
        then = (
            "measuring on the probe set already in use"
            if kept
            else "nothing is logged; the next scheduled validation draws again"
        )
        self.skipped.append({"epoch": trainer.current_epoch, "stage": stage, "reason": reason, "kept": kept})
        rank_zero_warn(f"{type(self).__name__}: no probe set at epoch {trainer.current_epoch}: {reason}; {then}")

    def _allowed_passes(self, seen: int) -> int | None:
        """The forward passes a measurement may spend, for a loader of ``seen`` distinct inputs."""
        if self.budget is None:
            return None
        return self.budget if isinstance(self.budget, int) else ceil(round(self.budget * seen, 9))  # 1.1 x 100: 110

    def _probe_limit(self, seen: int) -> int | None:
        """The most probe inputs the budget pays for (never below what a number needs), or ``None``."""
        allowed, policy = self._allowed_passes(seen), self._probe_policy()
        fixed = self._forward_passes(0)
        per_input = self._forward_passes(1) - fixed
        if allowed is None or per_input <= 0 or policy is None:
            return None
        if policy.per_class is not None:  # the draw keeps at least _FEW per class (a floor every rank agrees on)
            return max((allowed - fixed) // per_input, 0)
        return max((allowed - fixed) // per_input, FEWEST_PROBE_INPUTS)

    def _finish(self, draw: ProbeSetDraw, stage: str | None = None) -> ProbeSet:
        """The drawn set; a fresh draw (``stage`` given) is cut to the budget, which is kept for ``stage``."""
        probe = draw.finish(None if stage is None else self._probe_limit, fewest_per_class=_FEW)
        if stage is not None and probe.seen is not None:
            self._allowed[stage] = self._allowed_passes(probe.seen)
            self._drawn_size[stage] = draw.policy.per_class or draw.policy.probe_size
        with torch.inference_mode(False):  # trainer.validate/test load inference tensors; keep plain ones
            probe.inputs, probe.target = probe.inputs.clone(), probe.target.clone()
        return probe

    def _check_logits(self, logits: Tensor) -> None:
        """The first batch's logits have ``num_classes`` columns, when the callback was given ``num_classes``."""
        if self.num_classes is not None and logits.shape[1] != self.num_classes:
            raise ValueError(
                f"num_classes: is {self.num_classes} but the model's outputs have {logits.shape[1]} classes; "
                "pass the width of the logits (or leave num_classes unset)"
            )

    def _end(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self._scheduled(trainer):
            return
        if self._resting and self._spaced_stage(trainer, stage):
            self._resting = False
            return
        if self._restore_draw is not None:  # the checkpoint's set, found again (first: a redraw may replace it)
            draw, self._restore_draw = self._restore_draw, None
            self._probes[stage] = self._finish(draw)
            self._drawn_epoch[stage] = int((self._restored_probe or {}).get("epoch", trainer.current_epoch))
            self._allowed[stage] = (self._restored_probe or {}).get("allowed")
            self._drawn_size[stage] = (self._restored_probe or {}).get("drawn_size")
            self._short[stage] = dict((self._restored_probe or {}).get("short_classes") or {})
            self._restored_probe = None
        if self._draw is not None:
            draw, self._draw = self._draw, None
            allowed_before, size_before = self._allowed.get(stage), self._drawn_size.get(stage)
            with warnings.catch_warnings(record=True) as said:  # the draw's notes hold for a set measured on
                warnings.simplefilter("always")
                probe = self._finish(draw, stage)
            refill, self._refilling = self._refilling, False
            reason = self._not_measurable(probe, draw.policy)
            short = self._short_classes(probe, draw.policy)
            if refill and (reason is not None or not short.keys() < self._short[stage].keys()):
                # a refill that fills no class more: the set in use stays, quietly (drawn again next time)
                self._allowed[stage], self._drawn_size[stage] = allowed_before, size_before
                said = [note for note in said if not str(note.message).startswith("probe set:")]
                reason, short = None, self._short[stage]
                probe = self._probes[stage]
            forced = reason is not None and trainer.state.fn != "fit"
            if forced:  # asked for numbers now: measure, but say so
                rank_zero_warn(
                    f"{type(self).__name__}: the {stage} numbers come from a model that cannot be measured well: "
                    f"{reason}"
                )
            for note in said:  # a refused set's shortfall is not news: the refusal says why, with the counts
                if reason is None or forced or not str(note.message).startswith("probe set:"):
                    warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
            if reason is None or forced:
                said_short = forced and str(reason).startswith("classes ")  # the forced warning named them
                if probe is not self._probes.get(stage):
                    if not refill:  # a refill keeps the set's seed and its redraw clock
                        self._drawn_epoch[stage] = trainer.current_epoch
                    self._probes[stage], self._short[stage] = probe, short
                    if short and not said_short:
                        self._warn_short(trainer, stage, draw.policy.per_class)
            else:
                self._allowed[stage], self._drawn_size[stage] = allowed_before, size_before  # the set in use
                self._skip(trainer, stage, reason, kept=stage in self._probes)
        probe = self._probes.get(stage)
        draw_passes, self._draw_passes = self._draw_passes, 0
        if self._probe_policy() is not None and probe is None:
            return
        with count_forward_passes(pl_module) as count:
            record, logged = self._measure(trainer, pl_module, probe, stage)
        draw_passes, spent = _distributed.all_sum(torch.tensor([draw_passes, count.inputs + draw_passes])).tolist()
        paid = self._pay(stage, probe) if self._spaced_stage(trainer, stage) and probe is not None else None
        record["budget"] = self._spent(stage, probe, spent, draw_passes, paid)
        if self._probe_policy() is not None:
            logged[f"{self.prefix}/forward_passes"] = float(spent)
        undefined = sorted(key for key, value in logged.items() if not math.isfinite(value))
        if undefined:  # a number without a value is reported missing, never logged as NaN
            logged = {key: value for key, value in logged.items() if key not in undefined}
            rank_zero_warn(
                f"{type(self).__name__}: {undefined} have no value at epoch {trainer.current_epoch} (measured on "
                f"{probe.size if probe is not None else 0} probe inputs) and are not logged"
            )
        self._measured_in_fit |= trainer.state.fn == "fit"
        fn = getattr(trainer.state.fn, "value", trainer.state.fn)  # "fit", "validate" or "test"
        record = {"epoch": trainer.current_epoch, "stage": stage, "fn": fn, **record, "logged": logged}
        if self._short.get(stage):
            record["short_classes"] = dict(self._short[stage])
        self.history.append(record)
        if logged:
            # every rank holds the same global numbers; sync_dist averages identical values (exact)
            pl_module.log_dict(logged, sync_dist=True)
        self._publish(trainer, record)

    # ---- Lightning hooks ---------------------------------------------------------------------

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, "validation", len(trainer.num_val_batches))

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_starts(pl_module, dataloader_idx)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._collect(pl_module, batch, dataloader_idx)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end(trainer, pl_module, "validation")

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, "test", len(trainer.num_test_batches))

    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_starts(pl_module, dataloader_idx)

    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._collect(pl_module, batch, dataloader_idx)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end(trainer, pl_module, "test")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._loop_outputs.clear()
        _distributed.settle()  # a ddp_spawn worker may exit right after: let gloo finish first

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._draw = self._restore_draw = None  # a draw cut short must not be finished by a later run
        self._refilling = False
        self._resting = False
        self._loop_outputs.clear()

    # ---- figures and files -------------------------------------------------------------------

    def _directory(self, trainer: L.Trainer) -> Path:
        """``<log_dir>/<prefix>``, the log directory as resolved at :meth:`setup` (no collective here)."""
        return (self._log_dir if self._log_dir is not None else Path(trainer.default_root_dir)) / self.prefix

    def _publish(self, trainer: L.Trainer, record: dict[str, Any]) -> None:
        directory = self._directory(trainer)
        wandb_logger = find_wandb_logger(trainer)
        if not trainer.is_global_zero:
            return
        files = self._files(record)
        if files:
            directory.mkdir(parents=True, exist_ok=True)
            for name, content in files.items():
                if isinstance(content, Figure):
                    content.savefig(directory / name, dpi=110, bbox_inches="tight")
                else:
                    (directory / name).write_text(content)
                if wandb_logger is not None:
                    wandb_logger.experiment.save(str(directory / name), base_path=str(directory.parent), policy="now")
        if wandb_logger is not None:
            self._log_wandb(trainer, wandb_logger.experiment, record)
            for key, figure in self._wandb_figures(record).items():
                log_figure(trainer, key, figure, directory)

    def _write_final_figures(self, trainer: L.Trainer) -> None:
        directory = self._directory(trainer)
        if find_wandb_logger(trainer) is not None or not trainer.is_global_zero:
            return
        for key, figure in self.final_figures().items():
            log_figure(trainer, key, figure, directory)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_final_figures(trainer)
        self._warn_if_nothing_measured(trainer)

    def _warn_if_nothing_measured(self, trainer: L.Trainer) -> None:
        """A fit whose scheduled validation epochs came and went without a measurement says so, with the counts."""
        check = trainer.check_val_every_n_epoch or 1
        scheduled = [e for e in range(trainer.current_epoch) if self._scheduled_epoch(e) and (e + 1) % check == 0]
        if self._measured_in_fit or not scheduled or trainer.limit_val_batches == 0:
            return
        batches = list(trainer.num_val_batches)
        if self._rests_in_fit:
            cost, allowed = self._spacing["cost"] or 0, self._spacing["allowed"] or 1
            warnings.warn(
                f"{type(self).__name__}: measured nothing in this fit: its {self._rests_in_fit} scheduled validation "
                f"epoch(s) saved budget={self.budget} ({allowed} forward passes each) towards a measurement that costs "
                f"{cost}, which fit makes at about one validation epoch in {cost / allowed:.1f}; raise budget to "
                "measure sooner",
                stacklevel=2,
            )
            return
        if len(self.skipped) > self._skipped_before_fit:  # this fit's own refusals, not a resumed run's earlier ones
            warnings.warn(
                f"{type(self).__name__}: measured nothing in this fit: at each of the {len(scheduled)} scheduled "
                f"validation epoch(s) the model could not be measured yet; the last: {self.skipped[-1]['reason']} "
                "(train longer, or lower min_accuracy)",
                stacklevel=2,
            )
            return
        warnings.warn(
            f"{type(self).__name__}: measured nothing in this fit although {len(scheduled)} validation epoch(s) were "
            f"scheduled: the validation loop ran {batches} batch(es) per loader (an empty validation set, or a loader "
            "that yields nothing?), so its history is empty and nothing was logged",
            stacklevel=2,
        )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "validate":  # trainer.validate(): the run ends here
            self._write_final_figures(trainer)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_final_figures(trainer)

    # ---- feeding back into training ----------------------------------------------------------

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.guide is None:
            return
        if not self._read_train_batch:  # an unreadable batch fails at once, naming batch_keys
            self.accessor.read(batch)
            self._read_train_batch = True
        if not self._guide_ready():
            return
        inputs, target = self.accessor.read(batch)
        with torch.no_grad(), drawing_from(self._guide_random.generator, inputs.device):
            augmented = self.guide(inputs, target)
        self.accessor.write(batch, augmented)
        self._guided += 1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._guide_random.start(trainer.global_rank, self._guided)  # a checkpoint holds rank zero's generator

    # ---- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        probe = self._probes.get("validation")
        probe_state = self._restored_probe
        if probe is not None:
            probe_state = {
                **probe.state_dict(),
                "epoch": self._drawn_epoch.get("validation", 0),
                "allowed": self._allowed.get("validation"),
                "drawn_size": self._drawn_size.get("validation"),
                "short_classes": dict(self._short.get("validation", {})),
            }
        return {
            "history": self.history,
            "probe": probe_state,
            "skipped": self.skipped,
            "spacing": dict(self._spacing),
            "guide_generator": self._guide_random.state(),
            "guided": self._guided,
            **self._extra_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        self.skipped = [{"kept": None, **entry} for entry in state_dict.get("skipped", [])]  # None: not recorded
        self._skipped_before_fit = len(self.skipped)  # a resumed fit warns about its own refusals only
        self._probes.pop("validation", None)
        self._drawn_epoch.pop("validation", None)
        self._short.pop("validation", None)
        self._restored_probe = state_dict.get("probe")
        self._spacing = {"credit": 0, "cost": 0, "allowed": None, **state_dict.get("spacing", {})}
        self._guide_random.load(state_dict.get("guide_generator"))
        self._guided = int(state_dict.get("guided", 0))
        self._load_extra_state(state_dict)
