"""DeepTest's metamorphic relations checked on a fixed probe set at the end of validation (SPEC §2)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure
from torch import Tensor

from dlguard import _distributed
from dlguard._validation import check_labels, finite_float, positive_int
from dlguard.augment.properties import Property, deeptest_properties
from dlguard.callbacks.base import ProbeCallback
from dlguard.data.batch import BatchKeys
from dlguard.data.failure_bank import FailureBank
from dlguard.data.probe_set import ProbeSet, ProbeSetPolicy
from dlguard.metrics.functional.metamorphic import TASKS, MetamorphicRelation, check_outputs, squared_errors
from dlguard.metrics.metamorphic import MetamorphicViolations
from dlguard.probes.evaluation import evaluation
from dlguard.report.figures import plot_image_grid

__all__ = ["MetamorphicCallback"]

_OUTPUT = "model output (after output_transform)"


def _check_transformations(transformations: object) -> tuple[Property, ...]:
    if isinstance(transformations, Property):
        transformations = [transformations]
    if not isinstance(transformations, Sequence) or not transformations:
        raise ValueError(
            "transformations: expected a non-empty list of Property (e.g. deeptest_properties()), "
            f"got {transformations!r}"
        )
    wrong = [type(t).__name__ for t in transformations if not isinstance(t, Property)]
    if wrong:
        raise ValueError(f"transformations: expected dlguard.augment.Property items, got {wrong}")
    names = [t.name for t in transformations]
    if len(set(names)) != len(names):
        raise ValueError(f"transformations: expected distinct names, got {names}")
    return tuple(transformations)


class MetamorphicCallback(ProbeCallback):
    """Metamorphic testing (DeepTest, SPEC §2) of a classifier or a steering model during validation.

    At the first scheduled validation epoch a probe set of ``size`` inputs is drawn (by content, as
    every dlguard probe set). Each measurement applies every transformation at every one of its
    parameter values (``Property.levels``) to the probe set -- keyed transformations such as fog
    and rain with per-input draws fixed by content, so every epoch and process sees the same
    images -- and checks the relation on each transformed input:

    - ``task="classification"``: the predicted label of the transformed input equals the source's;
    - ``task="regression"`` (steering, eq. 2): ``(ŷ − y)² ≤ λ·MSE_orig``, ``MSE_orig`` the model's MSE
      on the whole probe set (all processes); a (transformation, parameter) counts only when its
      ``|MSE_trans − MSE_orig| ≤ ε`` (eq. 3), except for fog, rain and compositions.

    Choose transformations under which the true label stays what it was: violations are replayed
    with the source's label, so for a target that a transformation legitimately changes (a position
    under translation, an angle under rotation of a horizon-free image) they would teach wrong labels.

    Counts reduce across processes (:class:`~dlguard.metrics.MetamorphicViolations`), so N processes
    report what one process reports. With a ``bank``, every violating transformed input goes into it
    with the *source's* label (for steering, the true angle: the relation's oracle), so that
    :class:`~dlguard.callbacks.FailureReplay` retrains on them (DeepTest §5.4). The model runs in
    eval mode without gradients and is left exactly as found. See
    :class:`~dlguard.callbacks.ProbeCallback` for the schedule, ``preprocess``/``output_transform``,
    ``batch_keys`` and ``dataloader_idx``, shared by every dlguard callback.

    Logged metrics:
        ``metamorphic/violation_rate`` (violations / transformed inputs, over every transformation and
        parameter that counts), ``metamorphic/<transformation>`` (the same per transformation) and, for
        regression, ``metamorphic/mse_orig``. Figure ``metamorphic/gallery``: the worst violations, each
        source beside its transformed input, captioned with the predicted and true label (angle).

    Args:
        transformations: the :class:`~dlguard.augment.Property` list to apply (default
            :func:`~dlguard.augment.deeptest_properties`: DeepTest's Table 4 plus fog and rain); 1-D
            signals need properties with ``needs_images=False``.
        task: ``"classification"`` (outputs are logits ``(B, K)``, targets labels) or ``"regression"``
            (outputs ``(B,)`` or ``(B, 1)``, targets values such as steering angles).
        lam: eq. 2's ``λ`` (regression), > 0.
        epsilon: eq. 3's ``ε`` (regression), ≥ 0.
        size: inputs in the probe set (over all processes).
        bank: a :class:`~dlguard.data.FailureBank` receiving the violations, or ``None``.
        gallery: violations shown in the gallery.
        every_n_epochs: measure at the validation run of every this many training epochs.
        max_batch: inputs per forward pass.
        preprocess: applied to (transformed) inputs before the model, e.g. ``Normalize``.
        output_transform: maps the model's output to logits (classification) or predictions (regression).
        batch_keys: ``(inputs key, target key)`` of the batches, or a callable ``batch -> (inputs, target)``.
        dataloader_idx: the validation loader the probe set is drawn from.
        seed: seed of the probe draw.

    Example:
        >>> import lightning as L
        >>> from dlguard.augment import deeptest_properties
        >>> from dlguard.callbacks import FailureReplay
        >>> replay = FailureReplay(fraction=0.25)
        >>> fog_and_rain = [p for p in deeptest_properties() if p.name in ("fog", "rain")]
        >>> callback = MetamorphicCallback(fog_and_rain, task="regression", lam=5.0, bank=replay.bank)
        >>> trainer = L.Trainer(callbacks=[callback, replay], logger=False, enable_progress_bar=False)
        >>> MetamorphicCallback([], task="regression")
        Traceback (most recent call last):
        ...
        ValueError: transformations: expected a non-empty list of Property (e.g. deeptest_properties()), got []
    """

    prefix = "metamorphic"

    def __init__(
        self,
        transformations: Sequence[Property] | None = None,
        task: str = "classification",
        lam: float = 5.0,
        epsilon: float = 0.03,
        size: int = 256,
        bank: FailureBank | None = None,
        gallery: int = 8,
        every_n_epochs: int = 1,
        max_batch: int = 1024,
        preprocess: Callable[[Tensor], Tensor] | None = None,
        output_transform: Callable[[Any], Tensor] | None = None,
        batch_keys: BatchKeys = (0, 1),
        dataloader_idx: int = 0,
        seed: int = 0,
    ) -> None:
        self.transformations = _check_transformations(
            deeptest_properties() if transformations is None else transformations
        )
        if task not in TASKS:
            raise ValueError(f"task: expected one of {list(TASKS)}, got {task!r}")
        if finite_float("lam", lam) <= 0:
            raise ValueError(f"lam: expected λ > 0, got {lam}")
        if finite_float("epsilon", epsilon) < 0:
            raise ValueError(f"epsilon: expected ε >= 0, got {epsilon}")
        positive_int("size", size)
        positive_int("gallery", gallery, minimum=0)
        positive_int("max_batch", max_batch)
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
        self.task, self.lam, self.epsilon = task, float(lam), float(epsilon)
        self.size, self.bank, self.gallery, self.max_batch = size, bank, gallery, max_batch
        self.relation = MetamorphicRelation(task, lam=self.lam)
        self._gallery: tuple[Tensor, list[str]] | None = None

    @property
    def state_key(self) -> str:
        names = [t.name for t in self.transformations]
        return self._generate_state_key(task=self.task, transformations=names, lam=self.lam, epsilon=self.epsilon)

    def _probe_policy(self) -> ProbeSetPolicy:
        ranges = {t.value_range for t in self.transformations}
        bounds = ranges.pop() if len(ranges) == 1 else (0.0, 1.0)
        hint = "the transformations work in pixel space: load [0, 1] images and pass the normalisation as preprocess"
        return ProbeSetPolicy(
            size=self.size, seed=self.seed, value_range=bounds, value_range_hint=hint, labels=self.task != "regression"
        )

    def _check_batch(self, inputs: Tensor, target: Tensor) -> None:
        images_only = [t.name for t in self.transformations if t.needs_images]
        if images_only and inputs.ndim != 4:
            raise ValueError(
                f"transformations: {images_only} need images (B, C, H, W), the inputs have shape "
                f"{tuple(inputs.shape)}; for other tensors use properties with needs_images=False "
                "(e.g. default_properties(value_range=None)'s noise and brightness)"
            )
        if self.task == "classification":
            if target.is_floating_point():
                raise ValueError(
                    "task: 'classification' needs integer class labels, the batch's targets are floats "
                    f"({target.dtype}, e.g. steering angles); use task='regression'"
                )
            check_labels("target", target, batch=len(inputs))
        elif not target.is_floating_point() or target.reshape(len(target), -1).shape[1] != 1:
            raise ValueError(
                "task: 'regression' needs one float target per input (e.g. a steering angle), got "
                f"{target.dtype} targets of shape {tuple(target.shape)}; class labels need task='classification'"
            )

    # ---- one measurement -----------------------------------------------------------------------

    def _outputs(self, inputs: Tensor) -> Tensor:
        parts = [self.adapter(part) for part in inputs.split(self.max_batch)] if len(inputs) else []
        wrong = next((type(part).__name__ for part in parts if not isinstance(part, Tensor)), None)
        if wrong is not None:
            raise ValueError(
                f"output_transform: the model returned {wrong}, expected a tensor of logits (B, K) or predictions "
                "(B,); pass output_transform= to map the model's output to one"
            )
        if not parts:
            width = () if self.task == "regression" else (0,)
            return torch.zeros((0, *width), device=self.adapter.device)
        return check_outputs(self.task, torch.cat(parts).float(), _OUTPUT)

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        assert probe is not None
        device = self.adapter.device
        inputs, keys = probe.inputs.to(device), probe.keys.to(device)
        target = probe.target.to(device)
        if self.task == "regression":
            target = target.reshape(len(target)).float()
        metric = MetamorphicViolations(
            {t.name: t.levels for t in self.transformations},
            task=self.task,
            lambdas=(self.lam,),
            epsilons=(self.epsilon,),
        ).to(device)
        found: list[tuple[str, int, Tensor, Tensor, Tensor]] = []  # name, level index, rows, outputs, transformed
        with evaluation(pl_module), torch.no_grad():
            source = self._outputs(inputs)
            mse_orig = None
            if self.task == "regression":
                total = _distributed.all_sum(torch.stack([squared_errors(source, target).sum(), torch.tensor(
                    float(len(target)), device=device)]).double())  # fmt: skip
                mse_orig = float(total[0] / total[1]) if total[1] > 0 else 0.0
            for transformation in self.transformations:
                for index, level in enumerate(transformation.levels):
                    moved = transformation(inputs, level, keys) if len(inputs) else inputs
                    outputs = self._outputs(moved)
                    metric.update(
                        outputs, transformation.name, index, source_outputs=source, target=target, mse_orig=mse_orig
                    )
                    if len(inputs):
                        violated = self.relation.violations(source, outputs, target, mse_orig)
                        rows = violated.nonzero().squeeze(1)
                        if len(rows):
                            found.append((transformation.name, index, rows, outputs[rows], moved[rows]))
        result = metric.compute()  # sums over every process
        counted = [
            (name, index, rows, outputs, moved)
            for name, index, rows, outputs, moved in found
            if self.task == "classification" or bool(result[name]["kept"][index, 0])
        ]
        record, logged = self._summarise(result, mse_orig)
        if self.bank is not None and stage == "validation" and counted:
            moved = torch.cat([part for *_, part in counted])
            labels = torch.cat([probe.target.to(device)[rows] for _, _, rows, _, _ in counted])
            self.bank.add(moved, labels, origin="metamorphic")
        self._gallery = self._gallery_of(counted, inputs, source, target)
        return record, logged

    def _summarise(
        self, result: Mapping[str, Mapping[str, Tensor]], mse_orig: float | None
    ) -> tuple[dict[str, Any], dict[str, float]]:
        per_transformation: dict[str, dict[str, Any]] = {}
        logged: dict[str, float] = {}
        for transformation in self.transformations:
            counts = result[transformation.name]
            violations = counts["violations"].reshape(len(transformation.levels), -1)[:, 0]
            inputs = counts["inputs"]
            per_transformation[transformation.name] = {
                "levels": list(transformation.levels),
                "violations": [int(v) for v in violations.tolist()],
                "inputs": [int(v) for v in inputs.tolist()],
                **({"mse": counts["mse"].tolist(), "kept": counts["kept"][:, 0].tolist()} if "mse" in counts else {}),
            }
            counted = inputs if "kept" not in counts else inputs * counts["kept"][:, 0]
            logged[f"metamorphic/{transformation.name}"] = float(violations.sum() / counted.sum().clamp(min=1))
        violations = sum(sum(v["violations"]) for v in per_transformation.values())
        inputs = sum(
            sum(n for n, kept in zip(v["inputs"], v.get("kept", [True] * len(v["inputs"])), strict=True) if kept)
            for v in per_transformation.values()
        )
        logged = {"metamorphic/violation_rate": violations / max(inputs, 1), **logged}
        record: dict[str, Any] = {"violations": violations, "inputs": inputs, "per_transformation": per_transformation}
        if mse_orig is not None:
            record["mse_orig"] = logged["metamorphic/mse_orig"] = mse_orig
        return record, logged

    # ---- figures -------------------------------------------------------------------------------

    def _gallery_of(
        self, found: list[tuple[str, int, Tensor, Tensor, Tensor]], inputs: Tensor, source: Tensor, target: Tensor
    ) -> tuple[Tensor, list[str]] | None:
        """The worst violations (largest error, or first found for classification): source beside transformed."""
        if not found or not self.gallery or inputs.ndim != 4 or inputs.shape[1] not in (1, 3):
            return None
        levels = {t.name: t.levels for t in self.transformations}
        names = [f"{name}={levels[name][index]:g}" for name, index, rows, _, _ in found for _ in range(len(rows))]
        rows = torch.cat([rows for _, _, rows, _, _ in found])
        outputs = torch.cat([outputs for _, _, _, outputs, _ in found])
        moved = torch.cat([part for *_, part in found])
        if self.task == "regression":
            order = (outputs - target[rows]).square().argsort(descending=True)[: self.gallery]
        else:
            order = torch.arange(min(self.gallery, len(rows)), device=rows.device)
        images, captions = [], []
        for i in order.tolist():
            row = int(rows[i])
            images += [inputs[row].cpu(), moved[i].cpu()]
            if self.task == "regression":
                captions += [f"pred {float(source[row]):.2f} true {float(target[row]):.2f}", f"{names[i]}: pred "
                             f"{float(outputs[i]):.2f}"]  # fmt: skip
            else:
                captions += [f"y={int(target[row])} pred {int(source[row].argmax())}",
                             f"{names[i]}: pred {int(outputs[i].argmax())}"]  # fmt: skip
        return torch.stack(images).float(), captions

    def _figures(self, record: dict[str, Any]) -> dict[str, Figure]:
        if self._gallery is None:
            return {}
        images, captions = self._gallery
        return {"metamorphic/gallery": plot_image_grid(images, captions, columns=4)}
