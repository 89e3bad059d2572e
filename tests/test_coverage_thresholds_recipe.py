"""`recipes/coverage_thresholds.py` runs at a small size, and its table shows the saturation it documents."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RECIPE = Path(__file__).parents[1] / "recipes" / "coverage_thresholds.py"


@pytest.mark.slow
def test_the_recipe_prints_nc_saturated_at_deeptest_s_threshold_and_not_at_the_callback_s() -> None:
    command = [sys.executable, str(RECIPE), "--inputs", "300", "--epochs", "0"]  # an untrained ResNet-18
    output = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600).stdout
    rows = [line for line in output.splitlines() if line.startswith("| ") and "---" not in line][1:]
    values = {row.split(" | ")[0].strip("| "): [float(v) for v in row.strip(" |").split(" | ")[1:]] for row in rows}
    names = list(values)
    assert names[:2] == ["mnist_a", "mnist_b"] and names[2].startswith("ResNet-18, 0 epochs on the RGB scenes")
    for name, (at_02, at_05, at_06, at_075) in values.items():
        assert at_02 >= at_05 >= at_06 >= at_075, name  # a stricter threshold covers no more
        assert at_075 < 0.99, name  # the callback's default is not saturated
    assert values["mnist_a"][0] == pytest.approx(1.0)  # DeepTest's 0.2 is, already on 300 digits
