"""`recipes/deeptest_roads.py` runs end to end at a small size, and its numbers hang together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RECIPE = Path(__file__).parents[1] / "recipes" / "deeptest_roads.py"


@pytest.mark.slow
def test_the_recipe_runs_and_its_tables_agree(tmp_path: Path) -> None:
    out, images = tmp_path / "results", tmp_path / "images"
    command = [sys.executable, str(RECIPE), "--seeds", "12", "--test", "120", "--max-failed-tries", "5",
               "--tune-epochs", "1", "--probe", "64", "--out", str(out), "--images", str(images)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=900)
    results = json.loads((out / "results.json").read_text())
    coverage = results["coverage"]
    assert coverage["guided"] == pytest.approx(coverage["guided_check"], abs=1e-9)  # the search's own count
    assert coverage["baseline"] <= coverage["cumulative"] and coverage["baseline"] <= coverage["guided"]
    assert coverage["cumulative_images"] == 12 * 80  # 12 seeds x DeepTest's 80 transformation parameters
    violations = results["violations"]
    over_lambda = list(violations["simple_over_lambda"].values())
    assert over_lambda == sorted(over_lambda, reverse=True)  # a larger λ reports fewer violations
    over_epsilon = list(violations["simple_over_epsilon"].values())
    assert over_epsilon == sorted(over_epsilon)  # a larger ε keeps more transformations
    assert violations["at_5_003"]["simple"] == violations["simple_over_lambda"]["5.0"]
    assert set(results["retraining"]) == {"before", "plain", "metamorphic"}
    assert "| fog |" in (out / "results.md").read_text()
