"""The comprehensive framework's experiments on the embedded MNIST, then error-guided retraining.

    python recipes/comprehensive_mnist.py [--per-class 100] [--pairs 1000] [--epochs 5]

For mnist_a and mnist_b (the shipped weights): a balanced probe set of correctly predicted
validation digits; local robustness LR_{c,p} per class, property and severity (noise σ, rotation θ,
multiplicative brightness β); robustness curves; global robustness through the adder per property;
the error summary. Then each model is fine-tuned twice from its shipped weights with the same
epochs and seed -- plainly, and with RobustnessCallback(guide=ErrorGuidedAugmentation(strength=1.0)), the
proposal at full strength as when its figures were made -- and the
change in every LR_p and in clean accuracy is reported. Writes results.md, results.json,
error_summary_<model>.md and robustness_curves.png into --out (default dlguard-runs/comprehensive).
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from matplotlib.figure import Figure

from dlguard.augment import ErrorGuidedAugmentation, default_properties
from dlguard.callbacks import RobustnessCallback
from dlguard.data import MNISTDataModule
from dlguard.generate import balanced_correct_subset, robustness_sweep
from dlguard.metrics import AdderGlobalRobustness, LocalRobustness
from dlguard.metrics.functional import digit_sum
from dlguard.report import plot_robustness_curves, summarize_errors
from dlguard.zoo import ClassifierModule, pretrained

PROPERTIES = default_properties()


def probe_set(model: torch.nn.Module, dm: MNISTDataModule, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # classes with fewer correct inputs are used whole
        subset = balanced_correct_subset(model, dm.val_set, per_class, seed=0)
    images = torch.stack([dm.val_set[i][0] for i in subset.indices])
    return images, torch.tensor([dm.val_set[i][1] for i in subset.indices])


def evaluate(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, pairs: int) -> dict[str, Any]:
    run = robustness_sweep(model, images, labels, PROPERTIES, pairs=pairs, combine=digit_sum, seed=0)
    levels = max(len(p.levels) for p in PROPERTIES)
    local, adder = LocalRobustness(10, PROPERTIES, levels), AdderGlobalRobustness(10, PROPERTIES, levels)
    for p in PROPERTIES:
        local.update(run.logits[p.name], run.target, p.name)
    adder.update(*run.adder_share)
    lr, gr = local.compute(), adder.compute()
    return {
        "lr_p": {p.name: lr[p.name].per_level.tolist() for p in PROPERTIES},
        "lr_cp": {p.name: lr[p.name].per_class.mean(0).tolist() for p in PROPERTIES},  # mean over levels
        "gr": {p.name: gr[p.name][0].tolist() for p in PROPERTIES},
        "summary": summarize_errors([p.name for p in PROPERTIES], num_classes=10, **run.pairs),
    }


def clean_accuracy(model: torch.nn.Module, dm: MNISTDataModule) -> float:
    correct = 0
    with torch.no_grad():
        for x, y in dm.val_dataloader():
            correct += int((model.eval()(x).argmax(1) == y).sum())
    return correct / len(dm.val_set)


def fine_tune(name: str, guided: bool, epochs: int, per_class: int, pairs: int, out: Path) -> torch.nn.Module:
    L.seed_everything(0, workers=True, verbose=False)
    callbacks = (
        [
            RobustnessCallback(
                per_class=per_class, pairs=pairs, combine=digit_sum, guide=ErrorGuidedAugmentation(strength=1.0)
            )
        ]
        if guided
        else []
    )
    module = ClassifierModule(pretrained(name).train(), lr=3e-4)
    trainer = L.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True, devices=1,
                        default_root_dir=out)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=MNISTDataModule(batch_size=64))
    return module.net


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("dlguard-runs/comprehensive"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dm = MNISTDataModule(batch_size=500)
    dm.setup()
    lines, results = [], {}
    figure = Figure(figsize=(11, 6.4), layout="constrained")
    for panel, name in zip(figure.subfigures(2, 1), ("mnist_a", "mnist_b"), strict=True):
        model = pretrained(name)
        images, labels = probe_set(model, dm, args.per_class)
        before = evaluate(model, images, labels, args.pairs)
        (args.out / f"error_summary_{name}.md").write_text(before["summary"].to_markdown())
        axes = panel.subplots(1, len(PROPERTIES), sharey=True)
        plot_robustness_curves(before["lr_p"], {p.name: p.levels for p in PROPERTIES}, ax=list(axes))
        panel.suptitle(name)
        lines += ["", f"### {name}: local robustness LR_(c,p), mean over severities (probe: {len(labels)} digits)", "",
                  "| property | " + " | ".join(str(c) for c in range(10)) + " | LR_p by level | GR (adder) by level |",
                  "| --- | " + " | ".join("---" for _ in range(10)) + " | --- | --- |"]  # fmt: skip
        for prop in PROPERTIES:
            per_class = " | ".join(f"{v:.2f}" for v in before["lr_cp"][prop.name])
            lr_p = ", ".join(f"{v:.2f}" for v in before["lr_p"][prop.name])
            gr = ", ".join(f"{v:.2f}" for v in before["gr"][prop.name])
            lines.append(f"| {prop.name} ({', '.join(f'{v:g}' for v in prop.levels)}) | {per_class} | {lr_p} | {gr} |")
        top = before["summary"]
        lines += ["", f"Error summary: {top.failed_pairs} of {top.pairs} pairs failed; weakest cells "
                  + ", ".join(f"({c['class']}, {c['property']}) {100 * c['share']:.0f} %" for c in top.ranked_cells[:3])
                  + "; top confusions " + ", ".join(f"{c['true']}→{c['predicted']} ({c['property']}, {c['count']})"
                                                    for c in top.confusions[:3]) + ".", ""]  # fmt: skip
        after = {}
        for guided in (False, True):
            tuned = fine_tune(name, guided, args.epochs, args.per_class, args.pairs, args.out)
            after[guided] = (evaluate(tuned, images, labels, args.pairs), clean_accuracy(tuned, dm))
        heading = f"Fine-tuning {name} for {args.epochs} epochs from its shipped weights (LR_p = mean over severities):"
        lines += ["", heading, "",
                  "| training | " + " | ".join(p.name for p in PROPERTIES) + " | clean accuracy |",
                  "| --- | " + " | ".join("---" for _ in PROPERTIES) + " | --- |",
                  "| shipped weights | " + " | ".join(f"{mean(before['lr_p'][p.name]):.4f}" for p in PROPERTIES)
                  + f" | {clean_accuracy(model, dm):.4f} |"]  # fmt: skip
        for guided, label in ((False, "plain fine-tuning"), (True, "error-guided fine-tuning")):
            evaluation, accuracy = after[guided]
            lines.append(f"| {label} | " + " | ".join(f"{mean(evaluation['lr_p'][p.name]):.4f}" for p in PROPERTIES)
                         + f" | {accuracy:.4f} |")  # fmt: skip
        lines.append("")
        tuned_results = {str(g): {"lr_p": e["lr_p"], "clean_acc": a} for g, (e, a) in after.items()}
        results[name] = {"before": {k: v for k, v in before.items() if k != "summary"}, "after": tuned_results}
    figure.savefig(args.out / "robustness_curves.png", dpi=110)
    text = "\n".join(lines)
    print(text)
    (args.out / "results.md").write_text(text + "\n")
    (args.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
