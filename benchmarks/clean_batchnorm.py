"""Is the loops' clean-accuracy cost in BatchNorm's statistics? Judge each trained model a second time.

    python benchmarks/clean_batchnorm.py --setting scenes --seeds 0 --arms plain --out F.json
    python benchmarks/clean_batchnorm.py <any closed_loop.py arguments> --out F.json

Runs ``closed_loop.py`` with the arguments given (``--out`` is needed, and its file written as ever) and
judges every model it trains a second time, after re-estimating BatchNorm's running statistics on the
clean training split (``torch.optim.swa_utils.update_bn``: momentum ``None``, an average over the
split's batches in place of the running one). Training batches that the loops and the augmentation
underneath transformed (noise, blurs, padding, replayed failures) leave running statistics that the
clean test split does not share; if that mismatch were the clean-accuracy cost, the second
judgement would give it back. Writes ``F.batchnorm.json``, by arm and seed: the first judgement's
clean accuracy, mCA, PGD accuracy and D-Score (``judged``), the same four after the re-estimate
(``recalibrated``), the mCA per corruption of both, the test inputs each misreads (``misread``,
indices into the test split), the arguments and the thread count.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

import closed_loop
import torch
from torch.utils.data import DataLoader, TensorDataset

MEASURES = ("clean", "mCA", "pgd", "d_score")


def recalibrated(model: closed_loop.Classifier, setting: closed_loop.Setting) -> closed_loop.Classifier:
    """A copy of ``model`` whose BatchNorm statistics are the clean training split's (the model is untouched)."""
    copied = copy.deepcopy(model).cpu()
    torch.optim.swa_utils.update_bn(DataLoader(TensorDataset(setting.train[0]), batch_size=64), copied)
    return copied.eval()


def misread(model: closed_loop.Classifier, setting: closed_loop.Setting) -> list[int]:
    """The indices of the test inputs ``model`` misreads."""
    x, y = setting.test
    device = next(model.parameters()).device
    return (closed_loop.predict(model, x.to(device)).cpu() != y).nonzero().flatten().tolist()


def second_judgement(model: closed_loop.Classifier, setting: closed_loop.Setting, corrupted: dict) -> dict:
    """Clean accuracy, mCA (and per corruption), PGD accuracy and D-Score, as ``closed_loop.judge`` measures them."""
    x, y = setting.test
    accuracy = lambda inputs: float((closed_loop.predict(model, inputs.cpu()) == y).float().mean())  # noqa: E731
    per = {name: mean(accuracy(c) for c in levels) for name, levels in corrupted.items()}
    return {
        "clean": accuracy(x),
        "mCA": mean(per.values()),
        "pgd": accuracy(closed_loop.attack(model, x, y, setting.eps, 10)),
        "d_score": closed_loop.d_score_of(model, x, y),
        "corruptions": {name: round(value, 4) for name, value in per.items()},
        "misread": misread(model, setting),
    }


def main() -> None:
    given = argparse.ArgumentParser(add_help=False)
    given.add_argument("--out", type=Path, default=None)
    given.add_argument("--results", nargs="*", default=None)
    known, _ = given.parse_known_args()
    if known.out is None or known.results is not None:
        raise SystemExit("give closed_loop.py's arguments for fits, with --out F.json (not --results)")
    if "--judge" in sys.argv:  # its records hold D-Score, which --judge goal does not measure
        raise SystemExit("--judge: clean_batchnorm.py judges with the full judge; leave --judge out")
    out = known.out.with_suffix(".batchnorm.json")
    runs: dict[str, list[dict]] = {}
    judge, fit = closed_loop.judge, closed_loop.fit
    fitted: dict[str, Any] = {}

    def fit_noting(arm_name: str, setting: closed_loop.Setting, seed: int, *args: Any, **kwargs: Any) -> tuple:
        fitted.update(arm=arm_name, seed=seed)  # what judge_twice's record is filed under
        return fit(arm_name, setting, seed, *args, **kwargs)

    def judge_twice(model: closed_loop.Classifier, setting: closed_loop.Setting, corrupted: dict, *args: Any) -> dict:
        scores = judge(model, setting, corrupted, *args)
        started = time.perf_counter()
        again = second_judgement(recalibrated(model, setting), setting, corrupted)
        runs.setdefault(fitted["arm"], []).append({
            "seed": fitted["seed"],
            "judged": {key: scores[key] for key in MEASURES},
            "judged_corruptions": scores["corruptions"],
            "judged_misread": misread(model, setting),
            "recalibrated": again,
            "seconds": time.perf_counter() - started,
            "arguments": sys.argv[1:],
            "threads": torch.get_num_threads(),
        })  # fmt: skip
        out.write_text(json.dumps(runs, indent=1))
        print("    BatchNorm re-estimated on the clean training split: "
              + " ".join(f"{key} {scores[key]:.3f} -> {again[key]:.3f}" for key in MEASURES), flush=True)  # fmt: skip
        return scores

    closed_loop.judge, closed_loop.fit = judge_twice, fit_noting
    closed_loop.main()


if __name__ == "__main__":
    main()
