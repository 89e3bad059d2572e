"""What HDACallback runs and finds at a given budget: seeds, GA iterations, AEs and forward passes.

    python benchmarks/hda_budget.py [--budgets 0.15 1.0 4200 10.0 42000] [--no-gradient-start]
                                    [--model mnist_a|resnet18] [--val-size 1000]

For each budget (an int: forward passes; a float: that multiple of the 1,000 validation digits), one
``trainer.validate`` of ``mnist_a`` with ``HDACallback(budget=...)`` at its other defaults (a PCA
distribution fitted on the training digits, population 100, 30 iterations, radius 0.1, a gradient
start) prints the seeds, population and iterations the budget paid for, the candidates, the passes
spent, and what was found; ``--no-gradient-start`` runs SPEC §4's black-box GA on the same plan.
``--model resnet18``: ``callback_cost.py``'s ResNet-18 trained for 8 epochs on the RGB scenes (its
cached weights, or trained here), ImageNet normalisation as ``preprocess``, on ``--val-size`` scenes.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import callback_cost
import lightning as L

from dlguard.callbacks import HDACallback
from dlguard.data import MNISTDataModule
from dlguard.zoo import ClassifierModule, pretrained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budgets", nargs="+", default=["0.15", "1.0", "4200", "10.0", "42000"])
    parser.add_argument("--no-gradient-start", action="store_true", help="the paper's GA, random start only")
    parser.add_argument("--model", choices=("mnist_a", "resnet18"), default="mnist_a")
    parser.add_argument("--val-size", type=int, default=1000)
    args = parser.parse_args()
    module, datamodule, options = ClassifierModule(pretrained("mnist_a")), MNISTDataModule(batch_size=250), {}
    if args.model == "resnet18":
        net, datamodule, options, _ = callback_cost.setting("resnet18", args.val_size)
        callback_cost.pretrain(net, datamodule, 8, True, "resnet18")
        module = callback_cost.Classifier(net, normalize=True)
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    print("| budget | seeds x population x iterations | candidates | forward passes | AE proportion | J | epsilon |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for text in args.budgets:
        budget = float(text) if "." in text else int(text)
        callback = HDACallback(budget=budget, gradient_start=not args.no_gradient_start, **options)
        trainer = L.Trainer(
            callbacks=[callback], logger=False, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, default_root_dir=callback_cost.ROOT,
        )  # fmt: skip
        trainer.validate(module, datamodule=datamodule)
        record, logged = callback.latest, callback.latest["logged"]
        spent = record["budget"]
        found = [f"{logged[k]:.2f}" if k in logged else "-" for k in ("hda/prediction_loss", "hda/epsilon")]
        plan = f"{record['seeds']} x {record['population']} x {record['iterations']}"
        print(f"| {text} | {plan} | {spent['probe_inputs']} | "
              f"{spent['forward_passes']} | {logged['hda/ae_proportion']:.2f} | {found[0]} | {found[1]} |")  # fmt: skip


if __name__ == "__main__":
    main()
