"""HDA at the end of validation: distribution-aware seeds, the two-step GA, R̂_g, and AEs fed back into training."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure
from torch import Tensor

from dlguard import _distributed
from dlguard._random import keyed_uniform
from dlguard._validation import positive_int, probability
from dlguard.callbacks.base import ProbeCallback
from dlguard.data.batch import BatchKeys
from dlguard.data.failure_bank import FailureBank
from dlguard.data.probe_set import ProbeSet, ProbeSetPolicy
from dlguard.generate.distribution import GlobalDistribution
from dlguard.generate.genetic import check_ga_options
from dlguard.generate.hda import HDARun, check_distribution, check_indicator, hda_test
from dlguard.metrics.functional.perceptual import perceptual_quality
from dlguard.metrics.global_robustness import EmpiricalGlobalRobustness
from dlguard.probes.evaluation import evaluation
from dlguard.report.figures import plot_image_grid

__all__ = ["HDACallback"]

_HOLDOUT_SALT = 0x4D5A  # the held-out draw's own stream of keyed randomness


class HDACallback(ProbeCallback):
    """Hierarchical distribution-aware testing (SPEC §4) at the end of validation, fed back as AEs.

    At each scheduled validation epoch the callback scores the probe set's candidates by their
    global density ``p_g`` (a fitted :class:`~dlguard.generate.GlobalDistribution`: VAE + KDE, or
    PCA) times a local robustness indicator (``S_grad`` or ``S_sep``), keeps the top ``k`` that the
    model classifies correctly, and searches each seed's ``radius``-ball with the two-step GA -- all
    populations in one batch on the model's device (:func:`~dlguard.generate.hda_test`). The model
    is left exactly as found; the GA's randomness is keyed by each seed's content, so N processes
    find what one process finds.

    A share ``holdout`` of the seeds (chosen by content) is held out at the first measurement: their
    test cases (the GA's best AE, or the seed where none was found) stay fixed, and every later
    measurement reports the current model's empirical global robustness ``R̂_g`` on them -- how far
    fine-tuning has closed those AEs. The AEs of the other seeds go, with their seeds' labels, into
    ``bank``: with :class:`~dlguard.callbacks.FailureReplay` on the same bank this is HDA's
    adversarial fine-tuning inside an ordinary ``fit``.

    See :class:`~dlguard.callbacks.ProbeCallback` for the schedule, the probe set (``candidates``
    inputs drawn by content among those the model classifies correctly at the first scheduled
    epoch), ``preprocess``/``output_transform`` and ``batch_keys``, shared by every dlguard callback.

    Logged metrics:
        ``hda/ae_proportion`` (share of the ``k·num_best`` test cases that are AEs),
        ``hda/prediction_loss`` (mean ``J`` of the AEs), ``hda/epsilon`` (mean ``L∞`` distance of the
        AEs to their seeds), ``hda/seed_density`` (mean ``p_g`` of the selected seeds as a share of
        the candidates' total: ``1 / candidates`` for seeds drawn at random), ``hda/ssim`` (mean SSIM
        of the AEs; images only), ``hda/global_robustness`` (``R̂_g`` on the held-out test cases;
        absent while none is held out, e.g. ``holdout=0``).
        Figure ``hda/gallery``: seeds and their best AEs with labels, predictions and ``J``.

    Args:
        distribution: a fitted global distribution over the model's inputs.
        k: seeds per measurement (over all processes).
        candidates: size of the probe set the seeds are selected from.
        radius: the ``L∞`` radius ``r`` of the norm balls, in ``(0, 1]`` (MNIST: 0.1).
        indicator: ``"grad"`` (``S_grad``) or ``"sep"`` (``S_sep``).
        population: GA population per seed ``N``.
        iterations: GA iterations ``T``.
        num_best: test cases kept per seed ``m``.
        perceptual: the GA's perceptual term: ``"mse"``, ``"psnr"`` or ``"ssim"``.
        alpha: weight of the perceptual term.
        mutation_std: standard deviation of the GA's Gaussian mutation (SPEC: 0.003; larger finds AEs
            in fewer iterations).
        init_std: standard deviation of the initial population's noise (SPEC: 0.01).
        holdout: share of the seeds whose test cases are held out for ``R̂_g`` (never replayed).
        bank: a :class:`~dlguard.data.FailureBank` receiving the other seeds' AEs, or ``None``.
        every_n_epochs: measure at the validation run of every this many training epochs.
        max_batch: rows per forward pass.
        preprocess: applied to (perturbed) inputs before the model, e.g. ``Normalize``.
        output_transform: maps the model's output to logits.
        batch_keys: ``(inputs key, target key)`` of the batches, or a callable ``batch -> (inputs, target)``.
        dataloader_idx: the validation loader the probe set is drawn from.
        seed: seed of the probe draw, the held-out draw and the GA.

    Example:
        >>> import lightning as L
        >>> import torch
        >>> from dlguard.callbacks import FailureReplay
        >>> from dlguard.generate.distribution import PCADistribution
        >>> distribution = PCADistribution(n_components=8).fit(torch.rand(64, 1, 28, 28))
        >>> replay = FailureReplay(fraction=0.25)
        >>> callback = HDACallback(distribution, k=10, population=200, iterations=20, bank=replay.bank)
        >>> trainer = L.Trainer(callbacks=[callback, replay], logger=False, enable_progress_bar=False)
    """

    prefix = "hda"

    def __init__(
        self,
        distribution: GlobalDistribution,
        k: int = 10,
        candidates: int = 500,
        radius: float = 0.1,
        indicator: str = "grad",
        population: int = 1000,
        iterations: int = 100,
        num_best: int = 1,
        perceptual: str = "mse",
        alpha: float = 1.0,
        mutation_std: float = 0.003,
        init_std: float = 0.01,
        holdout: float = 0.25,
        bank: FailureBank | None = None,
        every_n_epochs: int = 1,
        max_batch: int = 4096,
        preprocess: Callable[[Tensor], Tensor] | None = None,
        output_transform: Callable[[Any], Tensor] | None = None,
        batch_keys: BatchKeys = (0, 1),
        dataloader_idx: int = 0,
        seed: int = 0,
    ) -> None:
        check_distribution(distribution, fitted=False)  # fitted by the time the trainer sets the callback up
        positive_int("k", k)
        positive_int("candidates", candidates)
        positive_int("max_batch", max_batch)
        check_indicator(indicator)
        ga = {"population": population, "iterations": iterations, "num_best": num_best, "perceptual": perceptual,
              "alpha": alpha, "mutation_std": mutation_std, "init_std": init_std}  # fmt: skip
        check_ga_options(None, radius, **ga)
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
        self.distribution, self.k, self.candidates, self.radius = distribution, k, candidates, float(radius)
        self.indicator, self.ga = indicator, ga
        """The GA's arguments (``population``, ``iterations``, ``num_best``, ``perceptual``, ``alpha``...)."""
        self.holdout = probability("holdout", holdout)
        self.bank, self.max_batch = bank, max_batch
        self.heldout: dict[str, Tensor] | None = None
        """The held-out test cases of every process (``inputs``, ``labels``, ``log_density``, ``keys``), by key."""
        self.last_run: HDARun | None = None
        """This process's latest :class:`~dlguard.generate.HDARun` (seeds, test cases, densities), or ``None``."""
        self._gallery: tuple[Tensor, Tensor, list[str]] | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(k=self.k, radius=self.radius, indicator=self.indicator)

    def _probe_policy(self) -> ProbeSetPolicy:
        return ProbeSetPolicy(size=self.candidates, correct_only=True, seed=self.seed)

    def _check_model(self, pl_module: torch.nn.Module) -> None:
        check_distribution(self.distribution)
        self.distribution.to(self.adapter.device)

    def _check_batch(self, inputs: Tensor, target: Tensor) -> None:
        self.distribution.log_density(inputs[:1].to(self.adapter.device))  # wrong shapes fail here, named

    # ---- one measurement ---------------------------------------------------------------------

    def _measure(
        self, trainer: L.Trainer, pl_module: L.LightningModule, probe: ProbeSet | None, stage: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        assert probe is not None
        run = hda_test(
            self.adapter,
            probe.inputs,
            probe.target,
            self.distribution,
            k=self.k,
            radius=self.radius,
            indicator=self.indicator,  # type: ignore[arg-type]
            keys=probe.keys,
            seed=self.seed,
            max_batch=self.max_batch,
            **self.ga,
        )
        self.last_run = run
        held = keyed_uniform(run.keys, (1,), salt=_HOLDOUT_SALT).squeeze(1).to(run.keys.device) <= self.holdout
        if self.heldout is None and stage == "validation":
            self.heldout = self._hold_out(run, held)
        quality = self._quality(run)
        logged = {
            "hda/ae_proportion": quality["ae_proportion"],
            "hda/prediction_loss": quality["prediction_loss"],
            "hda/epsilon": quality["epsilon"],
            "hda/seed_density": float(run.selected_density_share.mean()),
        }
        if run.seeds.ndim == 4:
            logged["hda/ssim"] = quality["ssim"]
        if self.heldout is not None and len(self.heldout["labels"]):  # every process holds the whole held-out set
            logged["hda/global_robustness"] = self._global_robustness()
        if self.bank is not None and stage == "validation":
            found = run.ga.found & ~held.to(run.ga.found.device)[:, None]
            labels = run.labels[:, None].expand(run.ga.found.shape).to(found.device)
            self.bank.add(run.ga.examples[found], labels[found], origin="hda")
        self._gallery = self._gallery_of(run)
        record = {
            "seeds": int(run.selected_keys.numel()),
            "first_success": [int(v) for v in _distributed.gather_cat(run.ga.first_success.cpu()).tolist()],
            "final_ae_proportion": float(_distributed.gather_cat(run.ga.ae_proportion.cpu().double()).mean()),
        }
        return record, logged

    def _hold_out(self, run: HDARun, held: Tensor) -> dict[str, Tensor]:
        """Fix the held-out seeds' test cases: the best AE, or the seed itself where the GA found none."""
        held = held.to(run.seeds.device)
        found = run.ga.found[:, 0].to(run.seeds.device)
        cases = torch.where(found.view(-1, *[1] * (run.seeds.ndim - 1)), run.ga.best.to(run.seeds.device), run.seeds)
        mine = {
            "inputs": cases[held].flatten(1),
            "labels": run.labels[held].to(run.seeds.device),
            "log_density": run.log_density.to(run.seeds.device)[held],
            "keys": run.keys[held].to(run.seeds.device),
        }
        every = {name: _distributed.gather_cat(value) for name, value in mine.items()}
        order = every["keys"].argsort()
        every = {name: value[order].cpu() for name, value in every.items()}
        every["inputs"] = every["inputs"].reshape(-1, *run.seeds.shape[1:])
        return every

    def _global_robustness(self) -> float:
        """``R̂_g`` of the current model on the held-out test cases; each process scores every world-th one."""
        assert self.heldout is not None
        share = slice(_distributed.rank(), None, _distributed.world_size())
        inputs, labels = self.heldout["inputs"][share], self.heldout["labels"][share]
        metric = EmpiricalGlobalRobustness().to(self.adapter.device)
        with evaluation(self.adapter.model), torch.no_grad():
            logits = self.adapter.logits(inputs, max_batch=self.max_batch) if len(inputs) else None
        if logits is not None:
            metric.update(logits, labels.to(logits.device), self.heldout["log_density"][share].to(logits.device))
        return float(metric.compute())

    def _quality(self, run: HDARun) -> dict[str, float]:
        """AE proportion, ``J``, ``ε`` and SSIM of the ``k·m`` test cases, over all processes.

        The GA's own verdicts (``found``, ``J``) are used, not a second forward pass: an AE with ``J``
        near 0 may flip in a batch of another size, and the bank must hold what the numbers count.
        """
        found = run.ga.found.cpu()
        tests = run.ga.examples.cpu()[found]
        seeds = run.seeds.cpu()[:, None].expand_as(run.ga.examples.cpu())[found]
        images = run.seeds.ndim == 4 and min(run.seeds.shape[-2:]) >= 11
        ssim = perceptual_quality(tests, seeds, "ssim").sum() if images and len(tests) else torch.tensor(0.0)
        sums = torch.stack(
            [
                torch.tensor(float(found.numel())),
                found.sum().double(),
                run.ga.loss.cpu()[found].double().sum(),
                (tests - seeds).flatten(1).abs().amax(1).double().sum() if len(tests) else torch.tensor(0.0),
                ssim.double(),
            ]
        ).double()
        total, aes, loss, epsilon, ssim_sum = _distributed.all_sum(sums).tolist()
        nan = float("nan")
        return {
            "ae_proportion": aes / total if total else nan,
            "prediction_loss": loss / aes if aes else nan,
            "epsilon": epsilon / aes if aes else nan,
            "ssim": ssim_sum / aes if aes and images else nan,
        }

    # ---- figures and checkpoint ----------------------------------------------------------------

    def _gallery_of(self, run: HDARun, count: int = 8) -> tuple[Tensor, Tensor, list[str]] | None:
        found = run.ga.found[:, 0].cpu()
        rows = found.nonzero().squeeze(1)[:count]
        if run.seeds.ndim != 4 or not len(rows):
            return None
        with evaluation(self.adapter.model), torch.no_grad():
            predicted = self.adapter.logits(run.ga.best[rows]).argmax(1).cpu()
        loss = run.ga.loss[:, 0].cpu()
        captions = [
            f"{int(run.labels[r])} → {int(p)}, J={float(loss[r]):.2f}" for r, p in zip(rows, predicted, strict=True)
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
        return {"heldout": self.heldout}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.heldout = state.get("heldout")
