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

    python benchmarks/anchor.py --anchor-draw random <closed_loop.py arguments> --out F.json

is the control of the anchoring's other change, a larger batch: it appends as many originals as the loops
changed rows, but of rows drawn at random from the batch (a generator of its own, so the loops' draws stay
the unanchored run's), and is labelled ``--anchor random``.
"""

from __future__ import annotations

import sys
from typing import Any

import closed_loop
import lightning as L
import torch
from refine import Keep

DRAWS = ("changed", "random")


class Anchor(L.Callback):
    """Last among the callbacks: appends ``Keep``'s original of every row the loops changed to the batch.

    ``draw="random"``: as many originals, of rows drawn uniformly from the batch without replacement
    (``seed`` seeds a generator of the callback's own), whether the loops changed them or not.
    """

    def __init__(self, keep: Keep, draw: str = "changed", seed: int = 0) -> None:
        if draw not in DRAWS:
            raise ValueError(f"draw: expected one of {DRAWS}, got {draw!r}")
        self.keep, self.draw = keep, draw
        self.generator = torch.Generator().manual_seed(seed) if draw == "random" else None
        self.added = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        kept_inputs, kept_labels = self.keep.kept
        changed = (batch[0] != kept_inputs).flatten(1).any(1) | (batch[1] != kept_labels)
        count = int(changed.sum())  # one host sync a batch: a harness on the CPU
        if self.draw == "random":
            changed = torch.zeros_like(changed)
            changed[torch.randperm(len(changed), generator=self.generator)[:count].to(changed.device)] = True
        batch[0] = torch.cat([batch[0], kept_inputs[changed]])
        batch[1] = torch.cat([batch[1], kept_labels[changed]])
        self.added += count


def anchored(arm: closed_loop.Arm, draw: str = "changed", seed: int = 0) -> tuple[closed_loop.Arm, Anchor]:
    """``arm`` with the originals of the rows its loops change added to each batch; ``Keep`` after ``--on``'s.

    ``draw`` and ``seed`` are :class:`Anchor`'s.
    """
    keep = Keep(first_refined=0)  # every epoch
    under = bool(arm.callbacks) and isinstance(arm.callbacks[0], closed_loop.Underneath)
    arm.callbacks[int(under) : int(under)] = [keep]
    anchor = Anchor(keep, draw, seed)
    arm.callbacks.append(anchor)
    return arm, anchor


def take_draw(argv: list[str]) -> str:
    """Removes this script's own ``--anchor-draw D`` (or ``--anchor-draw=D``, once) from ``argv``; returns ``D``."""
    given = [at for at, word in enumerate(argv) if word == "--anchor-draw" or word.startswith("--anchor-draw=")]
    if not given:
        return "changed"
    if len(given) > 1:
        raise SystemExit("--anchor-draw: given more than once")
    at = given[0]
    _, equals, draw = argv[at].partition("=")
    if not equals:
        draw = argv[at + 1] if at + 1 < len(argv) else ""
    if draw not in DRAWS:
        raise SystemExit(f"--anchor-draw: expected one of {DRAWS}, got {draw!r}")
    del argv[at : at + (1 if equals else 2)]
    return draw


def main() -> None:
    if "--results" in sys.argv:
        raise SystemExit("--results: give closed_loop.py's arguments for fits; read the file with closed_loop.py")
    draw = take_draw(sys.argv)  # the rest are closed_loop.py's
    make_arm, fit = closed_loop.make_arm, closed_loop.fit
    anchors: dict[str, Anchor] = {}  # the arm being fitted's

    def make_anchored_arm(arm_name: str, setting: closed_loop.Setting, seed: int, *args: Any) -> closed_loop.Arm:
        arm = make_arm(arm_name, setting, seed, *args)
        if not arm.callbacks:  # plain and the standard arms change no row
            return arm
        arm, anchors[arm_name] = anchored(arm, draw, seed)
        return arm

    def fit_anchored(arm_name: str, *args: Any, **kwargs: Any) -> tuple:
        model, record = fit(arm_name, *args, **kwargs)
        if arm_name in anchors:  # the tables' label names the flag, so a merge keeps anchored runs apart
            record["anchored"] = anchors.pop(arm_name).added
            record["options"] = {**record.get("options", {}), "anchor": True if draw == "changed" else draw}
        return model, record

    closed_loop.make_arm, closed_loop.fit = make_anchored_arm, fit_anchored
    closed_loop.main()


if __name__ == "__main__":
    main()
