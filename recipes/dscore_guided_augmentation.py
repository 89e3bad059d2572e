"""The D-Score paper's Table VI and Fig. 7 on the embedded MNIST: does score-guided padding help, at the right ``p``?

Trains ``mnist_a`` with the same epochs and seeds -- no augmentation, random padding + resize
(RPR, the paper's Table II baseline) and score-guided padding driven by ``DScoreCallback``
(n = 3, t = 5) in two ways: ``score-guided``, ``p`` following every epoch's measurement (the
default, ``p_from="latest"``), and ``score-guided, held``, ``p`` measured once on the model
trained unpadded for the first 5 of 15 epochs and held (``p_from="unpadded", start_epoch=4``) --
then measures every final model on the 1,000 validation digits: per-region translated accuracy
``a_i``, feature distribution ``f̃_i``, ``v_robust``, ``v_fitness``, D-Score and clean accuracy.
Run from the repository root::

    python recipes/dscore_guided_augmentation.py                 # 3 seeds, 15 epochs (~5 min, 2 CPU cores)
    python recipes/dscore_guided_augmentation.py --seeds 0 --epochs 3

``--sweep`` adds the paper's Fig. 7: padding at a constant ``p`` (``ScoreGuidedPadding(p)``, the
same ``p`` as probability and ratio) over a grid of ``p``, and the paper's own procedure, ``p =
clip(v_robust / g(n), 0, 1)`` measured on the model trained 15 epochs without augmentation and
held for a second training from scratch (``paper's p``), and the callback holding the ``p`` of
its first measurement, after one epoch (``score-guided, held at once``). Fig. 7 claims that the
paper's ``p`` lands where D-Score turns from rising to falling; the table names the grid's best
``p`` and where the paper's and the callback's lie, each by the mean ``p`` of the epochs it padded::

    python recipes/dscore_guided_augmentation.py --sweep          # + 12 methods x 3 seeds (~20 min more)

Writes ``results.json`` and ``results.md`` into ``--out`` (default ``dlguard-runs/dscore-table-vi``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from dlguard.augment import ScoreGuidedPadding
from dlguard.augment.functional import pad_resize
from dlguard.callbacks import DScoreCallback
from dlguard.data import MNISTDataModule
from dlguard.generate import dscore_test
from dlguard.metrics import DScore
from dlguard.zoo import ClassifierModule, mnist_a

N, T = 3, 5
LOOPS = {  # the callback's ways to set p: (p_from, start_epoch)
    "score-guided": ("latest", 0),  # the default: p from every epoch's measurement
    "score-guided, held": ("unpadded", 4),  # the paper's protocol in one fit: 5 of 15 epochs unpadded, then held
    "score-guided, held at once": ("unpadded", 0),  # held from the first epoch's model (--sweep only)
}


class RandomPaddingResize(Callback):
    """RPR: every training image padded by a random ratio in ``[0, max_ratio]``, split at random."""

    def __init__(self, max_ratio: float = 1.0) -> None:
        self.max_ratio = max_ratio

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        images = batch[0]
        size, height, width = len(images), images.shape[-2], images.shape[-1]
        ratio = torch.rand(size, device=images.device) * self.max_ratio
        left = torch.rand(size, device=images.device) * ratio * width
        top = torch.rand(size, device=images.device) * ratio * height
        with torch.no_grad():
            images.copy_(pad_resize(images, ratio, left, top))


class ConstantPadding(Callback):
    """Fig. 7's arms: every training batch through ``ScoreGuidedPadding(p)`` at a ``p`` held for the whole fit."""

    def __init__(self, p: float) -> None:
        self.pad = ScoreGuidedPadding(p=p)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        with torch.no_grad():
            batch[0].copy_(self.pad(batch[0]))


def applied_p(history: list[dict[str, Any]], epochs: int) -> list[float]:
    """The ``p`` the callback's guide padded each epoch with: 0 until a fit's validation set it, then that ``p``.

    Read from what the callback logged (``dscore/guide_p``, the guide's ``p`` after each fit
    measurement, held or not), so epoch ``e`` pads with the ``p`` logged at the last validation
    before it.
    """
    logged = {r["epoch"]: r["logged"]["dscore/guide_p"] for r in history if "dscore/guide_p" in r.get("logged", {})}
    applied, current = [], 0.0
    for epoch in range(epochs):
        applied.append(current)
        current = logged.get(epoch, current)
    return applied


def train(
    method: str, seed: int, epochs: int, out: Path, p: float | None = None
) -> tuple[ClassifierModule, list[float]]:
    """The trained module and the ``p`` each epoch padded with (none and RPR: 0; a loop: 0 until it measured)."""
    L.seed_everything(seed, workers=True, verbose=False)
    callbacks: list[Callback] = []
    if method == "RPR":
        callbacks.append(RandomPaddingResize())
    guided = None
    if method in LOOPS:
        p_from, start_epoch = LOOPS[method]
        guided = DScoreCallback(
            n=N,
            t=T,
            probe_size=500,
            guide=ScoreGuidedPadding(),
            p_from=p_from,
            start_epoch=min(start_epoch, epochs - 1),
            seed=seed,
        )
        callbacks.append(guided)
    if p is not None:
        callbacks.append(ConstantPadding(p))
    module = ClassifierModule(mnist_a(), num_classes=10)
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        devices=1,
        default_root_dir=out,
    )
    trainer.fit(module, datamodule=MNISTDataModule(batch_size=64, seed=0))
    if guided is not None:
        return module, applied_p(guided.history, epochs)
    return module, [0.0] * epochs if p is None else [p] * epochs


