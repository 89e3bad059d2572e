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
unanchored run's. The anchoring is the library's :class:`~dlguard.callbacks.KeepOriginals` (since
2026-12-02; this script's own callbacks before, which did the same). Each anchored record gains
``"anchored"``, the rows added over the fit, and its label in the tables ``--anchor True``; the file is
``closed_loop.py``'s, so ``--results`` reads it beside the others.

    python benchmarks/anchor.py --anchor-draw random <closed_loop.py arguments> --out F.json

is the control of the anchoring's other change, a larger batch: it appends as many originals as the loops
changed rows, but of rows drawn at random from the batch (a generator of its own, so the loops' draws stay
the unanchored run's), and is labelled ``--anchor random``.
"""

from __future__ import annotations

import sys
from typing import Any

import closed_loop
import torch
from torch import Tensor

from dlguard.callbacks import KeepOriginals

DRAWS = ("changed", "random")


class RandomOriginals(KeepOriginals):
    """The control of :class:`~dlguard.callbacks.KeepOriginals`' larger batch.

    As many originals as the loops changed rows, of rows drawn uniformly from the batch without replacement
    (``seed`` seeds a generator of the callback's own), whether the loops changed them or not. A harness for one
    process: the generator is not checkpointed, and under DDP every process would draw alike.
    """

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def rows(self, changed: Tensor) -> Tensor:
        count = int(changed.sum())  # one host sync a batch, as KeepOriginals'
        return torch.randperm(len(changed), generator=self.generator)[:count].sort().values.to(changed.device)


def anchored(arm: closed_loop.Arm, draw: str = "changed", seed: int = 0) -> tuple[closed_loop.Arm, KeepOriginals]:
    """``arm`` with the originals of the rows its loops change added to each batch, or of as many drawn rows.

    ``draw="changed"``: :class:`~dlguard.callbacks.KeepOriginals`; ``"random"``: :class:`RandomOriginals`
    (seeded by ``seed``). The keeper goes in when the fit starts, before the first loop that changes batches,
    so after ``--on``'s augmentation underneath.
    """
    if draw not in DRAWS:
        raise ValueError(f"draw: expected one of {DRAWS}, got {draw!r}")
    keep = KeepOriginals() if draw == "changed" else RandomOriginals(seed)
    arm.callbacks.append(keep)
    return arm, keep


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
    anchors: dict[str, KeepOriginals] = {}  # the arm being fitted's

    def make_anchored_arm(arm_name: str, setting: closed_loop.Setting, seed: int, *args: Any) -> closed_loop.Arm:
        arm = make_arm(arm_name, setting, seed, *args)
        if not arm.callbacks or any(isinstance(c, KeepOriginals) for c in arm.callbacks):
            return arm  # plain and the standard arms change no row; closed_loop_callbacks keeps its own
        arm, anchors[arm_name] = anchored(arm, draw, seed)
        return arm

    def fit_anchored(arm_name: str, *args: Any, **kwargs: Any) -> tuple:
        model, record = fit(arm_name, *args, **kwargs)
        if arm_name in anchors:  # the tables' label names the flag, so a merge keeps anchored runs apart
            record["anchored"] = anchors.pop(arm_name).appended
            record["options"] = {**record.get("options", {}), "anchor": True if draw == "changed" else draw}
        return model, record

    closed_loop.make_arm, closed_loop.fit = make_anchored_arm, fit_anchored
    closed_loop.main()


if __name__ == "__main__":
    main()
