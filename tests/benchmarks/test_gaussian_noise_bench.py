"""benchmarks/gaussian_noise.py: it times the keyed noise and the benchmark's global-RNG noise on one batch."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import gaussian_noise as bench  # scripts beside the package, not part of it


@pytest.mark.slow  # scenes made, a ResNet-18 stepped
def test_the_script_prints_both_noises_their_ratio_and_their_share_of_a_step(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["gaussian_noise.py", "--batch", "4", "--repeats", "1"])
    bench.main()
    header, figures = capsys.readouterr().out.splitlines()
    assert header.startswith("batch 4 of 3x32x32 scenes, ResNet-18, device: CPU") and "clock: cpu" in header
    pattern = (r"GaussianNoise \(keyed\) ([\d.]+) ms a batch, the benchmark's global-RNG noise ([\d.]+) ms "
               r"\(([\d.]+)x\); as a share of the training step's ([\d.]+) ms: ([\d.]+)% and ([\d.]+)%")  # fmt: skip
    keyed, plain, ratio, step, *_ = (float(v) for v in re.fullmatch(pattern, figures).groups())
    assert keyed > 0 and plain > 0 and step > 0 and ratio == pytest.approx(keyed / plain, rel=0.06, abs=0.06)
