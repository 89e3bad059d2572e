"""Each callback's logged numbers recomputed from its generator on the callback's own probe set.

A callback schedules, draws its probe set, calls one generator, updates its metric from the run and
logs: so the numbers it logs must be what the generator gives on that probe set, fed to the same
metric, through another path to the model (a pixel-space twin of a model that normalises itself, an
adapter, or the model itself). These helpers do that, for the tests of every callback.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dlguard.augment import FollowUps
from dlguard.callbacks import (
    DScoreCallback,
    HDACallback,
    MetamorphicCallback,
    ObjectRelevancyCallback,
    RobustnessCallback,
)
from dlguard.generate import (
    dscore_test,
    hda_test,
    metamorphic_test,
    object_relevancy_test,
    robustness_sweep,
)
from dlguard.metrics import (
    AdderGlobalRobustness,
    AEQuality,
    DScore,
    EmpiricalGlobalRobustness,
    LocalRobustness,
    MetamorphicViolations,
    ObjectRelevancy,
)
from dlguard.probes import ModelAdapter, count_forward_passes


class _Spent:
    """Counts the forward passes of the recomputation on the reference model (``with _Spent(model) as spent``)."""

    def __init__(self, model: nn.Module | ModelAdapter) -> None:
        self._counting = count_forward_passes(model.model if isinstance(model, ModelAdapter) else model)

    def __enter__(self) -> _Spent:
        self.count = self._counting.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._counting.__exit__(*exc)

    def logged(self, callback: Any, stage: str) -> dict[str, float]:
        """``<prefix>/forward_passes``: the recomputation's passes and the passes the callback's draw made."""
        record = next(r for r in reversed(callback.history) if r["stage"] == stage)
        return {f"{callback.prefix}/forward_passes": float(self.count.inputs + record["budget"]["draw_passes"])}


def dscore_logged(callback: DScoreCallback, model: nn.Module | ModelAdapter, stage: str = "validation") -> dict:
    probe = callback.probe_set(stage)
    with _Spent(model) as spent:
        run = dscore_test(model, probe.inputs, probe.target, callback.n, callback.t, callback.layers)
    metric = DScore(callback.n, run.num_classes)
    metric.update(run.logits, run.mutant_logits, run.translated_logits, run.target)
    result = metric.compute()
    logged = {f"dscore/{key}": float(getattr(result, key)) for key in ("d_score", "v_robust", "v_fitness")}
    logged["dscore/baseline_acc"] = float(result.baseline_accuracy)
    if callback.guide is not None and stage == "validation":
        logged["dscore/guide_p"] = float(result.augment_probability)
    return logged | spent.logged(callback, stage)


def robustness_logged(
    callback: RobustnessCallback, model: nn.Module | ModelAdapter, stage: str = "validation"
) -> dict[str, float]:
    probe = callback.probe_set(stage)
    with _Spent(model) as spent:
        run = robustness_sweep(
            model, probe.inputs, probe.target, callback.properties, pairs=callback.pairs, combine=callback.combine,
            keys=probe.keys, seed=callback.seed,
        )  # fmt: skip
    levels = max(len(p.levels) for p in callback.properties)
    local = LocalRobustness(run.num_classes, callback.properties, levels)
    for prop in callback.properties:
        local.update(run.logits[prop.name], run.target, prop.name)
    logged: dict[str, float] = {}
    for name, result in local.compute().items():
        curve = result.per_level.reshape(-1)
        logged[f"robustness/{name}"] = float(curve.mean())
        levels_of = next(p.levels for p in callback.properties if p.name == name)
        logged |= {f"robustness/{name}@{level:g}": float(v) for level, v in zip(levels_of, curve, strict=True)}
    if run.adder_share is not None:
        adder = AdderGlobalRobustness(run.num_classes, callback.properties, levels, callback.combine)
        adder.update(*run.adder_share)
        for name, (per_level, _) in adder.compute().items():
            logged[f"global_robustness/{name}"] = float(per_level.reshape(-1).mean())
    if callback.guide is not None and stage == "validation":  # the proposal the measurement set, at its strength
        logged["robustness/guide_p"] = callback.guide.strength * float(torch.as_tensor(callback.proposal).mean())
    return logged | spent.logged(callback, stage)


def metamorphic_logged(
    callback: MetamorphicCallback, model: nn.Module | ModelAdapter, stage: str = "validation"
) -> dict[str, float]:
    probe = callback.probe_set(stage)
    with _Spent(model) as spent:
        run = metamorphic_test(
            model, probe.inputs, probe.target, callback.properties, task=callback.task, lam=callback.lam,
            epsilon=callback.epsilon, keys=probe.keys,
        )  # fmt: skip
    metric = MetamorphicViolations(callback.properties, callback.task, (callback.lam,), (callback.epsilon,))
    for name, outputs in run.transformed_outputs.items():
        metric.update(outputs, name, source_outputs=run.outputs, target=run.target, mse_orig=run.mse_orig)
    result = metric.compute()
    logged = {"metamorphic/violation_rate": float(result["total"]["violations"].sum())}
    counted = 0
    for prop in callback.properties:
        entry = result[prop.name]
        kept = entry["kept"][:, 0] if "kept" in entry else torch.ones(len(prop.levels), dtype=torch.bool)
        violations, inputs = entry["violations"].reshape(len(prop.levels), -1)[:, 0], entry["inputs"]
        counted += int((inputs * kept).sum())
        logged[f"metamorphic/{prop.name}"] = float(violations.sum() / (inputs * kept).sum().clamp(min=1))
    logged["metamorphic/violation_rate"] /= max(counted, 1)
    if run.mse_orig is not None:
        logged["metamorphic/mse_orig"] = run.mse_orig
    if callback.guide is not None and stage == "validation":  # the proposal the measurement set, at its strength
        logged["metamorphic/guide_p"] = callback.guide.strength * float(torch.as_tensor(callback.proposal).mean())
    return logged | spent.logged(callback, stage)


def hda_logged(callback: HDACallback, model: nn.Module | ModelAdapter, stage: str = "validation") -> dict[str, float]:
    probe = callback.probe_set(stage)
    record = next(r for r in reversed(callback.history) if r["stage"] == stage)
    plan = (record["seeds"], record["population"], record["iterations"])
    assert plan == callback._plan(record["budget"]["allowed"])
    with _Spent(model) as spent:
        run = hda_test(
            model, probe.inputs, probe.target, callback.distribution, k=record["seeds"], radius=callback.radius,
            indicator=callback.indicator, keys=probe.keys, seed=callback.seed, holdout=callback.holdout,
            heldout=callback.heldout, gradient_start=callback.gradient_start,
            **{**callback.ga, "population": record["population"], "iterations": record["iterations"]},
        )  # fmt: skip
    quality = AEQuality(perceptual=("ssim",))
    quality.update(*run.test_cases)
    result = quality.compute()
    logged = {
        "hda/ae_proportion": float(result.ae_proportion),
        "hda/seed_density": float(run.selected_density_share.mean()),
    }
    if int(run.ga.found.sum()):  # means over the AEs exist only when there is one
        logged["hda/prediction_loss"] = float(result.prediction_loss)
        logged["hda/epsilon"] = float(result.epsilon)
        if run.seeds.ndim == 4:
            logged["hda/ssim"] = float(result.ssim)
    if stage == "validation" and callback.heldout is not None and len(callback.heldout["labels"]):
        robustness = EmpiricalGlobalRobustness()
        robustness.update(*run.heldout_share)  # the callback's held-out cases: it passed them in
        logged["hda/global_robustness"] = float(robustness.compute())
    return logged | spent.logged(callback, stage)


def relevancy_logged(
    callback: ObjectRelevancyCallback,
    model: nn.Module | ModelAdapter,
    stage: str = "validation",
    follow_ups: FollowUps | None = None,
) -> dict[str, Any]:
    """``follow_ups`` run no model: default the ones the callback made (cached) for its latest measurement."""
    probe = callback.probe_set(stage)
    if follow_ups is None:
        assert callback.last_run is not None
        follow_ups = callback.last_run.follow_ups
    with _Spent(model) as spent:
        run = object_relevancy_test(
            model,
            probe.inputs.cpu().float(),
            probe.target.cpu(),
            follow_ups,
            p_high=callback.p_high,
            s_low=callback.s_low,
        )
    metric = ObjectRelevancy(p_high=callback.p_high, s_low=callback.s_low)
    metric.update(run.scores)
    result = metric.compute()
    logged = {f"relevancy/{key}": float(result[key]) for key in ("score", "preserving", "removing", "unreliable_rate")}
    return logged | spent.logged(callback, stage)
