"""Does feeding failures back pay? Each dlguard loop against the augmentations a user would use instead.

    python benchmarks/closed_loop.py [--setting mnist|scenes|spurious] [--seeds 0 1 2] [--epochs 6]
                                     [--arms NAME ...] [--combine LOOP ...] [--out results.json]
                                     [--accelerator cpu|gpu]
                                     [--hda|--robustness|--metamorphic|--dscore|--relevancy KEY=VALUE ...]
                                     [--replay|--bank|--guide|--padding|--oracle KEY=VALUE ...]
                                     [--violation_guide [KEY=VALUE ...]] [--spread cell|property|even]
                                     [--properties framework|label_preserving|deeptest_roads|capture|exposure ...]
                                     [--control_draws loop|global] [--on augmix|trivialaugment|randaugment|noise]
                                     [--dose_from FILE] [--control_padding rms|schedule] [--judge all|goal]
    python benchmarks/closed_loop.py --results results.json   # the tables of a file written by --out
    python benchmarks/closed_loop.py --results part1.json part2.json --out merged.json  # one file of several
    bash benchmarks/closed_loop_gpu.sh merged.json --setting scenes   # one process per loop and seed

``--<callback> KEY=VALUE`` overrides that callback's defaults (e.g. ``--metamorphic budget=None``);
``--replay`` and ``--bank`` those of ``FailureReplay`` and ``FailureBank`` (in loops and controls
alike), ``--guide`` and ``--padding`` those of the loops' ``ErrorGuidedAugmentation`` and
``ScoreGuidedPadding`` (``--padding`` also D-Score's control's, its ``p`` aside, and the fixed padding's).
``--violation_guide`` gives the metamorphic loop a guide as well (an ``ErrorGuidedAugmentation`` over its
properties, set from each class's violation rates; its control then applies those transformations at the
loop's mean strength). ``--spread`` says what the loops'
``ErrorGuidedAugmentation`` guides keep of a proposal: ``cell`` (default) each class's probability of
each transformation, ``property`` each transformation's mean over the classes, the same for every class,
``even`` the proposal's mean for every class and transformation (the measurement sets only the dose).
``--properties`` names the property presets the robustness loop sweeps, its guide applies and its
control draws from (default ``framework``, the trio; several: their union, a repeated name keeping
the first preset's property).
Each run records the flags other than the defaults that changed it (``options``), and the tables
name them beside the arm: ``metamorphic [--metamorphic budget=None]``. ``--combine`` names the loops the
``dlguard`` arm combines, in the order their callbacks transform a batch (default: all of the setting's,
``COMBINE_ORDER``: D-Score's padding first); ``padding`` among them takes D-Score's place with its padding at a
fixed ``p`` (``--padding p=...``) on every batch from the first, and no measurement. ``--accelerator gpu`` fits
and judges on the GPU.
``--on NAME`` trains every loop and control arm on top of that standard augmentation, as a user who adds
dlguard to a pipeline that already augments would: it transforms the loader's rows first, before any
guide or replay (as a dataset transform would), so replayed failures go in as they were found. The
paired table then also compares ``dlguard`` with ``NAME`` alone: what the loops add to it.

Every arm trains the same network from scratch on the same training split for the same epochs, with
the same seeds (Adam 1e-3, on the RGB scenes decayed to 0 on a cosine over the epochs; batches of 64; the
seed also seeds every callback); only what happens
to the training batches differs:

- ``plain``; the standard augmentations ``augmix``, ``trivialaugment``, ``randaugment``
  (torchvision's, per image) and ``noise`` (Gaussian, ``σ ~ U(0, 0.3)`` per image);
- ``oracle``, a reference no user has: half the training images (``--oracle fraction=...``) through
  the judge's own corruptions, one drawn at random at a random severity (draws of its own, not the
  judge's): how much mCA there is to gain by aiming at these corruptions in this fit;
- each dlguard loop at its defaults, its measurements on a validation split: ``robustness``
  (``RobustnessCallback`` + ``ErrorGuidedAugmentation`` + ``FailureReplay``), ``dscore``
  (``DScoreCallback`` + ``ScoreGuidedPadding``), ``hda`` (``HDACallback`` + ``FailureReplay``),
  ``metamorphic`` (``MetamorphicCallback`` + ``FailureReplay``), on the scenes ``relevancy``
  (``ObjectRelevancyCallback`` + ``FailureReplay``: each unreliable inference's digit on ten fresh
  backgrounds), and ``dlguard`` (all of them on one bank; its record's ``dose`` holds the robustness
  guide's strength in each epoch (without it, the first guide's) and, under ``guides``, the others',
  D-Score's padding ``p`` among them);
- ``closed_loop_callbacks``: what a project gets from the library's one call,
  ``dlguard.callbacks.closed_loop_callbacks(masks=..., seed=seed)`` (README, "The anchored run's callbacks
  in a project of your own"): the anchored arm of ``anchor.py`` with README's flags, its noise the
  library's ``GaussianNoise`` (draws keyed by content and epoch) instead of ``--on noise``'s global-RNG draws;
  the loops' flags do not reach it but ``--properties``, which replaces its robustness loop's (default: the
  call's own, ``ROBUSTNESS_PRESETS``: framework, capture and exposure), and ``--on`` is refused; its records
  name the presets unless they are ``framework capture``, the call's default until 2026-12-06, whose records
  carry no options and keep the label ``closed_loop_callbacks``; from 2026-12-06 they hold its dose too (each
  detector's deposits by origin, its guides' strengths), so a rerun's record differs from an older one's there;
- ``closed_loop_callbacks-open``, the call's open-loop control (after the call, same seeds): the call made afresh
  with each detector replaced by its loop's control below, at the dose the call recorded -- D-Score's padding at
  its root mean square ``p``, the robustness properties at random at the guide's strength in each epoch and as
  cases, HDA's ball noise, the metamorphic transformations at random, random digits on fresh backgrounds --,
  each depositing under its detector's origin into the call's own replay, beside its noise and ``KeepOriginals``;
  with ``--dose_from FILE`` it follows the dose in ``FILE`` instead, the same in every seed, and needs no call
  (a dose written once, as a user without detection would have to; its label names the file, so it is not paired
  with the call of its seed automatically, though ``--pair`` can), or, where ``FILE`` holds one dose per seed
  (``{"seeds": {"3": dose, ...}}``), each seed's own: the control at the doses a call recorded, rerun without it;
  with ``--control_padding schedule`` its padding is the call's, at the call's ``p`` in each epoch (none before the
  call padded), instead of the root mean square from the first epoch (its label names the flag);
- ``closed_loop_callbacks-fill``, detection sets the dose and random fills it, in one run: the call as it is, its
  detectors measuring and depositing as the call's do, but each deposit of ``n`` failures replaced by ``n`` cases
  of the control's generators on random validation rows, with their true labels, and its robustness guide's
  strength applied evenly over classes and properties; D-Score's padding is the call's. Labelled as the call,
  paired with it seed by seed (it needs no call run: its detectors set its dose);
- each loop's open-loop control, ``<loop>-open``: the same generator's test cases, *not* chosen by
  detection, at the same dose. The loop's run is recorded -- how many failures it deposited at
  which validation, its replay fraction, its guide's strength in each epoch -- and the control
  deposits as many of its generator's cases, drawn from random validation inputs with their true
  labels, at the same validations (so the same ``FailureReplay`` replays as many rows), and applies
  the guide's transformations at the same mean strength, uniformly over classes and properties
  (D-Score's guide *is* its dose: ``p`` pads with probability ``p`` by a ratio ``p``, so its control
  pads at the loop's root mean square ``p`` in every epoch from the first). A control's cases come
  from a generator of its own, and its guide draws as the loop's guide does (``--control_draws loop``,
  the default: common random numbers), so training's shuffles and dropout go on as in the loop's run
  and a loop and its control differ only in what the loop chooses. (``--control_draws global`` is how
  runs before 2026-11-27 drew: a control's guide from the global RNG, which moved the shuffles too.) The
  generators: the robustness trio at random severities; metamorphic's label-preserving
  transformations at random parameters; for HDA, uniform noise in the ``radius`` ball
  (``hda-open``) and, a different generator at the same test-case budget, PGD at the same radius
  on the current model (``hda-pgd``: the paper's Table 10 baseline); for object relevancy, the digits
  of random validation scenes on as many fresh backgrounds each as the callback gives an unreliable one.

Judged on a test split that no callback and no training step sees: clean accuracy; mean
corruption accuracy (mCA) over fifteen albumentations corruptions at five severities
(``benchmarks/_corruptions.py``: an implementation dlguard does not share); FGSM and PGD accuracy
(``ε = 0.1`` on MNIST, ``8/255`` on the RGB scenes, PGD 10 steps of ``ε/4``, written here, not
dlguard's); each detector's own measure --
the violation rate of metamorphic's label-preserving transformations (lower is better), local
robustness under the robustness trio (the share of correctly classified test inputs that each
property at each severity leaves correct), D-Score (``v_fitness − v_robust`` over region-deletion
mutants and padding translations of the test split; higher is better), and HDA's ``R̂_g`` white-box
(100 test seeds searched by HDA's GA, 50 x 5 with its gradient start, against the arm's own final
model; the density-weighted share it still gets right), and on the scenes accuracy on the test
digits recomposited on backgrounds of random kinds (``shuffled``, object relevancy's) --;
and the fit's wall time, over ``plain``'s (``--judge goal``: the goal's figures alone, clean accuracy,
mCA, FGSM, PGD and ``shuffled``, without the detectors' measures). Mean ± standard deviation over the seeds.

A second table compares seed by seed, since every arm of a seed shares the split, the initial weights
and the first epoch's shuffle (a loop and its control every shuffle): each loop against its controls
(on mCA and on its own measure), HDA against plain training (PGD), the call against its control and the fill
against the call (mCA, clean accuracy, PGD), and the ``dlguard`` arm, the call and the fill each against the
best standard augmentation (mCA, PGD), plain training (clean accuracy, PGD) and ``oracle`` (mCA). A row
gives the mean of the per-seed differences ± its standard error and the seeds in which the first arm
did better; a mean within two standard errors of 0 is no difference these seeds can show.

Settings: ``mnist`` is ``mnist_a`` on the embedded MNIST (3,500 training, 1,000 validation, 500
test digits, stratified); ``scenes`` is a ResNet-18 (3x3 stride-1 stem) on dlguard's 32x32 RGB
scenes of the same digits, with ImageNet normalisation as ``preprocess`` (HDA's ``R̂_g`` on 20 test
seeds there); ``spurious`` the same on scenes whose background kind is the label (``spurious=1``:
the background alone predicts the label, a planted shortcut that ``shuffled`` exposes). Needs the
``bench`` extra.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import inspect
import json
import logging
import math
import platform
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, stdev
from typing import Any

import lightning as L
import torch
from _corruptions import corrupt, random_corruption
from _resnet import Normalize, resnet18_cifar
from sklearn.model_selection import train_test_split
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.transforms import v2

from dlguard._own_random import RankGenerator, drawing_from
from dlguard._validation import probability
from dlguard.augment import (
    PROPERTY_PRESETS,
    ErrorGuidedAugmentation,
    Property,
    ScoreGuidedPadding,
    default_properties,
    guide_p,
    property_preset,
)
from dlguard.callbacks import (
    DScoreCallback,
    FailureReplay,
    HDACallback,
    KeepOriginals,
    MetamorphicCallback,
    ObjectRelevancyCallback,
    RobustnessCallback,
    closed_loop_callbacks,
)
from dlguard.callbacks.closed_loop import ROBUSTNESS_PRESETS
from dlguard.data import FailureBank, make_scenes
from dlguard.data.mnist import embedded_mnist
from dlguard.generate import PCADistribution, dscore_test, hda_test, objects_on_fresh_backgrounds, pgd
from dlguard.metrics import DScore, EmpiricalGlobalRobustness
from dlguard.probes import ModelAdapter

EPS = 0.1
"""HDACallback's default radius: the HDA controls' ball, and the judge's ε on MNIST."""
EPOCHS = 6
"""Training epochs of every arm unless ``--epochs`` says otherwise (each run's record keeps its ``epochs``)."""


