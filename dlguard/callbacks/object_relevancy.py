"""Object relevancy at the end of validation: does the model read the object or its background? (SPEC §3)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Unpack

import lightning as L
import torch
from matplotlib.figure import Figure
from torch import Tensor

from dlguard._random import content_keys
from dlguard._validation import check_values, optional_positive_int, positive_int, probability
from dlguard.augment.follow_up_cache import FollowUpCache
from dlguard.augment.functional.object_mutations import check_removal
from dlguard.callbacks.base import ProbeCallback, ProbeOptions
from dlguard.data.backgrounds import scene_backgrounds
from dlguard.data.batch import describe_batch
from dlguard.data.failure_bank import FailureBank
from dlguard.data.probe_set import ProbeSet, ProbeSetPolicy
from dlguard.generate.object_relevancy import ObjectRelevancyRun, object_relevancy_test, objects_on_fresh_backgrounds
from dlguard.metrics.object_relevancy import ObjectRelevancy
from dlguard.utilities.plot import plot_image_grid

__all__ = ["ObjectRelevancyCallback"]

MaskSource = Hashable | Callable[[Tensor], Tensor]
"""Where object masks come from: the key (position or dict key) of the masks in each batch, or a
callable ``images (B, C, H, W) -> masks (B, H, W) bool`` (e.g. a threshold for digit-like objects)."""

_DEFAULT_KINDS = (0, 1, 2, 5)  # two photo crops and two textures of dlguard.data.BACKGROUND_KINDS


_FRESH_BACKGROUNDS = 10  # the default; another count enters the checkpoint key


class ObjectRelevancyCallback(ProbeCallback):
    """Object relevancy (SPEC §3) of a classifier's inferences on a fixed probe set, fed back as failures.

    At the first scheduled validation epoch a probe set of ``probe_size`` inputs is drawn (by content, as
    every dlguard probe set) together with their object ``masks`` -- read from each batch, or
    computed by a function. Their follow-ups -- the object moved onto and blended into each of the
    ``backgrounds``, the background grayed; the object's box (``removal``) filled with nine colours,
    inpainted, filled with its margin's mean and median -- are generated once with OpenCV on CPU (in
    parallel, cached in memory and, with ``cache_dir``, on disk) and reused at every later measurement. Each
    measurement runs the model on the probe set and its follow-ups
    (:func:`~dlguard.generate.object_relevancy_test`, each inference scored once) and reports, through
    :class:`~dlguard.metrics.ObjectRelevancy`, the mean object relevancy ``S = (S⁺ + S⁻)/2`` and the
    share of *unreliable* inferences: correct, with ``p ≥ p_high``, yet ``S < s_low``. With a
    ``bank``, the unreliable inferences' objects go into it with their labels, each moved onto
    ``fresh_backgrounds`` backgrounds of its own, drawn anew at every measurement
    (:func:`~dlguard.generate.objects_on_fresh_backgrounds`: :func:`~dlguard.augment.functional.move_objects`
    onto :func:`~dlguard.data.scene_backgrounds` of random kinds): with
    :class:`~dlguard.callbacks.FailureReplay` on the same bank, training sees those objects on
    backgrounds like any other, whose kind says nothing of the label, and learns
    the object. (The follow-ups' own backgrounds are a few fixed images: a model replayed the objects
    on them learns to recognise those images; ``fresh_backgrounds=0`` deposits them all the same.)

    See :class:`~dlguard.callbacks.ProbeCallback` for the schedule and the arguments every dlguard
    callback takes. The numbers reduce across processes (N processes report what one process
    reports); the gallery shows rank zero's shard.

    Logged metrics:
        ``relevancy/score`` (mean ``S``), ``relevancy/preserving`` (mean ``S⁺``), ``relevancy/removing``
        (mean ``S⁻``), ``relevancy/unreliable_rate`` (share of the correct inferences that are unreliable).
        Figures ``relevancy/gallery`` (the least relevant confident correct inferences, each with its
        most damaging follow-ups; captions with ``p`` and ``S``) and ``relevancy/distribution``
        (histogram of ``S``).

    Args:
        masks: the key of the object masks ``(B, H, W)`` in each batch (default: position 2, as
            :class:`~dlguard.data.SceneDataModule` batches ``(image, label, mask)`` have them), or a
            callable ``images -> masks``.
        backgrounds: ``(N, 3 or C, H, W)`` backgrounds in ``[0, 1]`` for the preserving mutations; by
            default four of :func:`~dlguard.data.scene_backgrounds` of the inputs' size.
        removal: the region the object-removing mutations replace: ``"box"`` (default), the object's
            bounding box, so no silhouette of a shape-defined object is left to read; ``"mask"``, the
            object's pixels, as the paper does for segmentations of photographed objects
            (:func:`~dlguard.augment.functional.follow_up_images`).
        probe_size: inputs in the probe set (over all processes).
        p_high: confidence from which a correct inference can be unreliable.
        s_low: object relevancy below which a confident correct inference is unreliable.
        bank: a :class:`~dlguard.data.FailureBank` receiving unreliable inferences' objects on other
            backgrounds, or ``None``.
        fresh_backgrounds: backgrounds drawn anew per measurement for the deposits (``0``: the
            follow-ups' own background swaps).
        cache_dir: a folder to keep follow-ups in across runs, or ``None`` (memory only).
        workers: threads generating follow-ups (``None``: one per CPU core).
        gallery: inferences shown in the gallery.
        max_batch: inputs per forward pass (``None``: a memory budget, :func:`~dlguard.probes.default_max_batch`).
        **options: ``every_n_epochs``, ``preprocess``, ``output_transform``, ``batch_keys``, ``dataloader_idx``,
            ``seed`` (here also the seed of the default backgrounds), ``start_epoch``, ``min_accuracy``,
            ``redraw_every_n_epochs``, ``budget`` (a probe input costs itself and its ``2N + 14``
            follow-ups): see :class:`~dlguard.callbacks.ProbeCallback`.

    Example:
        >>> import lightning as L
        >>> from dlguard.callbacks import FailureReplay
        >>> replay = FailureReplay(fraction=0.25)
        >>> on_scenes = ObjectRelevancyCallback(probe_size=128, bank=replay.bank)  # masks at batch position 2
        >>> on_digits = ObjectRelevancyCallback(masks=lambda x: x[:, 0] > 0.3)  # plain MNIST: threshold the digit
        >>> trainer = L.Trainer(callbacks=[on_scenes, replay], logger=False, enable_progress_bar=False)
    """

    prefix = "relevancy"

    def __init__(
        self,
        *,
        masks: MaskSource = 2,
        backgrounds: Tensor | None = None,
        removal: str = "box",
        probe_size: int = 256,
        p_high: float = 0.9,
        s_low: float = 0.5,
        bank: FailureBank | None = None,
        fresh_backgrounds: int = _FRESH_BACKGROUNDS,
        cache_dir: str | Path | None = None,
        workers: int | None = None,
        gallery: int = 8,
        max_batch: int | None = None,
        **options: Unpack[ProbeOptions],
    ) -> None:
        if not callable(masks) and not isinstance(masks, Hashable):
            raise ValueError(f"masks: expected a batch key or a callable images -> masks, got {masks!r}")
        if backgrounds is not None:
            if not isinstance(backgrounds, Tensor) or backgrounds.ndim != 4 or backgrounds.shape[1] not in (1, 3):
                shape = tuple(backgrounds.shape) if isinstance(backgrounds, Tensor) else type(backgrounds).__name__
                raise ValueError(f"backgrounds: expected (N, 3 or 1, H, W) images, got {shape}")
            if not backgrounds.is_floating_point() or not len(backgrounds):
                raise ValueError(f"backgrounds: expected at least one float image, got {backgrounds.dtype}")
            check_values("backgrounds", backgrounds)
        removal = check_removal(removal)
        self.p_high, self.s_low = probability("p_high", p_high), probability("s_low", s_low)
        positive_int("probe_size", probe_size)
        positive_int("gallery", gallery, minimum=0)
        positive_int("fresh_backgrounds", fresh_backgrounds, minimum=0)
        optional_positive_int("max_batch", max_batch)
        optional_positive_int("workers", workers)
        self._check_bank(bank)
        super().__init__(**options)
        self.masks, self.backgrounds, self.probe_size, self.removal = masks, backgrounds, probe_size, removal
        self.bank, self.workers, self.gallery, self.max_batch = bank, workers, gallery, max_batch
        self.fresh_backgrounds = fresh_backgrounds
        self.cache = FollowUpCache(cache_dir)
        """The follow-ups generated so far, by input content (reused by every measurement)."""
        self.last_run: ObjectRelevancyRun | None = None
        """This process's latest :class:`~dlguard.generate.ObjectRelevancyRun`, or ``None``."""
        self._seen_masks: dict[int, Tensor] = {}
        self._checked_masks = False
        self._fresh_keys: set[int] = set()  # keys (with the fresh draw's seed) of the inputs it may still choose
        self._gallery: tuple[Tensor, list[str]] | None = None

    @property
    def state_key(self) -> str:
        # box against mask removal side by side is a comparison users make: both need their own key
        variants = {"removal": self.removal} if self.removal != "box" else {}
        if self.fresh_backgrounds != _FRESH_BACKGROUNDS:
            variants["fresh_backgrounds"] = self.fresh_backgrounds
        return self._generate_state_key(probe_size=self.probe_size, p_high=self.p_high, s_low=self.s_low, **variants)

    def _forward_passes(self, inputs: int) -> int:
        # the sources and their F = 2·N + 14 follow-ups (N backgrounds); one input sizes the passes
        backgrounds = len(_DEFAULT_KINDS) if self.backgrounds is None else len(self.backgrounds)
        return inputs * (1 + 2 * backgrounds + 14) + 1

    def _probe_policy(self) -> ProbeSetPolicy:
        return ProbeSetPolicy(probe_size=self.probe_size, seed=self.seed)

    # ---- masks travel with the probe draw ------------------------------------------------------

    def _read_masks(self, batch: Any, inputs: Tensor) -> Tensor:
        if callable(self.masks):
            masks = self.masks(inputs)
        else:
            try:
                masks = batch[self.masks]
            except (KeyError, IndexError, TypeError):
                raise ValueError(
                    f"masks: cannot read the object masks at key {self.masks!r} from {describe_batch(batch)}; "
                    "pass masks=<key> or a callable images -> masks (B, H, W)"
                ) from None
        if not isinstance(masks, Tensor):
            raise ValueError(f"masks: expected a tensor (B, H, W), got {type(masks).__name__}")
        if masks.ndim == 4 and masks.shape[1] == 1:
            masks = masks[:, 0]
        if masks.ndim != 3 or masks.shape[0] != inputs.shape[0] or masks.shape[1:] != inputs.shape[-2:]:
            raise ValueError(
                f"masks: expected ({inputs.shape[0]}, {inputs.shape[-2]}, {inputs.shape[-1]}) to match the inputs "
                f"{tuple(inputs.shape)}, got {tuple(masks.shape)}"
            )
        return masks.bool()

    def _check_batch(self, inputs: Tensor, target: Tensor) -> None:
        if inputs.ndim != 4 or inputs.shape[1] not in (1, 3):
            raise ValueError(
                f"inputs: ObjectRelevancyCallback mutates images (B, C, H, W) with C of 1 or 3 around an object mask; "
                f"got shape {tuple(inputs.shape)}"
            )
        if self.backgrounds is not None and self.backgrounds.shape[-2:] != inputs.shape[-2:]:
            raise ValueError(
                f"backgrounds: expected images of the inputs' size {tuple(inputs.shape[-2:])}, got "
                f"{tuple(self.backgrounds.shape[-2:])}"
            )

    def _collect(self, pl_module: L.LightningModule, batch: Any, dataloader_idx: int) -> None:
        super()._collect(pl_module, batch, dataloader_idx)
        draws = [draw for draw in (self._draw, self._restore_draw) if draw is not None]
        if dataloader_idx != self.dataloader_idx or (not draws and self._checked_masks):
            return
        inputs, _ = self.accessor.read(batch)
        masks = self._read_masks(batch, inputs)
        empty = ~masks.flatten(1).any(1)
        if bool(empty.any()):
            raise ValueError(
                f"masks: input {int(empty.nonzero()[0])} of the batch has an empty mask (no object); object "
                "relevancy needs an object in every input"
            )
        self._checked_masks = True
        if not draws:
            return
        fresh: set[int] = set()
        for draw in draws:  # a fresh draw and a checkpoint's set may key the inputs with different seeds
            keys = [int(key) for key in content_keys(inputs, draw.policy.seed).tolist()]
            if draw is self._draw:
                fresh.update(keys)
            for key, mask in zip(keys, masks.cpu(), strict=True):
                self._seen_masks[key] = mask
        self._fresh_keys |= fresh
        if len(self._seen_masks) > 3 * self.probe_size:  # keep the masks a draw can still choose, not the whole set
            wanted = {int(k) for probe in self._probes.values() for k in probe.keys.tolist()}  # kept sets
            if self._restore_draw is not None and self._restore_draw.restore is not None:
                wanted |= set(self._restore_draw.restore.tolist())
            wanted |= set(sorted(self._fresh_keys - wanted)[: self.probe_size])  # the fresh draw's smallest keys
            self._fresh_keys &= wanted
            self._seen_masks = {key: mask for key, mask in self._seen_masks.items() if key in wanted}

    def _backgrounds_for(self, inputs: Tensor) -> Tensor:
        if self.backgrounds is None:
            height, width = inputs.shape[-2:]
            side = max(height, width)
            images, _ = scene_backgrounds(len(_DEFAULT_KINDS), side, kinds=list(_DEFAULT_KINDS), seed=self.seed)
            self.backgrounds = images[..., :height, :width].contiguous()
        return self.backgrounds

    def _failures(self, trainer: L.Trainer, run: ObjectRelevancyRun, masks: Tensor | None) -> tuple[Tensor, Tensor]:
        """The unreliable inferences' objects, each on backgrounds of its own drawn for this measurement.

        No more inputs are moved than the bank keeps (``capacity / fresh_backgrounds``, a content-keyed
        choice): what the bank would drop is not made.
        """
        if not self.fresh_backgrounds or masks is None or self.bank is None:
            return run.failures.inputs, run.failures.labels
        flagged = run.flagged.cpu().nonzero().flatten()
        keep = -(-self.bank.capacity // self.fresh_backgrounds)
        if len(flagged) > keep:  # the lowest content keys: a choice every process and every rerun makes alike
            flagged = flagged[content_keys(run.inputs.cpu()[flagged], self.seed).argsort()[:keep]].sort().values
        images, labels = run.inputs.cpu()[flagged], run.target.cpu()[flagged]
        # new at every measurement of a fit (the step tells validations of one epoch apart), alike on every rank
        seed = self.seed + 7919 * (trainer.global_step + trainer.current_epoch + 1)
        moved = objects_on_fresh_backgrounds(
            images, masks[flagged], labels, self.fresh_backgrounds, seed=seed, workers=self.workers
        )
        return moved.inputs, moved.labels

    # ---- one measurement ---------------------------------------------------------------------

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        assert probe is not None
        inputs, target = probe.inputs.cpu().float(), probe.target.cpu()
        keys = probe.keys.cpu()
        missing = [key for key in keys.tolist() if key not in self._seen_masks]
        if missing:
            raise RuntimeError(f"ObjectRelevancyCallback: no mask was read for {len(missing)} probe input(s)")
        masks = torch.stack([self._seen_masks[key] for key in keys.tolist()]) if len(keys) else None
        kept = {int(k) for every in self._probes.values() for k in every.keys.tolist()}
        self._seen_masks = {key: mask for key, mask in self._seen_masks.items() if key in kept}
        self._fresh_keys = set()
        backgrounds = self._backgrounds_for(inputs)
        follow_ups = None
        if masks is not None:
            follow_ups = self.cache.get_or_make(keys, inputs, masks, backgrounds, self.workers, removal=self.removal)
        metric = ObjectRelevancy(p_high=self.p_high, s_low=self.s_low).to(self.adapter.device)
        run = None
        if follow_ups is not None:  # an empty shard adds nothing
            run = object_relevancy_test(
                self.adapter, inputs, target, follow_ups, self.max_batch, p_high=self.p_high, s_low=self.s_low,
                validate_args=False,  # the probe draw checked the values
            )  # fmt: skip
            metric.update(run.scores)
        self.last_run = run
        result = metric.compute()  # sums over every process
        logged = {
            "relevancy/score": float(result["score"]),
            "relevancy/preserving": float(result["preserving"]),
            "relevancy/removing": float(result["removing"]),
            "relevancy/unreliable_rate": float(result["unreliable_rate"]),
        }
        if self.bank is not None and stage == "validation" and run is not None:
            self.bank.add(*self._failures(trainer, run, masks), origin="relevancy")
        self._gallery = self._gallery_of(run) if run is not None else None
        record = {
            "unreliable": int(result["unreliable"]),
            "inferences": int(result["inferences"]),
            "per_function": {name: float(value) for name, value in result["per_function"].items()},
            "histogram": [int(v) for v in result["histogram"].tolist()],
        }
        return record, logged

    # ---- figures -------------------------------------------------------------------------------

    def _gallery_of(self, run: ObjectRelevancyRun, damaging: int = 3) -> tuple[Tensor, list[str]] | None:
        """The least relevant confident correct inferences, each with its ``damaging`` lowest-scoring follow-ups."""
        scores = run.scores
        confident = (scores.correct & (scores.probability >= self.p_high)).cpu()
        rows = confident.nonzero().squeeze(1)
        if not len(rows) or not self.gallery or scores.follow_up is None:
            return None
        rows = rows[scores.score.cpu()[rows].argsort()[: self.gallery]]
        target = run.target.cpu()
        own = scores.follow_up.cpu().nan_to_num(nan=float("inf"))  # missing follow-ups last
        follow = run.follow_up_logits.cpu().float()
        images, captions = [], []
        for row in rows.tolist():
            label = int(target[row])
            images.append(run.inputs[row].cpu())
            captions.append(f"y={label} p={float(scores.probability[row]):.2f} S={float(scores.score[row]):.2f}")
            for f in own[row].argsort()[:damaging].tolist():
                images.append(run.follow_ups.inputs[row, f].cpu())
                name = run.follow_ups.operation[f].split("/")
                p = float(follow[row, f].softmax(0)[label])
                captions.append(f"{name[0][:14]}/{name[-1][:6]} → {int(follow[row, f].argmax())} p={p:.2f}")
        return torch.stack(images), captions

    def _figures(self, record: dict[str, Any]) -> dict[str, Figure]:
        figures: dict[str, Figure] = {}
        if self._gallery is not None:
            images, captions = self._gallery
            figures["relevancy/gallery"] = plot_image_grid(images, captions, columns=4)
        histogram = record.get("histogram")
        if histogram:
            figure = Figure(figsize=(4, 2.6), layout="tight")
            ax = figure.subplots()
            edges = torch.linspace(0, 1, len(histogram) + 1)
            ax.bar(edges[:-1].tolist(), histogram, width=1 / len(histogram), align="edge", edgecolor="white")
            ax.axvline(self.s_low, color="tab:red", linestyle="--", label=f"s_low = {self.s_low:g}")
            ax.set_xlabel("object relevancy S")
            ax.set_ylabel("inferences")
            ax.legend(fontsize=8)
            figures["relevancy/distribution"] = figure
        return figures
