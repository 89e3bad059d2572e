"""Does refining on less-augmented batches give the loops' clean accuracy back? The last epochs without the loops.

    python benchmarks/refine.py --epochs-refined 1 <closed_loop.py arguments> --out F.json

Runs ``closed_loop.py`` with the arguments given and, in the last ``--epochs-refined`` training epochs of
every loop arm, trains on the batches as the augmentation underneath (``--on``) left them: the loops'
guides, padding and replay still draw as ever (so every random stream, and every epoch before the
refined ones, is the unrefined run's), but their rows are put back before the training step. That is
He et al.'s refinement ("Data Augmentation Revisited: Rethinking the Distribution Gap between Clean and
Augmented Data", arXiv 1909.09148): a model trained on heavily augmented data, refined on less
augmented data at the end, keeps the augmentation's generalisation and gets back the empirical risk the
distribution gap cost it. The loops still measure at every validation. Each refined record gains
``"refined": N``, and its label in the tables ``--epochs-refined N``; the file is ``closed_loop.py``'s, so
``--results`` reads it beside the others.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import closed_loop
import lightning as L
import torch

from dlguard.callbacks import GaussianNoise


class Keep(L.Callback):
    """Keeps a copy of the training batch as it is when Lightning calls this callback, in the refined epochs."""

    def __init__(self, first_refined: int) -> None:
        self.first_refined = first_refined
        self.kept: list[torch.Tensor] | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        refined = trainer.current_epoch >= self.first_refined
        self.kept = [part.clone() for part in batch[:2]] if refined else None


class PutBack(L.Callback):
    """Last among the callbacks: writes ``Keep``'s copy back over what the loops did to the batch."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        if self.keep.kept is not None:
            with torch.no_grad():
                for part, kept in zip(batch, self.keep.kept, strict=False):
                    part.copy_(kept)


def refined(arm: closed_loop.Arm, first_refined: int) -> closed_loop.Arm:
    """``arm``, its training batches put back from epoch ``first_refined`` on as they were before its loops.

    ``Keep`` goes after the augmentation underneath (``--on``'s, or ``closed_loop_callbacks``' own
    ``GaussianNoise``), before the loops; ``PutBack`` last.
    """
    keep = Keep(first_refined)
    under = bool(arm.callbacks) and isinstance(arm.callbacks[0], closed_loop.Underneath | GaussianNoise)
    arm.callbacks[int(under) : int(under)] = [keep]
    arm.callbacks.append(PutBack(keep))
    return arm


def main() -> None:
    given = argparse.ArgumentParser(add_help=False)
    given.add_argument("--epochs-refined", type=int, required=True)
    given.add_argument("--epochs", type=int, default=closed_loop.EPOCHS)
    known, rest = given.parse_known_args()
    if not 0 < known.epochs_refined < known.epochs:
        raise SystemExit(f"--epochs-refined: expected 1 to {known.epochs - 1}, got {known.epochs_refined}")
    if "--results" in rest:
        raise SystemExit("--results: give closed_loop.py's arguments for fits; read the file with closed_loop.py")
    make_arm, fit = closed_loop.make_arm, closed_loop.fit
    names: set[str] = set()  # the arms refined

    def make_refined_arm(arm_name: str, *args: Any) -> closed_loop.Arm:
        arm = make_arm(arm_name, *args)
        if not arm.callbacks:  # plain and the standard arms have nothing to refine
            return arm
        names.add(arm_name)
        return refined(arm, known.epochs - known.epochs_refined)

    def fit_refined(arm_name: str, *args: Any, **kwargs: Any) -> tuple:
        model, record = fit(arm_name, *args, **kwargs)
        if arm_name in names:  # the tables' label names the flag, so a merge keeps refined runs apart
            record["refined"] = known.epochs_refined
            record["options"] = {**record.get("options", {}), "epochs-refined": known.epochs_refined}
        return model, record

    closed_loop.make_arm, closed_loop.fit = make_refined_arm, fit_refined
    sys.argv = [sys.argv[0], *rest, "--epochs", str(known.epochs)]
    closed_loop.main()


if __name__ == "__main__":
    main()