# ---- data and model -----------------------------------------------------------------------------


@dataclass
class Setting:
    """The splits (inputs in ``[0, 1]``), the network factory and the model's ``preprocess``."""

    train: tuple[Tensor, Tensor]
    val: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    make_net: Callable[[], nn.Module]
    preprocess: nn.Module | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    eps: float = EPS
    """The judge's L∞ radius (FGSM, PGD, HDA's search): 0.1 on MNIST, 8/255 on RGB scenes."""
    cosine: bool = False
    """Decay the learning rate to 0 on a cosine over the fit (the RGB scenes: without it, a ResNet-18's last
    epoch left plain training at 0.82-0.97 test accuracy from seed to seed, which no arm's effect survives)."""
    val_masks: Tensor | None = None
    """The validation scenes' object masks ``(N, H, W)``: validation batches carry them third, for object relevancy."""
    shuffled: Tensor | None = None
    """The test digits on backgrounds of random kinds, independent of the labels (shuffled-background accuracy)."""


def _split() -> tuple[Tensor, ...]:
    digits, labels = embedded_mnist()
    index = torch.arange(len(labels))
    train, rest = train_test_split(index, train_size=3500, stratify=labels, random_state=0)
    val, test = train_test_split(rest, train_size=1000, stratify=labels[rest], random_state=0)
    return digits, labels, torch.as_tensor(train), torch.as_tensor(val), torch.as_tensor(test)


def mnist_setting() -> Setting:
    from dlguard.zoo import mnist_a

    digits, labels, *splits = _split()
    images = digits[:, None].float() / 255
    train, val, test = ((images[rows], labels[rows]) for rows in splits)
    return Setting(train, val, test, mnist_a)


def scenes_setting(spurious: float = 0.0) -> Setting:
    digits, labels, *splits = _split()
    train, val, test = (
        make_scenes(digits[rows], labels[rows], spurious=spurious, seed=seed) for seed, rows in enumerate(splits)
    )
    kinds = torch.randint(10, (len(test),), generator=torch.Generator().manual_seed(len(splits)))
    return Setting(
        (train.images, train.labels),
        (val.images, val.labels),
        (test.images, test.labels),
        resnet18_cifar,
        preprocess=Normalize(),
        extra={"hda_seeds": 20},
        eps=8 / 255,
        cosine=True,
        val_masks=val.masks,
        shuffled=test.with_backgrounds(kinds, seed=len(splits)).images,
    )


SETTINGS: dict[str, Callable[[], Setting]] = {
    "mnist": mnist_setting,
    "scenes": scenes_setting,
    "spurious": lambda: scenes_setting(spurious=1.0),
}


class Classifier(L.LightningModule):
    """The network behind ``preprocess``; ``augment`` (a standard or reference arm's) runs in the training step."""

    def __init__(
        self,
        net: nn.Module,
        preprocess: nn.Module | None,
        augment: Callable[[Tensor], Tensor] | None,
        cosine: bool = False,
    ) -> None:
        super().__init__()
        self.net, self.prepare = net, preprocess or nn.Identity()
        self.augment, self.cosine = augment, cosine

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.prepare(x))

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        if self.augment is not None:
            x = self.augment(x)
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self.log("val_acc", (self(batch[0]).argmax(1) == batch[1]).float().mean())

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)
        if not self.cosine:
            return optimizer
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.max_epochs)
        return {"optimizer": optimizer, "lr_scheduler": schedule}


# ---- standard augmentations ---------------------------------------------------------------------


def per_image(transform: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """A torchvision transform of uint8 images, applied to each image of a float batch on its own."""

    def apply(x: Tensor) -> Tensor:
        pixels = (x * 255).round().to(torch.uint8)
        return torch.stack([transform(image) for image in pixels]).float() / 255

    return apply


def gaussian_noise(x: Tensor) -> Tensor:
    sigma = torch.rand(len(x), *([1] * (x.ndim - 1)), device=x.device) * 0.3
    return (x + sigma * torch.randn_like(x)).clamp(0, 1)


STANDARD = {
    "augmix": lambda: per_image(v2.AugMix()),
    "trivialaugment": lambda: per_image(v2.TrivialAugmentWide()),
    "randaugment": lambda: per_image(v2.RandAugment()),
    "noise": lambda: gaussian_noise,
}

REFERENCES: dict[str, Callable[[int], Callable[[Tensor], Tensor]]] = {
    "oracle": lambda seed: random_corruption(seed=seed, **OPTIONS["oracle"]),
}
"""Arms no user has, which tell how much there is to gain: ``oracle`` trains on the judge's own corruptions
(``--oracle fraction=0.5``: each image's chance of one, at a random severity). Never the best standard
augmentation of the paired table."""

ON: list[str] = []
"""Non-empty: the standard augmentation every loop and control arm trains on top of (``--on``)."""


class Underneath(L.Callback):
    """A standard augmentation under a loop (``--on``): the loader's rows, in place, before any guide or replay.

    First in the arm's callbacks, so Lightning calls it before the guides transform and ``FailureReplay``
    writes its rows: replayed failures are not augmented again, as with a dataset transform.
    """

    def __init__(self, augment: Callable[[Tensor], Tensor]) -> None:
        self.augment = augment

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        with torch.no_grad():
            batch[0].copy_(self.augment(batch[0]))


# ---- the loops, their doses and their open-loop controls ----------------------------------------


class RecordingBank(FailureBank):
    """A bank that remembers how many failures each validation deposited (the loop's dose)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.epoch = -1
        self.deposits: dict[int, int] = {}

    def add(self, inputs: Tensor, labels: Tensor, origin: str) -> None:
        super().add(inputs, labels, origin)
        self.deposits[self.epoch] = self.deposits.get(self.epoch, 0) + len(labels)


class Dose(L.Callback):
    """Records a loop's dose: deposits per validation, and its guide's strength in each training epoch.

    ``others`` names the guides of the other loops an arm combines (``{"dscore": (callback, padding)}``);
    their strengths are recorded too, under ``"guides"``.
    """

    def __init__(
        self,
        bank: RecordingBank | None,
        guide: nn.Module | None,
        owner: L.Callback | None,
        others: dict[str, tuple[L.Callback, nn.Module]] | None = None,
    ) -> None:
        self.bank, self.guide, self.owner = bank, guide, owner
        self.others = others or {}
        self.strength: list[float] = []
        self.guides: dict[str, list[float]] = {name: [] for name in self.others}

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.bank is not None:
            self.bank.epoch = trainer.current_epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.guide is not None:
            self.strength.append(_applied(self.guide, self.owner))
        for name, (owner, guide) in self.others.items():
            self.guides[name].append(_applied(guide, owner))

    def record(self) -> dict[str, Any]:
        deposits = {} if self.bank is None else {str(e): n for e, n in self.bank.deposits.items()}
        return {"deposits": deposits, "strength": self.strength, **({"guides": self.guides} if self.guides else {})}


class LibraryDose(Dose):
    """The dose of ``closed_loop_callbacks``' loops: what each deposited in the call's one bank, at which validation.

    Its robustness guide's strength in each epoch is ``strength``, D-Score's padding ``p`` is under ``guides``;
    ``origins`` holds ``{origin: {epoch: failures}}`` (``deposits`` their sums), counted as the detectors add them
    (the bank keeps the newest ``capacity`` per origin, so its length does not say). It only watches: the call's
    fit is the one without it.
    """

    def __init__(self, callbacks: list[L.Callback]) -> None:
        robustness = next(c for c in callbacks if isinstance(c, RobustnessCallback))
        dscore = next(c for c in callbacks if isinstance(c, DScoreCallback))
        bank = next(c for c in callbacks if isinstance(c, FailureReplay)).bank
        super().__init__(None, robustness.guide, robustness, {"dscore": (dscore, dscore.guide)})
        self.origins: dict[str, dict[str, int]] = {}
        self._epoch = -1
        add = bank.add

        def counted(inputs: Tensor, labels: Tensor, origin: str) -> None:
            add(inputs, labels, origin)
            counts = self.origins.setdefault(origin, {})
            counts[str(self._epoch)] = counts.get(str(self._epoch), 0) + len(labels)

        bank.add = counted  # type: ignore[method-assign]

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch = trainer.current_epoch

    def record(self) -> dict[str, Any]:
        deposits: dict[str, int] = {}
        for counts in self.origins.values():
            for epoch, count in counts.items():
                deposits[epoch] = deposits.get(epoch, 0) + count
        return {**super().record(), "deposits": deposits, "origins": self.origins}


def _applied(guide: nn.Module, owner: L.Callback | None) -> float:
    """The strength ``guide`` transforms this epoch's batches at: 0 until ``owner`` has set it."""
    if owner is None or not owner._guide_ready():
        return 0.0
    return guide_p(guide) if isinstance(guide, ErrorGuidedAugmentation) else float(guide.p)


class OpenLoop(L.Callback):
    """A loop's dose without its detection: random cases of the same generator, deposited and replayed alike.

    At each validation the loop deposited ``n`` failures at, ``n`` random validation inputs go through
    ``generate`` (with their true labels) into ``bank``; ``guide`` (when given) transforms the training
    batch at ``strength[epoch]``, the same for every class and property (a ``ScoreGuidedPadding`` given a
    ``strength`` pads at ``p = strength[epoch]``, not at its own ``p`` in every epoch). With ``twin``, the class name of
    the loop's guided callback, the guide draws its random numbers as that callback's guide does
    (``RankGenerator.named(seed, twin)``, one draw per batch seeding the global RNG, which is restored
    after): the loop and its control then share the shuffles and the guide's draws (common random
    numbers), and differ only in what the loop chooses. Without it the guide draws from the global RNG,
    which also moves training's shuffles (``--control_draws global``, how runs before it drew). ``twin_seed``
    is the loop's seed where it is not ``seed`` (a call's stand-ins draw their rows with seeds of their own).
    """

    def __init__(
        self,
        source: tuple[Tensor, Tensor],
        generate: Callable[[Tensor, Tensor, nn.Module], Tensor] | None,
        deposits: dict[str, int],
        bank: FailureBank | None,
        guide: nn.Module | None = None,
        strength: list[float] | None = None,
        seed: int = 0,
        twin: str | None = None,
        origin: str = "open-loop",
        twin_seed: int | None = None,
    ) -> None:
        self.source, self.generate, self.deposits, self.bank = source, generate, deposits, bank
        self.origin = origin  # the bank's origin of its cases: the loop's name where a control stands in a call's
        self.guide, self.strength = guide, strength or []
        self.generator = torch.Generator().manual_seed(seed)
        twin_seed = seed if twin_seed is None else twin_seed
        self.draws = None if twin is None else RankGenerator.named(twin_seed, twin)  # the loop's guide's stream
        self.deposited: dict[str, int] = {}
        self.applied: list[float] = []  # the guide's strength as applied, epoch by epoch (the loop's Dose records it)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if isinstance(self.guide, ErrorGuidedAugmentation):
            classes = int(self.source[1].max()) + 1
            self.guide.set_proposal(torch.full((classes, len(self.guide.properties)), self._strength(trainer)))
            self.applied.append(guide_p(self.guide))
        elif isinstance(self.guide, ScoreGuidedPadding) and self.strength:  # a padding on the loop's schedule
            self.guide.p = self._strength(trainer)
            self.applied.append(float(self.guide.p))

    def _strength(self, trainer: L.Trainer) -> float:
        return self.strength[trainer.current_epoch] if trainer.current_epoch < len(self.strength) else 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        if self.guide is not None and (self.applied[-1] if self.applied else 1.0) > 0:
            draws = (
                contextlib.nullcontext() if self.draws is None else drawing_from(self.draws.generator, batch[0].device)
            )
            with torch.no_grad(), draws:
                batch[0] = self.guide(batch[0], batch[1])

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        count = self.deposits.get(str(trainer.current_epoch), 0)
        if trainer.sanity_checking or not count or self.generate is None or self.bank is None:
            return
        cases, labels = random_cases(self.source, self.generate, count, self.generator, pl_module)
        self.bank.add(cases, labels, origin=self.origin)
        self.deposited[str(trainer.current_epoch)] = len(labels)


def random_rows(generator: torch.Generator, total: int, count: int) -> Tensor:
    """``count`` random rows of a split of ``total``: whole passes over it, then part of one more."""
    rounds = -(-count // total)
    return torch.cat([torch.randperm(total, generator=generator) for _ in range(rounds)])[:count]


def random_cases(
    source: tuple[Tensor, Tensor],
    generate: Callable[[Tensor, Tensor, nn.Module], Tensor],
    count: int,
    generator: torch.Generator,
    model: nn.Module,
) -> tuple[Tensor, Tensor]:
    """``count`` cases of ``generate`` made from random rows of ``source``, with the rows' true labels.

    The rows come from ``generator``, and so does the seed of ``generate``'s own draws, which leave the global CPU
    RNG as they found it: training's RNG goes on as in a run without them (the generators run on the CPU split).
    """
    inputs, labels = source
    rows = random_rows(generator, len(labels), count)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=generator)))
        return generate(inputs[rows], labels[rows], model), labels[rows]