def evaluate(module: ClassifierModule) -> dict[str, Any]:
    dm = MNISTDataModule(batch_size=1000)
    dm.setup()
    images, target = next(iter(dm.val_dataloader()))
    run = dscore_test(module, images, target, n=N, t=T)
    metric = DScore(N, run.num_classes)
    metric.update(run.logits, run.mutant_logits, run.translated_logits, run.target)
    result = metric.compute()
    return {
        "clean_acc": float(result.baseline_accuracy),
        "a_i": result.translation_accuracy.tolist(),
        "f_i": result.feature_distribution.tolist(),
        "v_robust": float(result.v_robust),
        "v_fitness": float(result.v_fitness),
        "d_score": float(result.d_score),
        "score_p": float(result.augment_probability),  # clip(v_robust / g(n), 0, 1): the p this model calls for
    }


def grid(values: list[float]) -> str:
    return "<br>".join(" ".join(f"{100 * v:5.1f}" for v in values[r * N : (r + 1) * N]) for r in range(N))


def mean_std(rows: list[dict[str, Any]], key: str) -> str:
    values = [row[key] for row in rows]
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {spread:.4f}"


def _padding(runs: list[dict[str, Any]]) -> tuple[float, float]:
    """Mean ``p`` over the epochs that padded, and how many epochs did, averaged over the runs."""
    while_padding = [statistics.mean([q for q in r["p_per_epoch"] if q > 0] or [0.0]) for r in runs]
    epochs = [sum(q > 0 for q in r["p_per_epoch"]) for r in runs]
    return statistics.mean(while_padding), statistics.mean(epochs)


def fig7(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Fig. 7's table: D-Score against the padding's ``p``, the grid's best ``p``, and where the score's ``p`` lie."""
    rows = sorted(
        ((*_padding(runs), method, runs) for method, runs in results.items() if method != "RPR"),
        key=lambda row: row[0],
    )
    grid_rows = [row for row in rows if row[2] == "none" or row[2].startswith("p = ")]
    best_p, _, best_method, best_runs = max(grid_rows, key=lambda row: statistics.mean(r["d_score"] for r in row[3]))
    lines = [
        "| training | p while padding | epochs padded | v_robust ↓ | v_fitness ↑ | D-Score ↑ | clean accuracy |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p, epochs, method, runs in rows:
        name = f"**{method}** (the grid's best)" if method == best_method else method
        lines.append(
            f"| {name} | {p:.2f} | {epochs:.0f} | {mean_std(runs, 'v_robust')} | {mean_std(runs, 'v_fitness')} | "
            f"{mean_std(runs, 'd_score')} | {mean_std(runs, 'clean_acc')} |"
        )
    best = statistics.mean(r["d_score"] for r in best_runs)
    lines += ["", f"The grid's best D-Score is {best:.4f}, at p = {best_p:.2f}."]
    for method in ("paper's p", *LOOPS):
        if method in results:
            runs = results[method]
            score, (p, epochs) = statistics.mean(r["d_score"] for r in runs), _padding(runs)
            per_seed = ", ".join(f"{_padding([r])[0]:.2f}" for r in runs)
            lines.append(
                f"{method}: p {p:.2f} while padding ({per_seed} over the seeds; {epochs:.0f} epochs padded), "
                f"D-Score {score:.4f} ({score - best:+.4f} against the grid's best)."
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument(
        "--sweep",
        type=float,
        nargs="*",
        default=None,
        metavar="P",
        help="Fig. 7: constant p to pad with (default 0.1 0.2 ... 1.0), and the paper's p",
    )
    parser.add_argument("--out", type=Path, default=Path("dlguard-runs/dscore-table-vi"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sweep = None if args.sweep is None else (args.sweep or [round(0.1 * i, 1) for i in range(1, 11)])

    results: dict[str, list[dict[str, Any]]] = {}

    def run(method: str, seed: int, p: float | None = None) -> dict[str, Any]:
        module, applied = train(method, seed, args.epochs, args.out, p)
        row = evaluate(module)
        results.setdefault(method, []).append({"seed": seed, "p_per_epoch": applied, **row})
        print(f"{method:>12} seed {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items() if isinstance(v, float)))
        return row

    for seed in args.seeds:
        unaugmented = run("none", seed)
        run("RPR", seed)
        run("score-guided", seed)
        run("score-guided, held", seed)
        if sweep is not None:
            run("score-guided, held at once", seed)
            run("paper's p", seed, p=unaugmented["score_p"])  # the paper: p from the trained model, held
            for p in sweep:
                run(f"p = {p:g}", seed, p=p)

    lines = [
        f"mnist_a, embedded MNIST (4,000 train / 1,000 validation), {args.epochs} epochs, n = {N}, t = {T}, "
        f"seeds {args.seeds}; mean ± std over seeds; a_i and f̃_i (in %) from the first seed, grid rows top to bottom.",
        "",
        "| training | a_i (%) | f̃_i (%) | v_robust ↓ | v_fitness ↑ | D-Score ↑ | clean accuracy |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method in ("none", "RPR", "score-guided", "score-guided, held"):
        rows = results[method]
        first = rows[0]
        lines.append(
            f"| {method} | {grid(first['a_i'])} | {grid(first['f_i'])} | {mean_std(rows, 'v_robust')} | "
            f"{mean_std(rows, 'v_fitness')} | {mean_std(rows, 'd_score')} | {mean_std(rows, 'clean_acc')} |"
        )
    if sweep is not None:
        lines += [
            "",
            "Fig. 7: padding at a constant p (probability and ratio), same epochs and seeds.",
            "",
            *fig7(results),
        ]
    table = "\n".join(lines)
    print("\n" + table)
    (args.out / "results.md").write_text(table + "\n")
    (args.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
