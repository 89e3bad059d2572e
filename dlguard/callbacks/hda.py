"""HDA at the end of validation: distribution-aware seeds, the two-step GA, R̂_g, and AEs fed back into training."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from matplotlib.figure import Figure
from torch import Tensor

from dlguard import _distributed
from dlguard._random import content_keys
from dlguard._validation import check_values, optional_positive_int, positive_int, probability
from dlguard.callbacks.base import FEWEST_PROBE_INPUTS, ProbeCallback, ProbeOptions
from dlguard.data.failure_bank import FailureBank
from dlguard.data.probe_set import ProbeSet, ProbeSetPolicy
from dlguard.generate.distribution import GlobalDistribution, PCADistribution
from dlguard.generate.genetic import check_ga_options
from dlguard.generate.hda import HDARun, HeldOut, check_distribution, check_indicator, hda_test
from dlguard.generate.seeds import NoCorrectCandidateError
from dlguard.metrics.ae_quality import AEQuality
from dlguard.metrics.functional.hda import prediction_loss
from dlguard.metrics.global_robustness import EmpiricalGlobalRobustness
from dlguard.utilities.plot import plot_image_grid

__all__ = ["INIT_STD_PER_RADIUS", "MUTATION_STD_PER_RADIUS", "HDACallback"]

MUTATION_STD_PER_RADIUS = 0.1
"""The GA's default mutation standard deviation, as a share of the radius."""
INIT_STD_PER_RADIUS = 0.5
"""The GA's default initial-noise standard deviation, as a share of the radius."""
_ELITE = 20
"""The GA's elite (:func:`~dlguard.generate.two_step_ga`'s default), kept below smaller populations (:func:`_elite`)."""


def _elite(population: int) -> int:
    """The elite a population of ``population`` runs with: 20, or all but one individual of a smaller one."""
    return min(_ELITE, population - 1)


_SIZING_PASSES = 3
"""One-input passes that size a measurement's passes (the candidates' logits and indicator, the held-out scoring)."""


