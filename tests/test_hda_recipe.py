"""`recipes/hda_mnist.py` runs end to end at a small size, and its Table 10 hangs together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RECIPE = Path(__file__).parents[1] / "recipes" / "hda_mnist.py"


@pytest.mark.slow
def test_the_recipe_runs_and_table_10_follows_the_papers_protocol(tmp_path: Path) -> None:
    command = [sys.executable, str(RECIPE), "--seeds", "4", "--population", "30", "--iterations", "3",
               "--budgets", "20", "60", "--per-seed", "4", "--epochs", "1", "--eval-seeds", "80",
               "--t10-population", "30", "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=900)
    table = json.loads((tmp_path / "results.json").read_text())["table10"]
    assert table["eval_aes"] >= 1
    before = table["before"]
    assert before["rg"] == 0.0  # every held-out AE misleads the shipped model: the paper's baseline
    assert before["unseen_aes"] == table["eval_aes"] and before["unseen"] == before["rg"]
    for budget in (20, 60):
        hda, pgd_there = table[f"HDA@{budget}"], table[f"PGD, HDA's seeds@{budget}"]
        # the control shares HDA's seeds: the same density, the same AEs left unseen
        assert hda["density"] == pgd_there["density"] and hda["unseen_aes"] == pgd_there["unseen_aes"]
        assert table[f"PGD@{budget}"]["density"] == table[f"noise@{budget}"]["density"]
        assert hda["density"] > table[f"PGD@{budget}"]["density"]  # selected seeds are denser than random ones
        assert 0.0 <= hda["rg"] <= 1.0
    assert table["HDA@60"]["density"] >= table["HDA@20"]["density"]  # more seeds, more of the density
    assert table["HDA@60"]["unseen_aes"] <= table["HDA@20"]["unseen_aes"]
    assert "| PGD, HDA's seeds | 20 |" in (tmp_path / "results.md").read_text()
