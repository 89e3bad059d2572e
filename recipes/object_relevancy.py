"""Object relevancy's questions on digit scenes: a clean model and a spurious-background model of one architecture.

    python recipes/object_relevancy.py [--epochs 8] [--probe 500] [--budget 100] [--pairs 50] [--tune-epochs 20]

Scenes: the embedded MNIST digits composited on photo crops and textures (``SceneDataModule``,
32x32 RGB). The *clean* model is trained on scenes whose background kind is independent of the
label; the *spurious* model (same architecture, ``mnist_b`` on 3 channels) on scenes whose
background kind is the label's own (``spurious=1``): a planted defect, the background alone
predicts the label.

1. Relevancy: each model's ``--probe`` validation scenes of its own distribution, with 22
   follow-ups each (4 backgrounds): mean ``S``, ``S⁺``, ``S⁻``, the share of its correct
   inferences flagged unreliable (paper: 5.3–6.7 % of correct ImageNet inferences for normal
   models), accuracy on scenes with shuffled backgrounds, the distributions of ``S``.
2. The guided transplant attack against random selection, both scenarios, ``--pairs`` random
   ordered class pairs × ``--budget`` synthesised images each (paper, ResNet-152 on ImageNet:
   3,310 vs 1,800 successes in scenario 1, 1,288 vs 629 in scenario 2).
3. Feedback: the spurious model fine-tuned ``--tune-epochs`` epochs on its own scenes with
   ``ObjectRelevancyCallback(bank=...)`` (follow-ups on one background of each of the ten kinds; each
   unreliable scene's digit deposited on ten backgrounds drawn anew at every measurement) +
   ``FailureReplay`` (each failure about once an epoch, at most half a batch) against the same
   fine-tuning without the callbacks, and the clean model fine-tuned on clean scenes with the same
   callbacks: relevancy and accuracy on shuffled-background scenes, apart for the first 512
   validation digits (where fine-tuning's validation, and so the probe set, draws from) and the
   others, which no callback sees.

Writes results.md, results.json and pictures (distributions, gallery, attack examples) into --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure
from torch import Tensor
from torch.nn import Module

from dlguard.augment import FollowUps, object_follow_ups
from dlguard.callbacks import FailureReplay, ObjectRelevancyCallback
from dlguard.data import FailureBank, SceneDataModule, Scenes, scene_backgrounds
from dlguard.generate import object_relevancy_test, transplant_attack
from dlguard.metrics.functional import unreliable
from dlguard.report import plot_image_grid
from dlguard.zoo import ClassifierModule, mnist_b

PAPER_UNRELIABLE = (0.053, 0.067)
PAPER_ATTACK = {1: (3310, 1800), 2: (1288, 629)}  # (guided, random) successes, 50 pairs x 100 images
BACKGROUND_KINDS = (0, 1, 2, 5)  # the callback's default: two photo crops, two textures
PROBED = 512  # fine-tuning validates on the first 512 validation scenes; the other 488 digits no callback sees


def quiet_trainer(
    epochs: int, callbacks: list[L.Callback] | None = None, root: Path | None = None, **options: Any
) -> L.Trainer:
    L.seed_everything(0, verbose=False)
    return L.Trainer(
        **options,
        default_root_dir=root,
        max_epochs=epochs,
        callbacks=callbacks or [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
    )


def train(spurious: float, epochs: int) -> ClassifierModule:
    L.seed_everything(0, verbose=False)
    module = ClassifierModule(mnist_b(in_channels=3, input_size=32), lr=1e-3)
    quiet_trainer(epochs).fit(module, datamodule=SceneDataModule(spurious=spurious, batch_size=64))
    return module.eval()


def unseen_accuracy(model: Module, scenes: Scenes) -> dict[str, float]:
    """Accuracy on the first :data:`PROBED` scenes (fine-tuning's probe digits) and on the others, apart."""
    return {
        "shuffled_probed": accuracy(model, scenes.images[:PROBED], scenes.labels[:PROBED]),
        "shuffled_unseen": accuracy(model, scenes.images[PROBED:], scenes.labels[PROBED:]),
    }


def accuracy(model: Module, images: Tensor, labels: Tensor) -> float:
    with torch.no_grad():
        return float((model.eval()(images).argmax(1) == labels).float().mean())


def shuffled(scenes: Scenes, seed: int = 1) -> Scenes:
    """The same digits on backgrounds of random kinds, independent of the labels."""
    kinds = torch.randint(10, (len(scenes),), generator=torch.Generator().manual_seed(seed))
    return scenes.with_backgrounds(kinds, seed=seed)


def relevancy(model: Module, scenes: Scenes, follow_ups: FollowUps, count: int) -> dict[str, Any]:
    images, labels = scenes.images[:count], scenes.labels[:count]
    run = object_relevancy_test(model, images, labels, follow_ups)
    flagged = unreliable(run.scores)
    correct = run.scores.correct
    return {
        "run": run,
        "score": float(run.scores.score.mean()),
        "preserving": float(run.scores.preserving.mean()),
        "removing": float(run.scores.removing.mean()),
        "accuracy": float(correct.float().mean()),
        "unreliable_rate": float(flagged.sum() / correct.sum()),
        "unreliable": int(flagged.sum()),
        "correct": int(correct.sum()),
        "flagged": flagged,
    }


def distributions_figure(rows: dict[str, dict[str, Any]]) -> Figure:
    figure = Figure(figsize=(5.5, 3.0), layout="tight")
    ax = figure.subplots()
    bins = torch.linspace(0, 1, 21).tolist()
    for name, row in rows.items():
        ax.hist(row["run"].scores.score.tolist(), bins=bins, alpha=0.6, label=f"{name} (mean {row['score']:.2f})")
    ax.axvline(0.5, color="black", linestyle="--", linewidth=1, label="s_low = 0.5")
    ax.set_xlabel("object relevancy S of an inference")
    ax.set_ylabel("inferences")
    ax.legend(fontsize=8)
    return figure


def gallery_figure(row: dict[str, Any], images: Tensor, count: int = 4) -> Figure:
    """Flagged inferences, each with its two follow-ups that changed the inference most."""
    run = row["run"]
    chosen = row["flagged"].nonzero().squeeze(1)
    chosen = chosen[run.scores.score[chosen].argsort()[:count]]
    probabilities = torch.softmax(run.follow_up_logits.float(), dim=-1)
    shown, captions = [], []
    for i in chosen.tolist():
        label = int(run.logits[i].argmax())
        shown.append(images[i])
        captions.append(f"y={label} p={float(run.scores.probability[i]):.2f} S={float(run.scores.score[i]):.2f}")
        change = (probabilities[i, :, label] - float(run.scores.probability[i])).abs()
        for f in change.argsort(descending=True)[:3].tolist():
            shown.append(run.follow_ups.inputs[i, f])
            name = run.follow_ups.operation[f].replace("ObjectTo", "").replace("Object", "")
            captions.append(f"{name[:18]} → {int(run.follow_up_logits[i, f].argmax())}")
    return plot_image_grid(torch.stack(shown), captions, columns=4)


def attack_table(model: Module, scenes: Scenes, row: dict[str, Any], budget: int, pairs: Tensor) -> dict[str, Any]:
    count = len(row["flagged"])
    images, labels, masks = scenes.images[:count], scenes.labels[:count], scenes.masks[:count]
    out: dict[str, Any] = {}
    for scenario in (1, 2):
        for strategy in ("guided", "random"):
            start = time.perf_counter()
            result = transplant_attack(model, images, labels, masks, row["run"].scores, scenario=scenario,
                                       strategy=strategy, pairs=pairs, budget=budget)  # fmt: skip
            out[f"{scenario}/{strategy}"] = {
                "successes": int(result.successes.sum()),
                "attempts": int(result.attempts.sum()),
                "pairs_won": None,
                "seconds": time.perf_counter() - start,
                "per_pair": result.successes.tolist(),
                "result": result,
            }
        guided, random = out[f"{scenario}/guided"]["per_pair"], out[f"{scenario}/random"]["per_pair"]
        out[f"{scenario}/guided"]["pairs_won"] = sum(g > r for g, r in zip(guided, random, strict=True))
        out[f"{scenario}/random"]["pairs_won"] = sum(r > g for g, r in zip(guided, random, strict=True))
    return out


def fine_tune(
    model: ClassifierModule, epochs: int, probe: int, replay: bool, root: Path, spurious: float = 1.0
) -> tuple[ClassifierModule, list]:
    """Fine-tune on the model's own scenes (``spurious``), with or without the relevancy feedback.

    With ``replay`` the callback measures with follow-ups on backgrounds of all ten kinds (one each), deposits
    each unreliable inference's object on ten backgrounds drawn anew per measurement, and ``FailureReplay``
    replays each about once an epoch, at most half of a training batch.
    """
    tuned = copy.deepcopy(model).train()
    callbacks: list[L.Callback] = []
    history: list = []
    if replay:
        feedback = FailureReplay(bank=FailureBank(capacity=10 * probe), fraction=0.5)
        backgrounds, _ = scene_backgrounds(10, 32, kinds=list(range(10)), seed=1)
        callback = ObjectRelevancyCallback(
            probe_size=probe,
            backgrounds=backgrounds,
            bank=feedback.bank,
            budget=None,  # a study: every epoch
        )
        callbacks = [callback, feedback]
        history = callback.history
    # validation (where the probe set is drawn) sees the first PROBED scenes only: the rest stay unseen
    trainer = quiet_trainer(epochs, callbacks, root, limit_val_batches=PROBED // 64)
    trainer.fit(tuned, datamodule=SceneDataModule(spurious=spurious, batch_size=64))
    return tuned.eval(), [
        {"epoch": r["epoch"], **{k.split("/")[1]: round(v, 4) for k, v in r["logged"].items()}} for r in history
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--probe", type=int, default=500)
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--tune-epochs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("dlguard-runs/object_relevancy"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    data = {name: SceneDataModule(spurious=s) for name, s in (("clean", 0.0), ("spurious", 1.0))}
    for module in data.values():
        module.setup()
    models = {name: train(s, args.epochs) for name, s in (("clean", 0.0), ("spurious", 1.0))}
    trained_at = time.perf_counter()

    backgrounds, _ = scene_backgrounds(len(BACKGROUND_KINDS), 32, kinds=list(BACKGROUND_KINDS), seed=0)
    follow_ups, rows, shuffled_accuracy = {}, {}, {}
    for name, model in models.items():
        scenes = data[name].val_set
        start = time.perf_counter()
        follow_ups[name] = object_follow_ups(scenes.images[: args.probe], scenes.masks[: args.probe], backgrounds)
        generation = time.perf_counter() - start
        rows[name] = relevancy(model, scenes, follow_ups[name], args.probe)
        rows[name]["generation_seconds"] = generation
        other = shuffled(scenes)
        shuffled_accuracy[name] = accuracy(model, other.images, other.labels)
        rows[name]["shuffled_accuracy"] = shuffled_accuracy[name]
        rows[name].update(unseen_accuracy(model, other))
        print(f"{name}: S {rows[name]['score']:.3f}, unreliable {rows[name]['unreliable_rate']:.3f}, "
              f"accuracy {rows[name]['accuracy']:.3f}, shuffled backgrounds {shuffled_accuracy[name]:.3f}")  # fmt: skip
    distributions_figure(rows).savefig(args.out / "relevancy_distributions.png", dpi=110)
    gallery_figure(rows["spurious"], data["spurious"].val_set.images).savefig(
        args.out / "relevancy_gallery.png", dpi=110
    )

    generator = torch.Generator().manual_seed(0)
    usable = [c for c in range(10) if all(bool(row["run"].scores.correct[row["run"].logits.argmax(1) == c].any())
                                          for row in rows.values())]  # fmt: skip
    every_pair = torch.tensor([(y, z) for y in usable for z in usable if y != z])
    pairs = every_pair[torch.randperm(len(every_pair), generator=generator)[: args.pairs]]
    attacks = {name: attack_table(models[name], data[name].val_set, rows[name], args.budget, pairs) for name in models}
    examples, labels = attacks["clean"]["1/guided"]["result"], data["clean"].val_set.labels
    if len(examples.examples):
        captions = [
            f"{int(labels[b])} bg + {int(labels[d])} → {int(p)}"
            for (b, d), p in zip(examples.example_sources.tolist(), examples.example_predictions, strict=True)
        ]
        plot_image_grid(examples.examples[:8], captions[:8], columns=8).savefig(args.out / "transplant.png", dpi=110)
    for name, table in attacks.items():
        for key, value in table.items():
            print(f"attack {name} scenario {key}: {value['successes']} of {value['attempts']}")

    tuned = {}
    for key, name, replay in (("replay", "spurious", True), ("plain", "spurious", False), ("clean", "clean", True)):
        spurious = 1.0 if name == "spurious" else 0.0
        model, history = fine_tune(models[name], args.tune_epochs, args.probe, replay, args.out, spurious)
        scenes = data[name].val_set
        after = relevancy(model, scenes, follow_ups[name], args.probe)
        other = shuffled(scenes)
        tuned[key] = {
            "history": history,
            "score": after["score"],
            "unreliable_rate": after["unreliable_rate"],
            "accuracy": after["accuracy"],
            "shuffled_accuracy": accuracy(model, other.images, other.labels),
            **unseen_accuracy(model, other),
        }
        print("fine-tuned", key, {k: v for k, v in tuned[key].items() if k != "history"})

    results = {
        "relevancy": {
            name: {k: v for k, v in row.items() if k not in ("run", "flagged")} for name, row in rows.items()
        },
        "attack": {
            name: {k: {kk: vv for kk, vv in v.items() if kk != "result"} for k, v in table.items()}
            for name, table in attacks.items()
        },
        "fine_tuning": tuned,
        "minutes": {"training": (trained_at - started) / 60, "total": (time.perf_counter() - started) / 60},
        "settings": vars(args) | {"out": str(args.out)},
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.md").write_text(render(results, args))
    print(render(results, args))


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    rel, attack, tuned = results["relevancy"], results["attack"], results["fine_tuning"]
    lines = [
        f"Scenes 32x32, mnist_b on 3 channels trained {args.epochs} epochs on 4,000 scenes; relevancy on "
        f"{args.probe} validation scenes of each model's own distribution, 22 follow-ups each.",
        "",
        "| model | accuracy | accuracy, shuffled backgrounds | mean S | mean S⁺ | mean S⁻ | unreliable (of correct) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rel.items():
        lines.append(
            f"| {name} | {row['accuracy']:.3f} | {row['shuffled_accuracy']:.3f} | {row['score']:.3f} | "
            f"{row['preserving']:.3f} | {row['removing']:.3f} | {row['unreliable_rate']:.1%} "
            f"({row['unreliable']} of {row['correct']}) |"
        )
    lines.append(f"| paper, normal ImageNet models | | | | | | {PAPER_UNRELIABLE[0]:.1%}–{PAPER_UNRELIABLE[1]:.1%} |")
    lines += [
        "",
        f"Transplant attack, {args.pairs} random ordered class pairs × {args.budget} images (successes):",
        "",
        "| model | scenario | guided | random | pairs won guided / random | paper guided vs random |",
        "|---|---|---|---|---|---|",
    ]
    for name, table in attack.items():
        for scenario in (1, 2):
            g, r = table[f"{scenario}/guided"], table[f"{scenario}/random"]
            paper = PAPER_ATTACK[scenario]
            lines.append(
                f"| {name} | {scenario} | {g['successes']} | {r['successes']} | {g['pairs_won']} / {r['pairs_won']} "
                f"| {paper[0]:,} vs {paper[1]:,} |"
            )
    lines += [
        "",
        f"Spurious model fine-tuned {args.tune_epochs} epochs on its own scenes:",
        "",
        "| fine-tuning | mean S | unreliable (of correct) | accuracy | accuracy, shuffled backgrounds | "
        f"shuffled, the {PROBED} digits the probe set is drawn from | shuffled, the other digits (never probed) |",
        "|---|---|---|---|---|---|---|",
        f"| before | {rel['spurious']['score']:.3f} | {rel['spurious']['unreliable_rate']:.1%} | "
        f"{rel['spurious']['accuracy']:.3f} | {rel['spurious']['shuffled_accuracy']:.3f} | "
        f"{rel['spurious']['shuffled_probed']:.3f} | {rel['spurious']['shuffled_unseen']:.3f} |",
    ]
    for name, label in (
        ("plain", "plain (no callbacks)"),
        ("replay", "ObjectRelevancyCallback + FailureReplay"),
        ("clean", "the clean model, fine-tuned on its own scenes with the same callbacks"),
    ):
        row = tuned[name]
        lines.append(
            f"| {label} | {row['score']:.3f} | {row['unreliable_rate']:.1%} | {row['accuracy']:.3f} | "
            f"{row['shuffled_accuracy']:.3f} | {row['shuffled_probed']:.3f} | {row['shuffled_unseen']:.3f} |"
        )
    curve = ", ".join(f"{h['score']:.3f}" for h in tuned["replay"]["history"])
    lines += ["", f"relevancy/score logged by the callback per epoch during fine-tuning: {curve}", ""]
    lines.append(
        f"Wall time: {results['minutes']['total']:.1f} min on 2 CPU cores "
        f"(training {results['minutes']['training']:.1f})."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