class HDACallback(ProbeCallback):
    """Hierarchical distribution-aware testing (SPEC §4) at the end of validation, fed back as AEs.

    At each scheduled validation epoch the callback scores the probe set's candidates by their
    global density ``p_g`` (a fitted :class:`~dlguard.generate.GlobalDistribution`: VAE + KDE, or
    PCA) times a local robustness indicator (``S_grad`` or ``S_sep``), keeps the top ``k`` that the
    model classifies correctly, and searches each seed's ``radius``-ball with the two-step GA -- all
    populations in one batch on the model's device (:func:`~dlguard.generate.hda_test`). The model
    is left exactly as found; the GA's randomness is keyed by each seed's content, so N processes
    find what one process finds. The test cases are rated by :class:`~dlguard.metrics.AEQuality`
    from the GA's own verdicts (no second forward pass).

    A share ``holdout`` of the seeds (chosen by content) is held out at the first measurement: their
    test cases (the GA's best AE, or the seed where none was found) stay fixed, and every later
    measurement reports the current model's empirical global robustness ``R̂_g`` on them
    (:class:`~dlguard.metrics.EmpiricalGlobalRobustness`) -- how far fine-tuning has closed those
    AEs. The AEs of the other seeds go, with their seeds' labels, into ``bank``: with
    :class:`~dlguard.callbacks.FailureReplay` on the same bank this is HDA's adversarial fine-tuning
    inside an ordinary ``fit``.

    See :class:`~dlguard.callbacks.ProbeCallback` for the schedule, the probe set (``probe_size``
    inputs drawn by content among those the model classifies correctly at the first scheduled
    epoch) and the arguments every dlguard callback takes.

    Logged metrics:
        ``hda/ae_proportion`` (share of the ``seeds·num_best`` test cases that are AEs),
        ``hda/prediction_loss`` (mean ``J`` of the AEs), ``hda/epsilon`` (mean ``L∞`` distance of the
        AEs to their seeds) -- these two and ``hda/ssim`` only when the measurement found an AE (a
        warning says when it found none) --, ``hda/seed_density`` (mean ``p_g`` of the selected seeds as a share of
        the candidates' total: ``1 / probe_size`` for seeds drawn at random), ``hda/ssim`` (mean SSIM
        of the AEs; images only), ``hda/global_robustness`` (``R̂_g`` on the held-out test cases;
        at the measurement that holds them out, the density-weighted share of held-out seeds without an AE,
        with a warning when that is 0.0 or 1.0; absent while none is held out, e.g. ``holdout=0``, and under
        ``trainer.test``: the held-out cases come from validation inputs, not the test loader).
        Figure ``hda/gallery``: seeds and their best AEs with labels, predictions and ``J``.

    Args:
        distribution: a fitted global distribution over the model's inputs (pixel space, as the probe
            set). ``None`` (default): a :class:`~dlguard.generate.PCADistribution` (32 components, KDE on
            the scores) fitted once, before the first measurement, on the first ``fit_inputs`` inputs of
            the training data (a loader of its own: training's order is untouched), the same on every
            process; a :class:`~dlguard.generate.VAEDistribution` is HDA's own choice when a VAE is at hand.
        fit_inputs: training inputs the default distribution is fitted on.
        k: seeds per measurement (over all processes), at most: the budget may run fewer (the record's
            ``"seeds"``, ``"population"`` and ``"iterations"`` say what ran).
        probe_size: candidates in the probe set the seeds are selected from (over all processes).
        radius: the ``L∞`` radius ``r`` of the norm balls, in ``(0, 1]`` (MNIST: 0.1).
        indicator: ``"grad"`` (``S_grad``) or ``"sep"`` (``S_sep``).
        population: GA population per seed ``N`` (the paper: 1000; at least 2, whose best ``min(20, N − 1)``
            are the elite), at most: a budget that cannot pay
            ``k`` initial populations runs smaller ones (down to 2, or ``num_best``, then fewer seeds).
        iterations: GA iterations ``T`` (the paper: 100), at most: a budget that cannot pay ``k``
            seeds at ``T`` runs every seed with the iterations it pays for, down to none (the initial
            population only). The defaults, 10 seeds of 100 x 30, are a thirtieth of the paper's
            forward passes per seed, to leave the callback attached during training; they cost
            ``10 · 100 · 31`` = 31,000 passes, three quarters of a budget of about 41,400; below
            that fewer iterations run (:meth:`_plan`), and none below about 1,400 (the default
            ``budget=0.15`` of a loader under about 9,000 inputs).
        num_best: test cases kept per seed ``m``.
        perceptual: the GA's perceptual term: ``"mse"``, ``"psnr"`` or ``"ssim"``.
        alpha: weight of the perceptual term.
        mutation_std: standard deviation of the GA's Gaussian mutation; ``None``: ``radius / 10``.
        init_std: standard deviation of the initial population's noise; ``None``: ``radius / 2``.
            A departure from SPEC §4 (0.003 and 0.01 for ``r = 0.1``): with the SPEC's values and a
            budget that fits in training, the GA finds no AE -- 0 of 20 ``mnist_a`` seeds at ``r = 0.1``
            with 100 x 20 or 200 x 50, against 4 and 7 of 20 with noise scaled to the radius (the
            test ``test_noise_scaled_to_the_radius_finds_what_the_spec_s_noise_does_not``). Pass 0.003
            and 0.01 for the paper's GA.
        gradient_start: start each seed's GA from its fast-gradient-sign point too (one backward pass
            per seed; :func:`~dlguard.generate.hda_test`). A departure from SPEC §4's black-box GA, on by
            default: at the default budget the GA runs few or no iterations, and random noise alone
            rarely finds an AE there (``benchmarks/hda_budget.py``). ``False``: the paper's GA, black-box
            (with ``indicator="sep"``, the whole test then needs no gradient).
        holdout: share of the seeds whose test cases are held out for ``R̂_g`` (never replayed).
        bank: a :class:`~dlguard.data.FailureBank` receiving the other seeds' AEs, or ``None``.
        gallery: seeds shown, each beside its best AE, in the gallery.
        max_batch: rows per forward pass of the seed selection and ``R̂_g`` (``None``: a memory budget,
            :func:`~dlguard.probes.default_max_batch`; the GA sizes its own passes).
        **options: ``every_n_epochs``, ``preprocess``, ``output_transform``, ``batch_keys``, ``dataloader_idx``,
            ``seed`` (here also the seed of the held-out draw and the GA), ``start_epoch``, ``min_accuracy``,
            ``redraw_every_n_epochs``, ``budget`` (at most three quarters to the GA, seeds before
            iterations, :meth:`_plan`; the rest to the candidates): see :class:`~dlguard.callbacks.ProbeCallback`.

    Example:
        >>> import lightning as L
        >>> import torch
        >>> from dlguard.callbacks import FailureReplay
        >>> from dlguard.generate.distribution import PCADistribution
        >>> distribution = PCADistribution(n_components=8).fit(torch.rand(64, 1, 28, 28))
        >>> replay = FailureReplay(fraction=0.25)
        >>> callback = HDACallback(distribution=distribution, k=10, population=200, iterations=20, bank=replay.bank)
        >>> trainer = L.Trainer(callbacks=[callback, replay], logger=False, enable_progress_bar=False)
    """

    prefix = "hda"

    def __init__(
        self,
        *,
        distribution: GlobalDistribution | None = None,
        fit_inputs: int = 2000,
        k: int = 10,
        probe_size: int = 500,
        radius: float = 0.1,
        indicator: str = "grad",
        population: int = 100,
        iterations: int = 30,
        num_best: int = 1,
        perceptual: str = "mse",
        alpha: float = 1.0,
        mutation_std: float | None = None,
        init_std: float | None = None,
        gradient_start: bool = True,
        holdout: float = 0.25,
        bank: FailureBank | None = None,
        gallery: int = 8,
        max_batch: int | None = None,
        **options: Unpack[ProbeOptions],
    ) -> None:
        if distribution is not None:
            check_distribution(distribution, fitted=False)  # fitted by the time the trainer sets the callback up
        positive_int("fit_inputs", fit_inputs, minimum=2)
        positive_int("k", k)
        positive_int("population", population, minimum=2)  # an elite and one child at least
        positive_int("probe_size", probe_size)
        positive_int("gallery", gallery, minimum=0)
        optional_positive_int("max_batch", max_batch)
        indicator = check_indicator(indicator)
        mutation_std = radius * MUTATION_STD_PER_RADIUS if mutation_std is None else mutation_std
        init_std = radius * INIT_STD_PER_RADIUS if init_std is None else init_std
        ga = {"population": population, "iterations": iterations, "num_best": num_best, "perceptual": perceptual,
              "alpha": alpha, "mutation_std": mutation_std, "init_std": init_std}  # fmt: skip
        check_ga_options(None, radius, **ga, elite=_elite(population))
        self._check_bank(bank)
        super().__init__(**options)
        self.distribution, self.k, self.probe_size, self.radius = distribution, k, probe_size, float(radius)
        self.fit_inputs = fit_inputs
        self._fitted_here = False  # the default distribution, fitted by this callback (kept in its checkpoint)
        self.indicator, self.ga = indicator, ga
        """The GA's arguments (``population``, ``iterations``, ``num_best``, ``perceptual``, ``alpha``...)."""
        if not isinstance(gradient_start, bool):
            raise ValueError(f"gradient_start: expected True or False, got {gradient_start!r}")
        self.gradient_start = gradient_start
        self.holdout = probability("holdout", holdout)
        self.bank, self.gallery, self.max_batch = bank, gallery, max_batch
        self.heldout: HeldOut | None = None
        """The held-out test cases of every process (``inputs``, ``labels``, ``log_density``, ``keys``), by key."""
        self.last_run: HDARun | None = None
        """This process's latest :class:`~dlguard.generate.HDARun` (seeds, test cases, densities), or ``None``."""
        self._gallery: tuple[Tensor, Tensor, list[str]] | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(k=self.k, radius=self.radius, indicator=self.indicator)

    def _probe_policy(self) -> ProbeSetPolicy:
        return ProbeSetPolicy(probe_size=self.probe_size, correct_only=True, seed=self.seed)

    def _plan(self, allowed: int | None) -> tuple[int, int, int]:
        """``(seeds, population, iterations)`` the budget pays for: at most three quarters of it go to the GA.

        The rest pays for the candidates (never fewer than 16) and three one-input passes that size
        the passes. Seeds come before iterations (each seed is one more chance of an AE, and one more
        for the bank): a seed costs ``population · (iterations + 1)`` forward passes and 2 or 3 more
        (its logits, its held-out scoring, its gradient start). When ``k`` seeds at the full
        ``iterations`` do not fit, all ``k`` run the iterations that fit, down to none (their initial
        population only); when even that does not fit, the population shrinks (to no fewer than 2
        individuals, nor ``num_best``: without an iteration the elite breeds nothing, and each seed's
        gradient-sign point is a better chance of an AE than more random individuals around fewer seeds)
        and as many seeds as fit run their initial population -- with ``gradient_start``, a
        fast-gradient-sign point among random ones, the best kept.
        """
        population, iterations = self.ga["population"], self.ga["iterations"]
        if allowed is None:
            return self.k, population, iterations
        extra = 2 + self.gradient_start
        share = min(allowed * 3 // 4, allowed - FEWEST_PROBE_INPUTS * self._per_candidate - _SIZING_PASSES)
        if share >= self.k * (population * (iterations + 1) + extra):
            return self.k, population, iterations
        if share >= self.k * (population + extra):
            return self.k, population, min(iterations, (share // self.k - extra) // population - 1)
        smallest = min(population, max(2, self.ga["num_best"]))  # no iteration: the elite breeds nothing
        population = max(smallest, share // self.k - extra)
        return max(1, min(self.k, share // (population + extra))), population, 0

    @property
    def _per_candidate(self) -> int:
        return 3 if self.indicator == "sep" else 2  # its logits, and its gradient or its separation

    def _search_passes(self, allowed: int | None) -> int:
        """Forward passes of the planned seeds' search and the passes' sizing, beside the candidates'."""
        seeds, population, iterations = self._plan(allowed)
        return seeds * (population * (iterations + 1) + 2 + self.gradient_start) + _SIZING_PASSES

    def _probe_limit(self, seen: int) -> int | None:
        allowed = self._allowed_passes(seen)
        if allowed is None:
            return None
        return max((allowed - self._search_passes(allowed)) // self._per_candidate, FEWEST_PROBE_INPUTS)

    def _measurement_cost(self, probe: ProbeSet, allowed: int) -> int:
        return self._search_passes(allowed) + probe.size * self._per_candidate

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.distribution is None and stage != "fit" and not self._has_training_data(trainer):
            raise ValueError(
                f"distribution: none given and {getattr(stage, 'value', stage)} has no training data to fit one on; "
                "pass distribution=PCADistribution().fit(training inputs) (or a VAEDistribution) or a datamodule "
                "with training data"
            )

    def _check_model(self, pl_module: torch.nn.Module) -> None:
        if self.distribution is not None:
            check_distribution(self.distribution)
            self.distribution.to(self.adapter.device)

    def _check_batch(self, inputs: Tensor, target: Tensor) -> None:
        if self.distribution is not None:
            self.distribution.log_density(inputs[:1].to(self.adapter.device))  # wrong shapes fail here, named

    def _fit_distribution(self, trainer: L.Trainer) -> GlobalDistribution:
        """The default distribution: a PCA of the first ``fit_inputs`` training inputs, alike on every rank."""
        parts, held = [], 0
        with torch.random.fork_rng(devices=[]):  # random training transforms: the same draws on every rank, every run
            torch.manual_seed(self.seed)
            for batch in self._training_loader(trainer, shard=False, argument="distribution"):
                inputs = self.accessor.inputs(batch)
                parts.append(inputs[: self.fit_inputs - held].detach().cpu())
                held += len(parts[-1])
                if held >= self.fit_inputs:
                    break
        if held < 2:
            raise ValueError(f"distribution: none given and the training data gave {held} input(s) to fit one on")
        inputs = torch.cat(parts).float()
        hint = "the default distribution is fitted on training inputs in [0, 1]; pass distribution= for other inputs"
        check_values("inputs (training data for the default distribution)", inputs, (0.0, 1.0), hint)
        components = min(32, len(inputs), inputs[0].numel())
        return PCADistribution(n_components=components).fit(inputs).to(self.adapter.device)

    # ---- one measurement ---------------------------------------------------------------------

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        assert probe is not None
        if self.distribution is None:  # fitted once, on the training data (pixel space, as the probe set)
            self.distribution = self._fit_distribution(trainer)
            self._fitted_here = True
        self.distribution.to(self.adapter.device)
        seeds, population, iterations = self._plan(self._allowed.get(stage))
        try:
            run = hda_test(
                self.adapter,
                probe.inputs,
                probe.target,
                self.distribution,
                k=seeds,
                radius=self.radius,
                indicator=self.indicator,  # type: ignore[arg-type]
                keys=probe.keys if probe.seed == self.seed else content_keys(probe.inputs, self.seed),  # redrawn
                seed=self.seed,
                max_batch=self.max_batch,
                holdout=self.holdout,
                heldout=self.heldout,
                gradient_start=self.gradient_start,
                validate_args=False,  # the probe draw checked the values
                **{**self.ga, "population": population, "iterations": iterations, "elite": _elite(population)},
            )
        except NoCorrectCandidateError as error:  # every process reaches it: the correct mask is gathered first
            # the set was drawn from predictions made in another pass (the validation step's, or an earlier
            # model's); a near-tie can flip: no seed to search around is a measurement without numbers, not a crash
            rank_zero_warn(
                f"HDACallback: epoch {trainer.current_epoch}: {error}; of the {probe.size} probe inputs the model "
                "classifies none correctly now, so there is no seed and nothing is logged"
            )
            return {"seeds": 0, "population": population, "iterations": iterations}, {}
        self.last_run = run
        drawn_now = self.heldout is None and stage == "validation"
        if drawn_now:
            self.heldout = run.heldout
        device = run.ga.logits.device
        quality = AEQuality(perceptual=("ssim",), validate_args=False).to(device)  # the GA's own outputs
        if len(run.seeds):
            quality.update(*run.test_cases)
        result = quality.compute()  # sums over every process
        logged = {
            "hda/ae_proportion": float(result.ae_proportion),
            "hda/seed_density": float(run.selected_density_share.mean()),
        }
        if float(result.ae_proportion) > 0:  # J, ε and SSIM are means over the AEs: none without one
            logged["hda/prediction_loss"] = float(result.prediction_loss)
            logged["hda/epsilon"] = float(result.epsilon)
            if run.seeds.ndim == 4:
                logged["hda/ssim"] = float(result.ssim)
        else:
            rank_zero_warn(
                f"HDACallback: epoch {trainer.current_epoch} found no adversarial example among "
                f"{int(result.count)} test cases ({int(run.selected_keys.numel())} seeds, radius={self.radius}, "
                f"population={population}, iterations={iterations}), so hda/prediction_loss, "
                "hda/epsilon and hda/ssim are not logged and nothing is fed back; raise budget (it caps "
                "iterations and population), iterations, population, mutation_std or radius"
            )
        # validation only: the held-out cases come from validation inputs, not a test loader's
        if stage == "validation" and self.heldout is not None and len(self.heldout["labels"]):
            robustness = EmpiricalGlobalRobustness(validate_args=False).to(device)
            logits, labels, log_density = run.heldout_share
            if len(labels):
                robustness.update(logits, labels, log_density)
            logged["hda/global_robustness"] = float(robustness.compute())  # every process holds the whole set
            if drawn_now:
                self._say_what_the_first_global_robustness_reads(trainer, run)
        if self.bank is not None and stage == "validation":
            self.bank.add(*run.failures, origin="hda")
        self._gallery = self._gallery_of(run)
        record = {
            "seeds": int(run.selected_keys.numel()),
            "population": population,
            "iterations": iterations,
            "first_success": [int(v) for v in _distributed.gather_cat(run.ga.first_success.cpu()).tolist()],
            "final_ae_proportion": float(_distributed.gather_cat(run.ga.ae_proportion.cpu().double()).mean()),
        }
        return record, logged

    def _say_what_the_first_global_robustness_reads(self, trainer: L.Trainer, run: HDARun) -> None:
        """The measurement that holds the test cases out reads how many of them the GA broke: say so at 1.0 and 0.0.

        At 1.0 no held-out seed has an AE, so every later R̂_g is the model's accuracy on the seeds themselves; at
        0.0 every one has, found against this very model: the starting point by construction, not a finding.
        """
        held = len(self.heldout["labels"]) if self.heldout is not None else 0
        found_here = run.ga.found[:, 0][run.held.to(run.ga.found.device)].sum().reshape(1).cpu()
        found = int(_distributed.all_sum(found_here).item())
        if held and not found:
            rank_zero_warn(
                f"HDACallback: the GA found no AE around any of the {held} held-out seeds at epoch "
                f"{trainer.current_epoch}, so hda/global_robustness is measured on the seeds themselves: it reads "
                "the model's accuracy on them (1.0 at first), not how far training closes AEs; raise iterations, "
                "population or radius for held-out AEs"
            )
        elif held and found == held:
            rank_zero_warn(
                f"HDACallback: hda/global_robustness reads 0.0 at epoch {trainer.current_epoch} by construction: "
                f"this measurement held out the test cases of {held} seeds, and the GA found an AE around every one "
                "against this very model; later measurements read how far training closes these AEs"
            )

    # ---- figures and checkpoint ----------------------------------------------------------------

    def _gallery_of(self, run: HDARun) -> tuple[Tensor, Tensor, list[str]] | None:
        """Seeds whose GA found an AE, beside their best AE; the prediction is the GA's own (its logits)."""
        found = run.ga.found[:, 0].cpu()
        rows = found.nonzero().squeeze(1)[: self.gallery]
        if run.seeds.ndim != 4 or not len(rows):
            return None
        logits = run.ga.logits[:, 0].cpu()[rows]
        labels = run.target.cpu()[rows]
        loss = prediction_loss(logits, labels)
        captions = [
            f"{int(y)} → {int(p)}, J={float(j):.2f}" for y, p, j in zip(labels, logits.argmax(1), loss, strict=True)
        ]
        return run.seeds[rows].cpu(), run.ga.best[rows].cpu(), captions

    def _figures(self, record: dict[str, Any]) -> dict[str, Figure]:
        if self._gallery is None:
            return {}
        seeds, examples, captions = self._gallery
        images = torch.stack([seeds, examples], dim=1).flatten(0, 1)
        labels = [text for caption in captions for text in (f"seed {caption.split(' ')[0]}", caption)]
        return {"hda/gallery": plot_image_grid(images, labels, columns=min(8, len(images)))}

    def _extra_state(self) -> dict[str, Any]:
        fitted = self._fitted_here and self.distribution is not None
        return {"heldout": self.heldout, "distribution": self.distribution.state_dict() if fitted else None}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.heldout = state.get("heldout")
        if state.get("distribution") is not None and (self.distribution is None or self._fitted_here):
            self.distribution = PCADistribution()  # the one fitted before the checkpoint, not a refit
            self.distribution.load_state_dict(state["distribution"])
            self._fitted_here = True