def random_scenes(
    source: tuple[Tensor, Tensor], masks: Tensor, fresh: int, count: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``count`` rows of random scenes' objects on ``fresh`` backgrounds each (``ceil(count / fresh)`` scenes)."""
    (inputs, labels), rows = source, random_rows(generator, len(source[1]), -(-count // fresh))
    seed = int(torch.randint(2**31, (1,), generator=generator))
    moved = objects_on_fresh_backgrounds(inputs[rows], masks[rows], labels[rows], fresh, seed=seed)
    return moved.inputs[:count], moved.labels[:count]


class RelevancyOpenLoop(OpenLoop):
    """Object relevancy's dose without its detection: random validation scenes' objects on fresh backgrounds.

    The loop deposits each unreliable inference's object on ``fresh`` backgrounds of its own; at each
    validation it deposited ``n`` rows at, the objects of ``ceil(n / fresh)`` random validation scenes go
    onto ``fresh`` backgrounds each, drawn as the callback draws them (``n`` rows in all). (A loop with
    ``fresh_backgrounds=0`` deposits its follow-ups themselves; its control moves each digit onto one
    fresh background.)
    """

    def __init__(self, source: tuple[Tensor, Tensor], masks: Tensor, deposits: dict[str, int], bank: FailureBank,
                 fresh: int, seed: int = 0, origin: str = "open-loop") -> None:  # fmt: skip
        super().__init__(source, None, deposits, bank, seed=seed, origin=origin)
        self.masks, self.fresh = masks, fresh

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        count = self.deposits.get(str(trainer.current_epoch), 0)
        if trainer.sanity_checking or not count or self.bank is None:
            return
        cases, labels = random_scenes(self.source, self.masks, self.fresh, count, self.generator)
        self.bank.add(cases, labels, origin=self.origin)
        self.deposited[str(trainer.current_epoch)] = len(labels)


def random_properties(properties: list) -> Callable[[Tensor, Tensor, nn.Module], Tensor]:
    """Each input through one property of ``properties`` at one of its levels, both drawn at random."""

    def generate(x: Tensor, y: Tensor, model: nn.Module) -> Tensor:
        which = torch.randint(len(properties), (len(x),))
        out = x.clone()
        for index, prop in enumerate(properties):
            rows = which == index
            if rows.any():
                levels = torch.tensor(prop.levels)[torch.randint(len(prop.levels), (int(rows.sum()),))]
                out[rows] = prop(x[rows], levels.to(x))
        return out

    return generate


def ball_noise(radius: float) -> Callable[[Tensor, Tensor, nn.Module], Tensor]:
    return lambda x, y, model: (x + (2 * torch.rand_like(x) - 1) * radius).clamp(0, 1)


def pgd_cases(radius: float) -> Callable[[Tensor, Tensor, nn.Module], Tensor]:
    # dlguard's pgd runs on the model's device and returns the cases where the inputs were (the CPU split)
    return lambda x, y, model: pgd(model, x, y, eps=radius, step=radius / 4, steps=10)


@dataclass
class Arm:
    """What an arm adds to the trainer, and the dose it records (loops) or follows (controls)."""

    callbacks: list[L.Callback]
    augment: Callable[[Tensor], Tensor] | None = None
    dose: Dose | None = None


OPTIONS: dict[str, dict[str, Any]] = {
    "hda": {},
    "robustness": {},
    "metamorphic": {},
    "dscore": {},
    "relevancy": {},
    "replay": {},
    "bank": {},
    "guide": {},
    "violation_guide": {},
    "padding": {},
    "oracle": {},
    "call": {},
}
"""Arguments other than the defaults, from ``--<name> key=value ...``: the callbacks' (e.g. ``--hda k=50
budget=None``, ``--metamorphic budget=None``, ``--relevancy budget=None``), ``FailureReplay``'s and
``FailureBank``'s (loops and controls alike, e.g. ``--replay repeats=None``, ``--bank capacity=1024``), the
robustness loop's ``ErrorGuidedAugmentation``'s (``--guide strength=1.0``), the metamorphic loop's
(``--violation_guide``, which also turns that guide on), ``ScoreGuidedPadding``'s and the ``oracle`` arm's
(``--oracle fraction=0.25``) and ``closed_loop_callbacks``' (``--call budget=0.5``: the call's and its
control's, which is the call made afresh). Values are Python literals: ``budget=1`` is one forward pass,
``budget=1.0`` the whole validation loader. A run's label names every argument given, a default's value
too (``--call budget=0.15`` is labelled apart from the call at its defaults): give only what differs."""


def check_call(call: dict[str, Any]) -> None:
    """Refuse ``--call`` arguments the call would refuse, or the benchmark sets itself, before any arm fits."""
    taken = sorted(set(call) & {"masks", "properties", "seed"})
    if taken:
        raise SystemExit(f"--call: {taken} are the benchmark's own (the setting's masks, --properties, --seeds)")
    try:
        closed_loop_callbacks(**call)
    except (TypeError, ValueError) as error:
        raise SystemExit(f"--call: {error}") from None


class SpreadGuide(ErrorGuidedAugmentation):
    """An ``ErrorGuidedAugmentation`` that keeps less of each proposal than its cells (``--spread``).

    ``property``: every class gets each transformation's mean over the classes; ``even``: every cell the mean.
    """

    def __init__(self, *args: Any, spread: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spread = spread

    def set_proposal(self, proposal: Tensor | Any) -> None:
        super().set_proposal(proposal)  # the cells' own checks first: out-of-range cells must not average away
        table = self.proposal
        kept = table.mean(0, keepdim=True) if self.spread == "property" else table.mean()
        super().set_proposal(kept.expand_as(table))


def robustness_properties() -> list[Property]:
    """The properties of the presets ``--properties`` names, in order; a name already taken keeps its first."""
    chosen: dict[str, Property] = {}
    for preset in PROPERTIES:
        for prop in property_preset(preset, "--properties"):
            chosen.setdefault(prop.name, prop)
    return list(chosen.values())


def error_guide(*args: Any, **kwargs: Any) -> ErrorGuidedAugmentation:
    """A loop's ``ErrorGuidedAugmentation``, keeping of each proposal what ``--spread`` says."""
    return (
        ErrorGuidedAugmentation(*args, **kwargs)
        if SPREAD[0] == "cell"
        else SpreadGuide(*args, spread=SPREAD[0], **kwargs)
    )


def loop_arm(name: str, setting: Setting, seed: int) -> Arm:
    # no preprocess: Classifier.forward normalises already, so a callback's view of the model is the model
    # (the scenes' first GPU runs passed the setting's Normalize as well, and the loops probed the
    # ResNet-18 through two normalisations)
    options: dict[str, Any] = {"seed": seed}
    bank = RecordingBank(**OPTIONS["bank"])
    replay = FailureReplay(bank=bank, seed=seed, **OPTIONS["replay"])
    twin = DScoreCallback.__name__  # fixed padding draws from D-Score's guide's stream
    parts: dict[str, Callable[[], tuple[L.Callback, nn.Module | None]]] = {
        "robustness": lambda: _with_guide(
            lambda guide: RobustnessCallback(
                properties=robustness_properties(), guide=guide, bank=bank, **{**options, **OPTIONS["robustness"]}
            ),
            error_guide(robustness_properties(), **OPTIONS["guide"]),
        ),
        "dscore": lambda: _with_guide(
            lambda guide: DScoreCallback(guide=guide, **{**options, **OPTIONS["dscore"]}),
            ScoreGuidedPadding(**OPTIONS["padding"]),
        ),
        FIXED_PADDING: lambda: (  # D-Score's padding without its measurement: fixed p, from the first batch
            OpenLoop(setting.val, None, {}, None, ScoreGuidedPadding(**OPTIONS["padding"]), seed=seed, twin=twin),
            None,
        ),
        "hda": lambda: (HDACallback(bank=bank, **{**options, **OPTIONS["hda"]}), None),
        "relevancy": lambda: (ObjectRelevancyCallback(bank=bank, **{**options, **OPTIONS["relevancy"]}), None),
        "metamorphic": lambda: (
            _with_guide(
                lambda guide: MetamorphicCallback(bank=bank, guide=guide, **{**options, **OPTIONS["metamorphic"]}),
                error_guide(property_preset("label_preserving"), **OPTIONS["violation_guide"]),
            )
            if VIOLATION_GUIDE
            else (MetamorphicCallback(bank=bank, **{**options, **OPTIONS["metamorphic"]}), None)
        ),
    }
    if setting.val_masks is None:  # object relevancy needs the objects' masks: the scenes have them
        arms_for(setting, [name], COMBINED if name == "dlguard" else [])  # refuses relevancy, naming the flag
        del parts["relevancy"]
    chosen = combined_loops(setting) if name == "dlguard" else [name]
    made = [parts[part]() for part in chosen]
    callbacks = [callback for callback, _ in made]
    guided = {part: (c, g) for part, (c, g) in zip(chosen, made, strict=True) if g is not None}
    owner, guide = guided.get("robustness") or next(iter(guided.values()), (None, None))  # the arm's dose
    uses_bank = name != "dscore"
    others = {part: pair for part, pair in guided.items() if pair[1] is not guide}
    dose = Dose(bank if uses_bank else None, guide, owner, others)
    return Arm([*callbacks, *([replay] if uses_bank else []), dose], dose=dose)


def _with_guide(make: Callable[[nn.Module], L.Callback], guide: nn.Module) -> tuple[L.Callback, nn.Module]:
    return make(guide), guide


def _twin(loop: type) -> str | None:
    """The class whose guide draws a control's guide mirrors (``--control_draws loop``), or ``None``."""
    return loop.__name__ if CONTROL_DRAWS[0] == "loop" else None


def open_arm(name: str, setting: Setting, seed: int, dose: dict[str, Any]) -> Arm:
    loop, _, variant = name.partition("-")
    bank = FailureBank(**OPTIONS["bank"])
    strength = dose["strength"]
    if loop == "dscore":  # the guide is the dose: p pads with probability p by a ratio p, so match the mean p²
        rms = math.sqrt(mean(p * p for p in strength)) if strength else 0.0
        guide = ScoreGuidedPadding(**{**OPTIONS["padding"], "p": rms})  # the loop's fill (--padding padding_mode=)
        return Arm([OpenLoop(setting.val, None, {}, None, guide=guide, seed=seed, twin=_twin(DScoreCallback))])
    if loop == "relevancy":
        default = inspect.signature(ObjectRelevancyCallback).parameters["fresh_backgrounds"].default
        fresh = max(1, OPTIONS["relevancy"].get("fresh_backgrounds", default))  # 0: the loop deposits follow-ups
        assert setting.val_masks is not None
        control = RelevancyOpenLoop(setting.val, setting.val_masks, dose["deposits"], bank, fresh, seed=seed)
        return Arm([control, FailureReplay(bank=bank, seed=seed, **OPTIONS["replay"])])
    make: dict[str, Callable[[], tuple[Callable[[Tensor, Tensor, nn.Module], Tensor], nn.Module | None]]] = {
        "robustness": lambda: (
            random_properties(robustness_properties()),
            ErrorGuidedAugmentation(robustness_properties(), strength=1.0),
        ),
        "metamorphic": lambda: (
            random_properties(property_preset("label_preserving")),
            ErrorGuidedAugmentation(property_preset("label_preserving"), strength=1.0) if VIOLATION_GUIDE else None,
        ),
        "hda": lambda: (pgd_cases(EPS) if variant == "pgd" else ball_noise(EPS), None),
    }
    generate, guide = make[loop]()
    twin = _twin(RobustnessCallback if loop == "robustness" else MetamorphicCallback)
    control = OpenLoop(setting.val, generate, dose["deposits"], bank, guide=guide, strength=strength, seed=seed,
                       twin=twin)  # fmt: skip
    return Arm([control, FailureReplay(bank=bank, seed=seed, **OPTIONS["replay"])])


STAND_IN_SEEDS = {"robustness": 1, "hda": 2, "metamorphic": 3, "relevancy": 4}
"""Each detector's stand-in's seed, over the run's: the call's control's and the fill's cases of one origin draw
rows from the same generator."""


def library_open_arm(setting: Setting, seed: int, dose: dict[str, Any]) -> Arm:
    """``closed_loop_callbacks``' open-loop control: every loop of the call replaced by its control, at its dose.

    The call is made afresh and its detectors left out: its noise, its ``FailureReplay`` (on its own, empty bank)
    and its ``KeepOriginals`` stay as they are, in their places. In the detectors' places, in their order: D-Score's
    padding at the root mean square of the ``p`` the call padded at, every epoch from the first (as
    ``dscore-open``; ``--control_padding schedule``: at the ``p`` the call padded at in each epoch, none before
    the call padded); the robustness loop's properties at random (cases) and, as its guide, at the call's guide's
    strength in each epoch, uniform over classes and properties; HDA's ``radius``-ball noise; the metamorphic
    loop's transformations at random; objects of random validation scenes on fresh backgrounds. Each deposits as
    many cases as its detector did at the same validations, under the detector's origin, so the replay draws
    them in the call's proportions.
    """
    masks = 2 if setting.val_masks is not None else None
    properties = robustness_properties() if LIBRARY_PROPERTIES else None
    call = closed_loop_callbacks(masks=masks, properties=properties, seed=seed, **OPTIONS["call"])
    found = {type(c): c for c in call}
    replay = found[FailureReplay]
    origins = dose["origins"]
    strength = dose["guides"]["dscore"]
    rms = math.sqrt(mean(p * p for p in strength)) if strength else 0.0
    schedule = CONTROL_PADDING[0] == "schedule"  # the call's p in each epoch (0 before it padded), not the rms
    padding_mode = found[DScoreCallback].guide.flags["padding_mode"]
    padding = ScoreGuidedPadding(p=0.0 if schedule else rms, padding_mode=padding_mode)
    robustness = found[RobustnessCallback].properties
    controls: list[L.Callback] = [
        OpenLoop(setting.val, None, {}, None, guide=padding, strength=strength if schedule else None, seed=seed,
                 twin=_twin(DScoreCallback)),
        OpenLoop(setting.val, random_properties(robustness), origins.get("robustness", {}), replay.bank,
                 guide=ErrorGuidedAugmentation(robustness, strength=1.0), strength=dose["strength"],
                 seed=seed + STAND_IN_SEEDS["robustness"],
                 twin=_twin(RobustnessCallback), origin="robustness", twin_seed=seed),
        OpenLoop(setting.val, ball_noise(found[HDACallback].radius), origins.get("hda", {}), replay.bank,
                 seed=seed + STAND_IN_SEEDS["hda"], origin="hda"),
        OpenLoop(setting.val, random_properties(found[MetamorphicCallback].properties), origins.get("metamorphic", {}),
                 replay.bank, seed=seed + STAND_IN_SEEDS["metamorphic"], origin="metamorphic"),
    ]  # fmt: skip
    if masks is not None:
        fresh = max(1, found[ObjectRelevancyCallback].fresh_backgrounds)
        relevancy = origins.get("relevancy", {})
        controls.append(RelevancyOpenLoop(setting.val, setting.val_masks, relevancy, replay.bank, fresh,
                                          seed=seed + STAND_IN_SEEDS["relevancy"], origin="relevancy"))  # fmt: skip
    before = [c for c in call if not isinstance(c, (FailureReplay, KeepOriginals)) and type(c) not in LOOP_TYPES]
    return Arm([*before, *controls, replay, found[KeepOriginals]])


class RandomFill(L.Callback):
    """Detection sets the dose, random fills it: each detector's deposit replaced by as many random cases.

    Wraps ``bank.add``: when a detector adds ``n`` failures under its origin, ``n`` cases of that origin's generator
    go into the bank instead, made from random rows of ``source`` with their true labels (``makers``: ``{origin:
    (count, generator, model) -> (cases, labels)}``, each origin drawing from a generator of its own, seeded as the
    call's control seeds its stand-in of that detector). What the detector measured (how many failed, when) sets
    how many; which inputs, and how they are transformed, is drawn at random. Training's RNG goes on as in the
    call's run: the cases draw from their own generators.
    """

    def __init__(self, bank: FailureBank, makers: dict[str, Callable[..., tuple[Tensor, Tensor]]],
                 seeds: dict[str, int]) -> None:  # fmt: skip
        self.makers = makers
        self.generators = {origin: torch.Generator().manual_seed(seed) for origin, seed in seeds.items()}
        self.model: nn.Module | None = None
        add = bank.add

        def filled(inputs: Tensor, labels: Tensor, origin: str) -> None:
            if not len(labels):  # a measurement that found nothing: nothing to fill, no draw (a control skips it too)
                return add(inputs, labels, origin)
            add(*self.makers[origin](len(labels), self.generators[origin], self.model), origin)

        bank.add = filled  # type: ignore[method-assign]

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.model = pl_module


def library_fill(call: list[L.Callback], setting: Setting, seed: int) -> list[L.Callback]:
    """``closed_loop_callbacks-fill``: the call, its detectors setting the dose and random cases filling it.

    The call's callbacks as they are, but its bank's deposits are random cases of its control's generators
    (:class:`RandomFill`, the same generators and row seeds as :func:`library_open_arm`'s stand-ins) and its
    robustness guide is a ``SpreadGuide`` (``--spread even``) of the call's guide's properties and strength: it keeps
    each proposal's mean in every cell (the strength the detector set), the same for every class and property.
    D-Score's padding is the call's: its ``p`` is one number for every input already.
    """
    found = {type(c): c for c in call}
    robustness, guide = found[RobustnessCallback], found[RobustnessCallback].guide
    assert guide is not None  # the call's robustness loop is guided
    robustness.guide = SpreadGuide(guide.properties, strength=guide.strength, rows_only=guide.rows_only, spread="even")
    source = setting.val
    makers: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
        origin: functools.partial(random_cases, source, generate)
        for origin, generate in (
            ("robustness", random_properties(found[RobustnessCallback].properties)),
            ("hda", ball_noise(found[HDACallback].radius)),
            ("metamorphic", random_properties(found[MetamorphicCallback].properties)),
        )
    }
    if ObjectRelevancyCallback in found:
        assert setting.val_masks is not None
        fresh = max(1, found[ObjectRelevancyCallback].fresh_backgrounds)
        makers["relevancy"] = lambda count, generator, model: random_scenes(
            source, setting.val_masks, fresh, count, generator
        )
    seeds = {origin: seed + offset for origin, offset in STAND_IN_SEEDS.items()}
    return [*call, RandomFill(found[FailureReplay].bank, makers, seeds)]


LOOP_TYPES = (DScoreCallback, RobustnessCallback, HDACallback, MetamorphicCallback, ObjectRelevancyCallback)
"""The detectors of ``closed_loop_callbacks``, which its control replaces."""
LOOPS = ("robustness", "dscore", "hda", "metamorphic", "relevancy", "dlguard")
GUIDED = ("robustness", "dscore")
"""Loops with a guide whatever the flags (the metamorphic loop has one with ``--violation_guide``)."""
VIOLATION_GUIDE: list[bool] = []
"""Non-empty: the metamorphic loop drives an ``ErrorGuidedAugmentation`` too (``--violation_guide``), and its
control applies those transformations at the loop's mean strength, uniformly over classes and properties."""
SPREADS = ("cell", "property", "even")
SPREAD: list[str] = ["cell"]
"""What the loops' guides keep of a proposal (``--spread``): ``cell``, ``property`` or ``even``."""
CONTROL_PADDING: list[str] = ["rms"]
"""How the call's control pads (``--control_padding``): ``rms``, at the root mean square of the call's ``p`` in
every epoch from the first (as ``dscore-open``), or ``schedule``, at the call's ``p`` in each epoch (none before
the call padded): the same padding as the call's, so the control differs from the call in its cases and its guide's
spread alone."""
CONTROL_DRAWS: list[str] = ["loop"]
"""Where a control's guide draws its random numbers (``--control_draws``): ``loop``, the loop's guide's own
stream (common random numbers: the same shuffles and guide draws as the loop's run), or ``global``, the
global RNG, which also moves training's shuffles (every run before 2026-11-27 drew so)."""
PROPERTIES: list[str] = ["framework"]
"""The property presets the robustness loop sweeps, its guide applies and its control draws (``--properties``)."""
LIBRARY_PROPERTIES: list[str] = []
"""``--properties`` as given, for ``closed_loop_callbacks``' robustness loop; empty (no flag): the call's own default,
``ROBUSTNESS_PRESETS`` (the loops' default, ``framework`` alone, is not the call's)."""
HISTORIC_LIBRARY_PRESETS = ["framework", "capture"]
"""The call's robustness presets until 2026-12-06: its records then carried no ``options``, so runs of these presets
label ``closed_loop_callbacks`` alone, and runs of any others (the default since included) name them."""
COMBINED: list[str] = []
"""The loops the ``dlguard`` arm combines (``--combine``), in this order; empty: the setting's, ``COMBINE_ORDER``."""
COMBINE_ORDER = ("dscore", "robustness", "hda", "metamorphic", "relevancy")
"""The order the ``dlguard`` arm's callbacks transform a batch in by default: D-Score's padding, which resamples
the image, before the robustness loop's photometric guide, as README's examples list them (docs/closed_loop.md,
"D-Score's padding before the photometric guide"; until 2026-11-29 ``robustness dscore hda relevancy metamorphic``)."""
FIXED_PADDING = "padding"
"""A member of ``--combine`` only: D-Score's ``ScoreGuidedPadding`` at a fixed ``p`` (``--padding p=...``, its
default 0.5) on every training batch from the first, with no D-Score measurement. It draws from
``DScoreCallback``'s guide's stream (D-Score's guide draws only from its first measurement on), so it takes
``dscore``'s place, never a place beside it."""
CONTROLS = ("robustness-open", "dscore-open", "hda-open", "hda-pgd", "metamorphic-open", "relevancy-open")
LIBRARY = "closed_loop_callbacks"
"""The arm a project gets from one library call: ``dlguard.callbacks.closed_loop_callbacks(masks=2, seed=seed)``
as README gives it (its own keyed ``GaussianNoise`` under the loops, so no ``--on``; the loops' flags do not reach
it, but ``--properties``, when given, replaces its robustness loop's, and ``--call`` gives it arguments). What
``anchor.py``'s ``dlguard`` arm with README's flags runs, but with the library's noise draws."""
LIBRARY_CONTROL = f"{LIBRARY}-open"
"""``closed_loop_callbacks``' loops, each replaced by its open-loop control at the call's dose (after the call, same
seeds, :func:`library_open_arm`; with ``--dose_from``, at a file's): the same transformations and cases at random,
to tell what detection adds."""
LIBRARY_FILL = f"{LIBRARY}-fill"
"""The call with its detection setting the dose and random cases filling it, in one run (:func:`library_fill`): its
detectors measure and deposit as the call's do, but each deposit is as many random cases of the control's
generators, and the robustness guide applies its strength evenly over classes and properties."""
CALLS = (LIBRARY, LIBRARY_CONTROL, LIBRARY_FILL)
"""The arms made from the call, each with its noise, its one replay and its ``KeepOriginals``."""
ARMS = ("plain", *STANDARD, *REFERENCES, *LOOPS, *CONTROLS, *CALLS)
DOSE_FROM: list[tuple[str, dict[int, dict[str, Any]]]] = []
"""``--dose_from FILE``: ``(FILE's name, {seed: its dose})``, which ``closed_loop_callbacks-open`` follows in each
seed in place of the dose the call recorded in the same seed (:func:`read_doses`). Empty: the call's (it runs
first)."""
DOSE_ORIGINS = ("robustness", "hda", "metamorphic", "relevancy")
"""The origins a dose's ``origins`` may name: the call's detectors that deposit into its bank (D-Score pads only)."""


def read_doses(path: Path, epochs: int, seeds: Sequence[int]) -> dict[int, dict[str, Any]]:
    """``{seed: dose}`` for every one of ``seeds`` from ``path`` (``--dose_from``), refused before any fit if malformed.

    A dose is what a call's record keeps under ``dose`` (``python benchmarks/closed_loop.py --results`` files), or
    one written by hand in the same form: ``origins`` (``{origin: {epoch: cases}}``, origins among
    ``DOSE_ORIGINS``, cases non-negative integers), ``strength`` (the robustness guide's in each training epoch) and
    ``guides`` (``{"dscore": [p in each training epoch]}``), probabilities in ``[0, 1]``, one per epoch of the run
    (``epochs``), and every epoch an origin names one of them (``"0"`` to ``"epochs - 1"``), so none of it goes
    unused; other keys (a ``note`` saying where it came from, a record's ``deposits``) are read past. ``path``
    holds one dose, followed in every seed, or one per seed under ``"seeds"`` (``{"seeds": {"3": dose, "4":
    dose}}``, a ``note`` beside it read past), each seed following its own: how a control at the doses the call
    recorded seed by seed reruns without the call (each seed's record's ``dose``), under one label. A seed of
    ``seeds`` the file holds no dose for is refused.
    """
    given = _read_json(path)
    if not (isinstance(given, dict) and "seeds" in given):
        dose = _checked_dose(given, str(path), epochs)
        return dict.fromkeys(seeds, dose)
    per_seed = given["seeds"]
    if not isinstance(per_seed, dict) or not all(isinstance(k, str) and k.isdecimal() for k in per_seed):
        raise SystemExit(f"--dose_from: {path}'s seeds must map seeds ('3') to doses, got {per_seed!r}")
    missing = [seed for seed in seeds if str(seed) not in per_seed]
    if missing:
        raise SystemExit(f"--dose_from: {path} holds no dose for seeds {missing} (--seeds); it has {list(per_seed)}")
    return {seed: _checked_dose(per_seed[str(seed)], f"{path}'s seeds['{seed}']", epochs) for seed in seeds}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"--dose_from: cannot read a dose from {path}: {error}") from None


def _checked_dose(dose: Any, where: str, epochs: int) -> dict[str, Any]:
    """``dose``'s three parts (:func:`read_doses`), or a ``SystemExit`` naming ``where`` and what is wrong."""
    missing = [key for key in ("origins", "strength", "guides") if not isinstance(dose, dict) or key not in dose]
    if missing:
        raise SystemExit(f"--dose_from: {where} has no {', '.join(missing)} (a call's recorded dose has all three)")
    origins = dose["origins"]
    if not isinstance(origins, dict) or not set(origins) <= set(DOSE_ORIGINS):
        raise SystemExit(f"--dose_from: {where}'s origins must be a dict of {', '.join(DOSE_ORIGINS)}, got {origins!r}")
    trained = {str(epoch) for epoch in range(epochs)}  # as a Trainer counts them, and as a record writes them
    for origin, counts in origins.items():
        if not isinstance(counts, dict) or not all(
            epoch in trained and isinstance(n, int) and not isinstance(n, bool) and n >= 0
            for epoch, n in counts.items()
        ):
            raise SystemExit(
                f"--dose_from: {where}'s origins[{origin!r}] must map epochs '0' to '{epochs - 1}' (--epochs {epochs}) "
                f"to case counts, got {counts!r}"
            )
    guides = dose["guides"]
    if not isinstance(guides, dict) or "dscore" not in guides:
        raise SystemExit(f"--dose_from: {where}'s guides must hold dscore's p in each epoch, got {guides!r}")
    for name, values in (("strength", dose["strength"]), ("guides['dscore']", guides["dscore"])):
        try:  # the library's own check of a probability (a number in [0, 1], not a bool, not NaN)
            if not isinstance(values, list) or len(values) != epochs:
                raise ValueError(name)
            for value in values:
                probability(name, value)
        except ValueError:
            raise SystemExit(
                f"--dose_from: {where}'s {name} must be a list of {epochs} probabilities in [0, 1], one per epoch "
                f"(--epochs {epochs}), got {values!r}"
            ) from None
    return {"origins": origins, "strength": dose["strength"], "guides": {"dscore": guides["dscore"]}}


def _one_padding(combine: list[str]) -> None:
    """Refuse ``--combine dscore padding``: the fixed padding takes D-Score's place (and its stream)."""
    if {"dscore", FIXED_PADDING} <= set(combine):
        raise SystemExit(f"--combine: {FIXED_PADDING} is D-Score's padding without its measurement: give dscore "
                         f"or {FIXED_PADDING}, not both")  # fmt: skip


def combined_loops(setting: Setting) -> list[str]:
    """The loops the ``dlguard`` arm combines, in the order they transform a batch (relevancy: the scenes)."""
    given = list(dict.fromkeys(COMBINED))
    _one_padding(given)
    return given or [loop for loop in COMBINE_ORDER if setting.val_masks is not None or loop != "relevancy"]


# ---- judging ------------------------------------------------------------------------------------


def predict(model: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        return torch.cat([model(part).argmax(1) for part in x.split(500)])


def attack(model: nn.Module, x: Tensor, y: Tensor, eps: float, steps: int) -> Tensor:
    """FGSM (one step of ``eps``) or PGD (``steps`` of ``eps/4``), L∞, no random start: written here, not dlguard's."""
    step = eps if steps == 1 else eps / 4
    adversarial = x.clone()
    for _ in range(steps):
        adversarial.requires_grad_(True)
        loss = nn.functional.cross_entropy(model(adversarial), y)
        (gradient,) = torch.autograd.grad(loss, adversarial)
        adversarial = (adversarial.detach() + step * gradient.sign()).clamp(x - eps, x + eps).clamp(0, 1)
    return adversarial.detach()


def violation_rate(model: nn.Module, x: Tensor) -> float:
    """Share of (input, transformation, parameter) whose prediction differs from the source's (metamorphic)."""
    torch.manual_seed(0)
    source = predict(model, x)
    flips = []
    for prop in property_preset("label_preserving"):
        for level in prop.levels:
            levels = torch.full((len(x),), float(level), device=x.device)
            flips.append((predict(model, prop(x, levels)) != source).float().mean())
    return float(torch.stack(flips).mean())


def local_robustness(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """The robustness loop's own measure: the share of correctly classified inputs the trio leaves correct."""
    torch.manual_seed(0)
    right = predict(model, x) == y
    kept = []
    for prop in default_properties():
        for level in prop.levels:
            moved = predict(model, prop(x[right], torch.full((int(right.sum()),), float(level), device=x.device)))
            kept.append((moved == y[right]).float().mean())
    return float(torch.stack(kept).mean())


def d_score_of(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """D-Score (SPEC §1, ``n = 3``, ``t = 5``: the callback's defaults) of ``model`` on ``x``; higher is better."""
    run = dscore_test(model, x, y)
    metric = DScore(3, run.num_classes).to(run.logits.device)
    metric.update(run.logits, run.mutant_logits, run.translated_logits, run.target)
    return float(metric.compute().d_score)


def hda_robustness(model: Classifier, setting: Setting, distribution: PCADistribution, seed: int) -> float:
    """HDA's own measure, white-box: ``R̂_g`` of the model on the test cases HDA's search finds against it.

    ``k`` seeds of the test split (by density and gradient indicator), each searched by the two-step GA
    (population 50, 5 iterations, a gradient start) in its ``ε``-ball; ``R̂_g`` is the density-weighted
    share of seeds whose best test case the model still gets right.
    """
    x, y = (part.to(next(model.parameters()).device) for part in setting.test)
    adapter = ModelAdapter(model.net, preprocess=setting.preprocess)
    run = hda_test(adapter, x, y, distribution, k=setting.extra.get("hda_seeds", 100), radius=setting.eps, seed=seed,
                   holdout=1.0, gradient_start=True, population=50, iterations=5)  # fmt: skip
    robustness = EmpiricalGlobalRobustness()
    robustness.update(*run.heldout_share)
    return float(robustness.compute())


JUDGED: list[str] = ["all"]
"""What the judge measures (``--judge``): ``all``, or ``goal``, the figures the goal is judged by (clean
accuracy, mCA, FGSM and PGD accuracy, on the scenes ``shuffled``) without the detectors' own measures (on
the scenes at one thread a goal judgement still takes about as long as plain's fit: mCA's 75 corrupted
test sets are most of it)."""


def judge(model: Classifier, setting: Setting, corrupted: dict[str, Tensor], distribution: PCADistribution) -> dict:
    """Every figure of the model on the test split (``--judge goal``: the goal's), on the device of ``corrupted``."""
    device = next(iter(corrupted.values())).device
    model.eval().to(device)
    x, y = (part.to(device) for part in setting.test)
    scores = {"clean": float((predict(model, x) == y).float().mean())}
    per = {name: [float((predict(model, c) == y).float().mean()) for c in levels] for name, levels in corrupted.items()}
    scores["mCA"] = mean(mean(v) for v in per.values())
    if setting.shuffled is not None:  # object relevancy's own measure: the digits on backgrounds of random kinds
        scores["shuffled"] = float((predict(model, setting.shuffled.to(device)) == y).float().mean())
    scores["corruptions"] = {name: round(mean(v), 4) for name, v in per.items()}
    scores["fgsm"] = float((predict(model, attack(model, x, y, setting.eps, 1)) == y).float().mean())
    scores["pgd"] = float((predict(model, attack(model, x, y, setting.eps, 10)) == y).float().mean())
    if JUDGED[0] == "goal":
        return scores
    scores["violation_rate"] = violation_rate(model, x)
    scores["local_robustness"] = local_robustness(model, x, y)
    scores["d_score"] = d_score_of(model, x, y)
    scores["R_g"] = hda_robustness(model, setting, distribution, 0)
    return scores


# ---- one run ------------------------------------------------------------------------------------


def make_arm(arm_name: str, setting: Setting, seed: int, doses: dict[str, Any]) -> Arm:
    """The arm ``arm_name`` adds to a fit; under ``--on`` a loop's or control's callbacks start with ``Underneath``."""
    if arm_name == "plain":
        return Arm([])
    if arm_name in STANDARD:
        return Arm([], augment=STANDARD[arm_name]())
    if arm_name in REFERENCES:
        return Arm([], augment=REFERENCES[arm_name](seed))
    if arm_name in (LIBRARY, LIBRARY_FILL):  # the validation batches' third field holds the scenes' masks
        if ON:
            raise SystemExit(f"--on: {arm_name} brings its own noise under the loops; leave --on out")
        properties = robustness_properties() if LIBRARY_PROPERTIES else None  # None: the call's own default
        masks = 2 if setting.val_masks is not None else None
        callbacks = closed_loop_callbacks(masks=masks, properties=properties, seed=seed, **OPTIONS["call"])
        dose = LibraryDose(callbacks)  # what the detectors deposit: the fill's cases are as many
        if arm_name == LIBRARY_FILL:
            callbacks = library_fill(callbacks, setting, seed)
        return Arm([*callbacks, dose], dose=dose)
    if arm_name == LIBRARY_CONTROL:
        if DOSE_FROM:  # a dose from a file (--dose_from), written once or per seed: no call's detection in this run
            return library_open_arm(setting, seed, DOSE_FROM[0][1][seed])
        if LIBRARY not in doses:
            raise SystemExit(f"--arms: {arm_name} follows the dose of {LIBRARY}: run {LIBRARY} before it (same seeds)")
        return library_open_arm(setting, seed, doses[LIBRARY])
    if arm_name in LOOPS:
        arm = loop_arm(arm_name, setting, seed)
    else:
        loop = arm_name.split("-")[0]
        if loop not in doses:
            raise SystemExit(f"--arms: {arm_name} follows the dose of {loop}: run {loop} before it (same seeds)")
        arm = open_arm(arm_name, setting, seed, doses[loop])
    if ON:
        arm.callbacks.insert(0, Underneath(STANDARD[ON[0]]()))
    return arm


def fit(
    arm_name: str,
    setting: Setting,
    seed: int,
    epochs: int,
    doses: dict[str, Any],
    accelerator: str = "cpu",
    keep: list[Arm] | None = None,
) -> tuple[nn.Module, dict]:
    """Train ``arm_name`` from scratch.

    Args:
        arm_name: one of ``ARMS``; a control (``<loop>-open``, ``hda-pgd``) after its loop, same seed.
        setting: the data and network.
        seed: seeds the weights, the shuffles and every callback.
        epochs: training epochs.
        doses: the doses loops recorded in this seed (a loop adds its own; a control reads its loop's, the call's
            control ``--dose_from``'s file's where given).
        accelerator: ``"cpu"`` or ``"gpu"``.
        keep: when given, receives the arm (its callbacks, banks and guides) for a look after the fit.

    Returns:
        The trained model and its record: fit seconds, warnings, thread count, accelerator, machine, epochs, the flags
        other than the defaults that reached the arm (``options``, :func:`given_options`), dose, rows replayed.
    """
    L.seed_everything(seed, verbose=False)
    arm = make_arm(arm_name, setting, seed, doses)
    if keep is not None:
        keep.append(arm)
    model = Classifier(setting.make_net(), setting.preprocess, arm.augment, setting.cosine)
    train = DataLoader(TensorDataset(*setting.train), batch_size=64, shuffle=True)
    masks = () if setting.val_masks is None else (setting.val_masks,)  # third in a batch: relevancy's masks
    val = DataLoader(TensorDataset(*setting.val, *masks), batch_size=100)
    root = tempfile.mkdtemp(prefix="dlguard-closed-loop-")
    trainer = L.Trainer(
        max_epochs=epochs, accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=root,
        callbacks=arm.callbacks,
    )  # fmt: skip
    started, spent = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, train, val)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - spent
    shutil.rmtree(root, ignore_errors=True)
    said = sorted(
        {str(w.message)[:160] for w in caught if "dlguard" in str(w.filename) or "Callback" in str(w.message)}
    )
    # CPU fits differ with the thread count (a plain fit by a point of mCA) and from machine to machine (plain's
    # seed 3 by 2.3 points of mCA on an AMD EPYC with torch 2.14.1 against its record of an earlier session's
    # machine, which records did not name before 2026-12-01): the record says how many threads it had and where
    # the wall time grows with what else runs on the machine; the CPU time this process spent (every thread of
    # it) does not, so fits that shared a machine unevenly compare by it (recorded from 2026-12-02)
    record = {"seconds": seconds, "cpu_seconds": cpu_seconds, "warnings": said, "threads": torch.get_num_threads(),
              "accelerator": accelerator, "machine": machine(accelerator), "epochs": epochs}  # fmt: skip
    if isinstance(arm.callbacks[0] if arm.callbacks else None, Underneath):  # make_arm put it under the arm
        record["on"] = ON[0]
    if arm_name == "dlguard":  # its loops in their order, named in the tables (before 2026-11-29: --combine only)
        record["combine"] = combined_loops(setting)
    if options := given_options(arm_name, setting):  # flags other than the defaults: the tables name them
        record["options"] = options
    if arm.dose is not None:
        record["dose"] = arm.dose.record()
        doses[arm_name] = record["dose"]
    controls = [c for c in arm.callbacks if isinstance(c, OpenLoop)]
    if arm_name == LIBRARY_CONTROL:  # as the call's LibraryDose records it: each stand-in's deposits, the guides'
        cases = {c.origin: c.deposited for c in controls if c.bank is not None}
        guide = next(c for c in controls if c.origin == "robustness")
        padding = next(c for c in controls if isinstance(c.guide, ScoreGuidedPadding))
        record["dose"] = {"origins": cases, "strength": guide.applied, "padding_p": float(padding.guide.p)}
        if padding.applied:  # --control_padding schedule: its p in each epoch, as the call's dose holds the call's
            record["dose"]["guides"] = {"dscore": padding.applied}
    elif controls and arm.dose is None:  # a control; a loop's own OpenLoop (--combine padding) has no dose to give
        record["dose"] = {"deposits": controls[0].deposited, "strength": controls[0].applied}
    if arm_name in CALLS:  # its KeepOriginals' rows, as anchor.py records its own keeper's
        record["anchored"] = next(c for c in arm.callbacks if isinstance(c, KeepOriginals)).appended
    replays = [c for c in arm.callbacks if isinstance(c, FailureReplay)]
    if replays:
        record["replayed"] = replays[0].replayed
    return model, record


def arms_for(setting: Setting, arms: list[str] | None, combine: list[str]) -> list[str]:
    """The arms to run: ``arms`` as given, or every arm the setting has (object relevancy's need masks).

    Refuses, before any fit, what ``--arms``, ``--combine`` and ``--dose_from`` cannot run on ``setting``.
    """
    _one_padding(combine)
    if setting.val_masks is None:  # no objects to move: object relevancy's arms (and cases) are the scenes'
        asked = [f"--arms {arm}" for arm in arms or [] if arm.startswith("relevancy")]
        asked += [f"--combine {loop}" for loop in combine if loop == "relevancy"]
        if DOSE_FROM and any(any(dose["origins"].get("relevancy", {}).values()) for dose in DOSE_FROM[0][1].values()):
            asked.append(f"--dose_from {DOSE_FROM[0][0]} (its relevancy cases)")
        if asked:
            raise SystemExit(f"{', '.join(asked)}: needs scenes with object masks (--setting scenes or spurious)")
    return arms or [arm for arm in ARMS if setting.val_masks is not None or not arm.startswith("relevancy")]


def given_options(arm_name: str, setting: Setting) -> dict[str, Any]:
    """The flags other than their defaults that change ``arm_name``'s fit, as its record keeps them (``options``).

    A loop's are its callback's, its guide's and, where it has one, its bank's and replay's; a control's are
    its loop's (it follows the loop's dose) and, where it has a guide, ``--control_draws`` (the call's control:
    also ``--control_padding schedule`` and ``--dose_from``'s file, whose dose it follows instead; the fill is
    labelled as the call);
    ``dlguard``'s are those of the loops it combines;
    ``oracle``'s its own. Plain training and the standard augmentations take
    none. (``--epochs`` changes every arm alike: the record keeps it apart, and :func:`merge` refuses to mix.)

    Args:
        arm_name: one of ``ARMS``.
        setting: the data (object relevancy's loop is the scenes' only).

    Returns:
        ``{flag: value}``, a callback's own keys sorted (so ``k=50 budget=None`` and ``budget=None k=50`` label
        alike), in JSON's types (lists, not tuples), as a file read back holds them: a run and its file label alike.
    """
    loop, _, variant = arm_name.partition("-")
    guided = (*GUIDED, *(["metamorphic"] if VIOLATION_GUIDE else []))
    flags = {
        "robustness": ["robustness", "guide", "spread", "properties", "replay", "bank"],
        "dscore": ["dscore", "padding"],
        FIXED_PADDING: ["padding"],
        "hda": ["hda", "replay", "bank"],
        "metamorphic": ["metamorphic", *(["violation_guide", "spread"] if VIOLATION_GUIDE else []), "replay", "bank"],
        "relevancy": ["relevancy", "replay", "bank"],
    }
    # only --properties and --call reach the call (and its control); labelled by its presets, except the historic
    # ones (unlabelled, as every record before the presets was), and by --call's arguments
    if loop == LIBRARY:
        presets = list(LIBRARY_PROPERTIES or ROBUSTNESS_PRESETS)
        given = {} if presets == HISTORIC_LIBRARY_PRESETS else {"properties": presets}
        if variant == "open" and CONTROL_DRAWS[0] != "loop":  # the control's guides draw from the global RNG
            given["control_draws"] = CONTROL_DRAWS[0]
        if variant == "open" and CONTROL_PADDING[0] != "rms":  # the control pads on the call's schedule
            given["control_padding"] = CONTROL_PADDING[0]
        if OPTIONS["call"]:
            given["call"] = json.loads(json.dumps(dict(sorted(OPTIONS["call"].items()))))
        if variant == "open" and DOSE_FROM:  # the control followed a dose file, not the call's: never paired with it
            given["dose_from"] = DOSE_FROM[0][0]
        return given
    if loop == "dlguard":
        names = [name for part in combined_loops(setting) for name in flags[part]]
    elif loop in flags:
        names = flags[loop] + (["control_draws"] if variant and loop in guided else [])
    else:
        names = [arm_name] if arm_name in REFERENCES else []
    chosen = {"spread": SPREAD[0] != "cell", "properties": PROPERTIES != ["framework"]}
    chosen |= {"control_draws": CONTROL_DRAWS[0] != "loop", "violation_guide": bool(VIOLATION_GUIDE)}
    values = {"spread": SPREAD[0], "properties": list(PROPERTIES), "control_draws": CONTROL_DRAWS[0]}
    given = {
        name: values.get(name, OPTIONS.get(name))
        for name in dict.fromkeys(names)
        if chosen.get(name, bool(OPTIONS.get(name)))
    }
    return json.loads(json.dumps({k: dict(sorted(v.items())) if isinstance(v, dict) else v for k, v in given.items()}))


def _flags(options: dict[str, Any]) -> str:
    """``options`` as the command line gives them: ``--metamorphic budget=None --spread even``."""
    parts = []
    for name, value in options.items():
        if isinstance(value, dict):
            parts.append(" ".join([f"--{name}", *(f"{key}={given!r}" for key, given in value.items())]))
        else:
            parts.append(" ".join([f"--{name}", *map(str, value if isinstance(value, list) else [value])]))
    return " ".join(parts)


def summarise(results: dict[str, list[dict]]) -> list[str]:
    """The table of every arm that ran (a file a run is still writing lists the arms to come, without runs)."""
    results = {arm: runs for arm, runs in results.items() if runs}
    columns = ("clean", "mCA", "fgsm", "pgd", "violation_rate", "local_robustness", "d_score", "R_g", "shuffled")
    lines = ["| arm | " + " | ".join(columns) + " | fit time |", "|---" * (len(columns) + 2) + "|"]
    for arm, runs in results.items():
        cells = []
        for column in columns:
            values = [r[column] for r in runs if column in r]
            if not values:
                cells.append("–")
                continue
            spread = stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{mean(values):.3f} ± {spread:.3f}")
        lines.append(f"| {_label(arm, runs)} | " + " | ".join(cells) + f" | {_fit_time(runs, results.get('plain'))} |")
    every = [run for runs in results.values() for run in runs]
    where = sorted({_where(run) for run in every})
    if len(where) > 1:  # a merged file: a fit time's ratio mixes machines' loads
        lines.append(f"(fit times from runs with {' and '.join(where)}: their ratios compare only roughly)")
    return lines


def _fit_time(runs: list[dict], plain: list[dict] | None) -> str:
    """An arm's mean fit time over plain's, or its seconds where no plain arm ran.

    ``"1.4x CPU"`` by the CPU time the fits spent where every run of both records it and ran on the CPU (what else
    ran on the machine moves that far less than the wall time; on a GPU it is the host's share alone), else
    ``"2.2x"`` by wall time.
    """
    if not plain:
        return f"{mean(r['seconds'] for r in runs):.1f} s"
    if all("cpu_seconds" in run and run.get("accelerator") == "cpu" for run in [*runs, *plain]):
        return f"{mean(r['cpu_seconds'] for r in runs) / mean(r['cpu_seconds'] for r in plain):.1f}x CPU"
    return f"{mean(r['seconds'] for r in runs) / mean(r['seconds'] for r in plain):.1f}x"


def machine(accelerator: str) -> str:
    """The processor (or GPU), the CPU kernels torch picks and the torch a fit ran on.

    ``"AMD EPYC (AVX2), torch 2.14.1"``; on a GPU ``"<its name> on <the host's>, torch ..."``.
    """
    names = [line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")]
    processor = names[0] if names else platform.processor() or "unknown processor"
    host = f"{processor} ({torch.backends.cpu.get_cpu_capability()})"
    if accelerator == "gpu":
        host = f"{torch.cuda.get_device_name()} on {host}"
    return f"{host}, torch {torch.__version__}"


def _cpuinfo() -> list[str]:
    with contextlib.suppress(OSError):
        return Path("/proc/cpuinfo").read_text().splitlines()
    return []


def _where(run: dict) -> str:
    """Where a run fitted, as far as its record says (files before 2026-11-28 do not; before 2026-12-01 no machine)."""
    if "threads" not in run:
        return "unrecorded threads"
    return f"{run['threads']} thread(s) on {run['accelerator']}" + (f" ({run['machine']})" if "machine" in run else "")


def _label(arm: str, runs: list[dict]) -> str:
    """The arm's name, with the loops it combined in order, the augmentation under it (``--on``) and its flags.

    ``dlguard (metamorphic+hda) on noise [--metamorphic budget=None]``; :func:`merge` keys such runs by it,
    so that one file's ``dlguard`` and another's stay apart. A name that already holds a space is a label already.
    """
    if " " in arm:
        return arm
    combined = {"+".join(run["combine"]) for run in runs if "combine" in run}
    under = {run["on"] for run in runs if "on" in run}
    flags = {_flags(run["options"]) for run in runs if run.get("options")}
    return (
        arm
        + (f" ({'/'.join(sorted(combined))})" if combined else "")
        + (f" on {'/'.join(sorted(under))}" if under else "")
        + (f" [{' / '.join(sorted(flags))}]" if flags else "")
    )


def _base(key: str) -> str:
    """An arm's name without its label: ``metamorphic`` of ``metamorphic on augmix [--metamorphic budget=None]``."""
    return key.split(" ")[0]


def _variant(runs: list[dict]) -> str:
    """What beside its name sets a loop's or a control's runs apart: the augmentation under it and its flags.

    A control's ``--control_draws`` is left out: it says how the control draws, not which loop's dose it follows.
    """
    under = sorted({run["on"] for run in runs if "on" in run})
    options = [{k: v for k, v in run.get("options", {}).items() if k != "control_draws"} for run in runs]
    return json.dumps([under, options[0] if options else {}], sort_keys=True)


OWN_MEASURE = {
    "robustness": ("local_robustness", 1),
    "dscore": ("d_score", 1),
    "hda": ("R_g", 1),
    "metamorphic": ("violation_rate", -1),
    "relevancy": ("shuffled", 1),
}
"""Each loop's own measure in the judge's record, and its direction (1: higher is better, -1: lower)."""


def comparisons(results: dict[str, list[dict]]) -> list[tuple[str, str, list[tuple[str, int]]]]:
    """``(arm, reference, [(measure, direction), ...])`` for the arms in ``results``.

    Each loop against its controls, HDA against plain training under PGD, the call against its control and the
    fill against the call, and ``dlguard``, the call and the fill each against the standard augmentation of the
    best mean mCA, against plain training and against training on the judge's corruptions.
    """
    pairs = [  # a loop and the controls that followed its dose: the same flags, the same augmentation under them
        (loop, control, [("mCA", 1), OWN_MEASURE[_base(loop)]])
        for loop in results
        if _base(loop) in OWN_MEASURE and results[loop]
        for control in results
        if _base(control) in CONTROLS and _base(control).split("-")[0] == _base(loop) and results[control]
        and _variant(results[control]) == _variant(results[loop])
    ]  # fmt: skip
    for hda in [arm for arm in results if _base(arm) == "hda" and results[arm]]:
        if results.get("plain"):  # HDA fine-tuning's promise (papers/002): robustness over plain
            pairs.append((hda, "plain", [("pgd", 1)]))
    standard = [arm for arm in STANDARD if results.get(arm)]
    best = max(standard, key=lambda arm: mean(r["mCA"] for r in results[arm])) if standard else None
    # the call against its control (what detection adds), the fill against the call (random cases in its place)
    against = {LIBRARY: LIBRARY_CONTROL, LIBRARY_FILL: LIBRARY}
    for together in [arm for arm in results if _base(arm) in ("dlguard", LIBRARY, LIBRARY_FILL) and results[arm]]:
        for control in [arm for arm in results if _base(arm) == against.get(_base(together)) and results[arm]]:
            if _variant(results[control]) == _variant(results[together]):
                pairs.append((together, control, [("mCA", 1), ("clean", 1), ("pgd", 1)]))
        if best:
            pairs.append((together, best, [("mCA", 1), ("pgd", 1)]))
        under = {run["on"] for run in results[together] if "on" in run}
        if len(under) == 1 and (on := under.pop()) != best and results.get(on):  # what the loops add to it
            pairs.append((together, on, [("mCA", 1), ("pgd", 1)]))
        if results.get("plain"):
            pairs.append((together, "plain", [("clean", 1), ("pgd", 1)]))
        for oracle in [arm for arm in results if _base(arm) == "oracle" and results[arm]]:  # what there was to gain
            pairs.append((together, oracle, [("mCA", 1)]))
    return pairs


def _same_seeds(runs: list[dict], references: list[dict], measure: str) -> list[tuple[dict, dict]]:
    """Pairs of runs of one seed, both with ``measure``: by ``seed`` where every run has one, else by position."""
    if all("seed" in run for run in runs + references):
        by_seed = {run["seed"]: run for run in references}
        pairs = [(run, by_seed[run["seed"]]) for run in runs if run["seed"] in by_seed]
    else:
        pairs = list(zip(runs, references, strict=False))
    return [(a, b) for a, b in pairs if measure in a and measure in b]


def paired(results: dict[str, list[dict]], extra: Sequence[tuple[str, str]] = ()) -> list[str]:
    """Seed-by-seed differences: mean ± standard error over the seeds both arms ran, and the seeds won.

    Runs are paired by their ``seed``; files written before runs recorded it pair the i-th runs (``main``
    runs every arm of a seed before the next seed). ``extra`` pairs ``(arm, reference)`` (``--pair``) follow
    :func:`comparisons`' on clean accuracy, mCA and PGD; a measure of a pair already shown is not repeated.
    """
    for arm in {name for pair in extra for name in pair} - set(results):
        raise SystemExit(f"--pair: no arm {arm!r} in the results; they hold {list(results)}")
    chosen = [*comparisons(results), *((a, b, [("clean", 1), ("mCA", 1), ("pgd", 1)]) for a, b in extra)]
    lines = ["| arm − reference | measure | mean difference ± s.e. | seeds better |", "|---|---|---|---|"]
    shown: set[tuple[str, str, str]] = set()
    for arm, reference, measures in chosen:
        for measure, direction in measures:
            diffs = [a[measure] - b[measure] for a, b in _same_seeds(results[arm], results[reference], measure)]
            if not diffs or (arm, reference, measure) in shown:  # a --pair that repeats a comparison adds no row
                continue
            shown.add((arm, reference, measure))
            error = stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
            better = sum(direction * d > 0 for d in diffs)
            arrow = " ↓" if direction < 0 else ""
            difference = f"{mean(diffs):+.3f} ± {error:.3f}"
            name, against = _label(arm, results[arm]), _label(reference, results[reference])
            lines.append(f"| {name} − {against} | {measure}{arrow} | {difference} | {better} of {len(diffs)} |")
    return lines


def _judged(run: dict) -> dict:
    """A run's figures without its wall time, the warnings that name it and where it ran: what a rerun repeats."""
    return {key: value for key, value in run.items() if key not in _WHERE}


_WHERE = ("seconds", "cpu_seconds", "warnings", "threads", "accelerator", "machine")
"""What a run's record says of its fit's wall time and where it ran, which a rerun elsewhere does not repeat."""


def merge(files: list[dict[str, list[dict]]]) -> dict[str, list[dict]]:
    """One ``{arm: [runs]}`` of several files (one process per seed or per arm).

    Args:
        files: the files' contents, each ``{arm: [runs]}`` as ``--out`` writes it.

    Returns:
        Every arm's runs, arms in ``ARMS`` order, runs sorted by ``seed``. An arm trained on top of a standard
        augmentation (``--on``), combining loops (every ``dlguard`` run from 2026-11-29, before only under
        ``--combine``) or with flags other than the defaults (``options``) is its own arm, keyed by its label,
        ``"dlguard (metamorphic+hda) on noise"`` or ``"metamorphic [--metamorphic budget=None]"``, beside
        ``"dlguard"`` or ``"metamorphic"`` of another file.
        A seed that an arm ran in two files is kept once when the two runs judged alike (every figure but the
        fit time: a rerun of the same deterministic run) and refused otherwise; runs without a ``seed`` (files
        written before runs recorded it) keep their order, and the same such file merged twice is not noticed.
        Runs of different ``epochs`` are refused (files before 2026-11-28 do not record them; every run quoted
        in ``docs/closed_loop.md`` trained 6).
    """
    merged: dict[str, list[dict]] = {}
    for results in files:
        for arm, runs in results.items():
            key = _label(arm, runs)
            kept = merged.setdefault(key, [])
            for run in runs:
                twin = next((k for k in kept if "seed" in run and k.get("seed") == run["seed"]), None)
                if twin is None:
                    kept.append(run)
                elif _judged(twin) != _judged(run):
                    where = sorted({_where(r) for r in (twin, run)})
                    why = f" (the runs had {' and '.join(where)})" if len(where) > 1 else ""
                    raise SystemExit(
                        f"--results: arm {key} ran seed {run['seed']} in more than one file, judged otherwise{why}"
                    )
    epochs = sorted({run["epochs"] for runs in merged.values() for run in runs if "epochs" in run})
    if len(epochs) > 1:  # every arm of a table trains alike: a run of other epochs is another benchmark
        raise SystemExit(f"--results: the files' runs trained {' and '.join(map(str, epochs))} epochs; merge one")
    for runs in merged.values():
        seeds = [run["seed"] for run in runs if "seed" in run]
        if len(seeds) == len(runs):
            runs.sort(key=lambda run: run["seed"])
    order = {arm: index for index, arm in enumerate(ARMS)}
    return dict(sorted(merged.items(), key=lambda item: order.get(_base(item[0]), len(order))))


PRINTED = {"clean": "clean", "mCA": "mCA", "fgsm": "fgsm", "pgd": "pgd", "violation_rate": "viol",
           "local_robustness": "LR", "d_score": "D", "R_g": "R_g", "shuffled": "shuffled"}  # fmt: skip
"""A run's figures in its progress line, by their short names (those its judge measured)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setting", choices=tuple(SETTINGS), default="mnist")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=None, help="default: every arm the setting has")
    parser.add_argument("--out", type=Path, default=None, help="JSON file of every run's figures")
    parser.add_argument(
        "--combine", nargs="+", choices=(*LOOPS[:-1], FIXED_PADDING), default=[],
        help=f"the dlguard arm's loops, in the order they transform a batch ({FIXED_PADDING}: D-Score's, fixed p)",
    )  # fmt: skip
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu", help="where fits and judging run")
    parser.add_argument("--spread", choices=SPREADS, default="cell", help="what the loops' guides keep of a proposal")
    parser.add_argument(
        "--control_draws", choices=("loop", "global"), default="loop",
        help="a control's guide draws as its loop's guide does (loop) or from the global RNG (global, runs before it)",
    )  # fmt: skip
    parser.add_argument(
        "--control_padding", choices=("rms", "schedule"), default="rms",
        help=f"{LIBRARY_CONTROL} pads at the root mean square of the call's p from the first epoch (rms) or at the "
        "call's p in each epoch (schedule)",
    )  # fmt: skip
    parser.add_argument(
        "--properties", nargs="+", choices=tuple(PROPERTY_PRESETS), default=None,
        help="the robustness loop's property presets (their union; a repeated name keeps the first preset's); "
        f"default framework, for {LIBRARY} the call's own ({' '.join(ROBUSTNESS_PRESETS)})",
    )  # fmt: skip
    parser.add_argument(
        "--on", choices=tuple(STANDARD), default=None,
        help="the standard augmentation every loop and control arm trains on top of (applied first)",
    )  # fmt: skip
    parser.add_argument(
        "--dose_from", type=Path, default=None, metavar="FILE",
        help=f"{LIBRARY_CONTROL} follows the dose in FILE (a call's recorded dose; or one per seed, under 'seeds') "
        "in every seed, not the call's run",
    )  # fmt: skip
    parser.add_argument(
        "--judge", choices=("all", "goal"), default="all",
        help="goal: clean accuracy, mCA, FGSM, PGD (and shuffled) only, without the detectors' own measures",
    )  # fmt: skip
    parser.add_argument(
        "--results", type=Path, nargs="+", default=None,
        help="print the tables of JSON files --out wrote (several: merged, and written to --out if given)",
    )  # fmt: skip
    parser.add_argument(
        "--pair", nargs=2, action="append", default=[], metavar=("ARM", "REFERENCE"),
        help="with --results: pair these two arms seed by seed too, named as in the tables: 'dlguard (hda) on noise'",
    )  # fmt: skip
    for name in OPTIONS:
        parser.add_argument(f"--{name}", nargs="*", default=None, metavar="KEY=VALUE", help=f"{name}'s arguments")
    args = parser.parse_args()
    if args.results and args.dose_from:
        raise SystemExit("--dose_from: a fit's flag; --results only reads the runs of files")
    if args.results:
        results = merge([json.loads(path.read_text()) for path in args.results])
        tables = [*summarise(results), "", *paired(results, [tuple(pair) for pair in args.pair])]  # checks --pair
        if args.out:  # only once every --pair names an arm: a mistyped one leaves the file as it was
            args.out.write_text(json.dumps(results, indent=1))
        print("\n".join(tables))
        return
    COMBINED[:] = args.combine
    SPREAD[:] = [args.spread]
    CONTROL_DRAWS[:] = [args.control_draws]
    CONTROL_PADDING[:] = [args.control_padding]
    PROPERTIES[:] = args.properties or ["framework"]
    LIBRARY_PROPERTIES[:] = args.properties or []
    JUDGED[:] = [args.judge]
    ON[:] = [args.on] if args.on else []
    VIOLATION_GUIDE[:] = [] if args.violation_guide is None else [True]  # the flag alone: the guide's defaults
    for name, given in OPTIONS.items():
        for option in getattr(args, name) or []:
            key, _, value = option.partition("=")
            given[key] = ast.literal_eval(value)
        try:  # each run's record keeps the flags: refuse now what JSON cannot hold, not after a fit
            json.dumps(given)
        except TypeError as error:
            raise SystemExit(f"--{name}: {error}; give numbers, strings, None, lists or dicts") from None
    check_call(OPTIONS["call"])
    dose_from = args.dose_from
    DOSE_FROM[:] = [] if dose_from is None else [(dose_from.name, read_doses(dose_from, args.epochs, args.seeds))]
    if DOSE_FROM and args.arms is not None and LIBRARY_CONTROL not in args.arms:
        raise SystemExit(f"--dose_from: only {LIBRARY_CONTROL} follows a dose file; name it in --arms")
    if CONTROL_PADDING != ["rms"] and args.arms is not None and LIBRARY_CONTROL not in args.arms:
        raise SystemExit(f"--control_padding: only {LIBRARY_CONTROL} pads on the call's schedule; name it in --arms")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    setting = SETTINGS[args.setting]()
    args.arms = arms_for(setting, args.arms, args.combine)
    started = time.perf_counter()
    device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
    corrupted = {name: levels.to(device) for name, levels in corrupt(setting.test[0]).items()}
    distribution = PCADistribution().fit(setting.train[0][:2000]).to(device)
    sizes = f"{len(setting.train[1])} training, {len(setting.val[1])} validation, {len(setting.test[1])} test inputs"
    print(f"{args.setting}: {sizes}; corruptions made in {time.perf_counter() - started:.0f} s", flush=True)
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for seed in args.seeds:
        doses: dict[str, Any] = {}
        for arm in args.arms:
            model, record = fit(arm, setting, seed, args.epochs, doses, args.accelerator)
            record["seed"] = seed
            record.update(judge(model, setting, corrupted, distribution))
            results[arm].append(record)
            extra = f", replayed {record['replayed']}" if "replayed" in record else ""
            figures = " ".join(f"{short} {record[key]:.3f}" for key, short in PRINTED.items() if key in record)
            print(f"seed {seed} {arm:>16}: {figures} {record['seconds']:.0f} s{extra}", flush=True)
            for said in record["warnings"]:
                print(f"    warned: {said}")
            if args.out:
                args.out.write_text(json.dumps(results, indent=1))
    print("\n".join([*summarise(results), "", *paired(results)]))


if __name__ == "__main__":
    main()
