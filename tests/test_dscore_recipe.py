"""`recipes/dscore_guided_augmentation.py`: the p each arm pads with, and Fig. 7's table, from hand-made figures."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

RECIPE = Path(__file__).parents[1] / "recipes" / "dscore_guided_augmentation.py"
_spec = importlib.util.spec_from_file_location("dscore_recipe", RECIPE)
assert _spec is not None and _spec.loader is not None
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)  # a script beside the package, not part of it


def test_the_loop_pads_nothing_until_its_first_measurement_then_the_p_it_logged() -> None:
    def record(epoch: int, stage: str, measured: float, logged: float | None) -> dict:
        return {"epoch": epoch, "stage": stage, "augment_probability": measured,
                "logged": {} if logged is None else {"dscore/guide_p": logged}}  # fmt: skip

    latest = [record(0, "validation", 0.5, 0.5), record(1, "validation", 0.3, 0.3), record(3, "validation", 0.1, 0.1)]
    assert recipe.applied_p(latest, epochs=6) == [0.0, 0.5, 0.3, 0.3, 0.1, 0.1]
    held = [record(0, "validation", 0.5, 0.5), record(1, "validation", 0.3, 0.5), record(3, "validation", 0.1, 0.5)]
    assert recipe.applied_p(held, epochs=6) == [0.0, 0.5, 0.5, 0.5, 0.5, 0.5]  # p_from="unpadded" logs the held p
    tested = [record(2, "test", 0.9, None)]  # a test()'s measurement logs no guide_p: it set none
    assert recipe.applied_p(tested, epochs=3) == [0.0, 0.0, 0.0]


def test_constant_padding_pads_every_training_batch_in_place_at_its_p() -> None:
    torch.manual_seed(0)
    images = torch.ones(8, 1, 12, 12)
    batch = [images, torch.zeros(8, dtype=torch.long)]
    recipe.ConstantPadding(1.0).on_train_batch_start(SimpleNamespace(), SimpleNamespace(), batch, 0)
    assert batch[0] is images  # written into the loader's tensor, as a dataset transform would
    # p = 1: every image padded to twice its side and resized back, a zero border in each
    assert bool((images.flatten(1).min(1).values < 0.5).all())
    assert float(images.mean()) == pytest.approx(0.25, abs=0.05)  # a quarter of the area keeps the image
    untouched = torch.ones(8, 1, 12, 12)
    recipe.ConstantPadding(0.0).on_train_batch_start(SimpleNamespace(), SimpleNamespace(), [untouched], 0)
    assert torch.equal(untouched, torch.ones(8, 1, 12, 12))


def _runs(p: list[list[float]], d_score: list[float]) -> list[dict]:
    return [
        {"p_per_epoch": q, "d_score": d, "v_robust": 0.1, "v_fitness": 0.8, "clean_acc": 0.9}
        for q, d in zip(p, d_score, strict=True)
    ]


def test_fig7_names_the_grids_best_p_and_how_far_the_scores_p_lands_from_it() -> None:
    results = {
        "none": _runs([[0.0] * 4, [0.0] * 4], [0.60, 0.62]),
        "RPR": _runs([[0.0] * 4, [0.0] * 4], [0.99, 0.99]),  # padded at random ratios: not on the grid of p
        "p = 0.1": _runs([[0.1] * 4, [0.1] * 4], [0.70, 0.72]),
        "p = 0.2": _runs([[0.2] * 4, [0.2] * 4], [0.66, 0.64]),
        "paper's p": _runs([[0.15] * 4, [0.17] * 4], [0.75, 0.75]),  # above the grid's best: still not a grid point
        # ranked by the p of the epochs it padded (0.12 and 0.18), not by its mean over all four (0.06 and 0.09)
        "score-guided, held": _runs([[0, 0, 0.12, 0.12], [0, 0, 0.18, 0.18]], [0.65, 0.63]),
    }
    lines = recipe.fig7(results)
    rows = [line.split(" | ")[0].lstrip("| ") for line in lines if line.startswith("| ") and "---" not in line]
    assert rows[1:] == ["none", "**p = 0.1** (the grid's best)", "score-guided, held", "paper's p", "p = 0.2"]
    assert "| score-guided, held | 0.15 | 2 | 0.1000 ± 0.0000 | 0.8000 ± 0.0000 | 0.6400 ± 0.0141 |" in lines[4]
    assert "The grid's best D-Score is 0.7100, at p = 0.10." in lines
    assert (
        "paper's p: p 0.16 while padding (0.15, 0.17 over the seeds; 4 epochs padded), D-Score 0.7500 "
        "(+0.0400 against the grid's best)."
    ) in lines
    assert (
        "score-guided, held: p 0.15 while padding (0.12, 0.18 over the seeds; 2 epochs padded), D-Score 0.6400 "
        "(-0.0700 against the grid's best)."
    ) in lines


@pytest.mark.slow
def test_the_recipe_holds_the_papers_p_from_the_unaugmented_model(tmp_path: Path) -> None:
    command = [sys.executable, str(RECIPE), "--seeds", "0", "--epochs", "1", "--sweep", "0.5", "--out", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    results = json.loads((tmp_path / "results.json").read_text())
    loops = {"score-guided", "score-guided, held", "score-guided, held at once"}
    assert set(results) == {"none", "RPR", "paper's p", "p = 0.5", *loops}
    assert results["paper's p"][0]["p_per_epoch"] == [pytest.approx(results["none"][0]["score_p"])]
    for loop in loops:  # one epoch: the loop's first measurement comes after it
        assert results[loop][0]["p_per_epoch"] == [0.0]
    assert "The grid's best D-Score is" in (tmp_path / "results.md").read_text()
