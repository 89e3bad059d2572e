"""Does keeping every loader row give the loops' clean accuracy back? Their rows added beside the originals.

    python benchmarks/anchor.py <closed_loop.py arguments> --out F.json

Runs ``closed_loop.py`` with the arguments given and, in every epoch of every loop arm, trains on the
batch the loops made *and* on the original of each row they changed, as the augmentation underneath
(``--on``) left it: a row a guide transformed, D-Score padded or ``FailureReplay`` replaced by a stored
failure is kept, and its original goes in beside it (Hoffer et al.'s batch augmentation, "Augment your
batch", arXiv 1901.09335, and the papers' own retraining, which adds the test cases to the training set
rather than trading training inputs for them). So every loader row is trained on once an epoch as plain
training (or the augmentation underneath) trains on it, and the loops' rows come on top; a batch of
``B`` rows grows by the rows the loops changed. The loops draw as ever, so every random stream is the
unanchored run's. Each anchored record gains ``"anchored"``, the rows added over the fit, and its label
in the tables ``--anchor True``; the file is ``closed_loop.py``'s, so ``--results`` reads it beside the others.
"""

from __future__ import annotations

import sys
from typing import Any

import closed_loop
import lightning as L
import torch
from refine import Keep


class Anchor(L.Callback):
    """Last among the callbacks: appends ``Keep``'s original of every row the loops changed to the batch."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self.added = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        kept_inputs, kept_labels = self.keep.kept
        changed = (batch[0] != kept_inputs).flatten(1).any(1) | (batch[1] != kept_labels)
        batch[0] = torch.cat([batch[0], kept_inputs[changed]])
        batch[1] = torch.cat([batch[1], kept_labels[changed]])
        self.added += int(changed.sum())


def anchored(arm: closed_loop.Arm) -> tuple[closed_loop.Arm, Anchor]:
    """``arm`` with the originals of the rows its loops change added to each batch; ``Keep`` after ``--on``'s."""
    keep = Keep(first_refined=0)  # every epoch
    under = bool(arm.callbacks) and isinstance(arm.callbacks[0], closed_loop.Underneath)
    arm.callbacks[int(under) : int(under)] = [keep]
    anchor = Anchor(keep)
    arm.callbacks.append(anchor)
    return arm, anchor


def main() -> None:
    if "--results" in sys.argv:
        raise SystemExit("--results: give closed_loop.py's arguments for fits; read the file with closed_loop.py")
    make_arm, fit = closed_loop.make_arm, closed_loop.fit
    anchors: dict[str, Anchor] = {}  # the arm being fitted's

    def make_anchored_arm(arm_name: str, *args: Any) -> closed_loop.Arm:
        arm = make_arm(arm_name, *args)
        if not arm.callbacks:  # plain and the standard arms change no row
            return arm
        arm, anchors[arm_name] = anchored(arm)
        return arm

    def fit_anchored(arm_name: str, *args: Any, **kwargs: Any) -> tuple:
        model, record = fit(arm_name, *args, **kwargs)
        if arm_name in anchors:  # the tables' label names the flag, so a merge keeps anchored runs apart
            record["anchored"] = anchors.pop(arm_name).added
            record["options"] = {**record.get("options", {}), "anchor": True}
        return model, record

    closed_loop.make_arm, closed_loop.fit = make_anchored_arm, fit_anchored
    closed_loop.main()


if __name__ == "__main__":
    main()
