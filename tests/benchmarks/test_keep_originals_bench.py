"""benchmarks/keep_originals.py: what it times is a fit's batch through the replay, with and without the originals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import keep_originals as bench  # scripts beside the package, not part of it

from dlguard.callbacks import FailureReplay, KeepOriginals


def test_the_timed_batch_holds_the_replayed_rows_and_after_them_their_originals() -> None:
    images, labels = torch.rand(8, 3, 4, 4), torch.arange(8)
    given = images.clone()
    replay = FailureReplay(fraction=0.25, repeats=None)
    replay.bank.add(torch.full((4, 3, 4, 4), 2.0), torch.full((4,), 9), origin="benchmark")
    plain = bench.replayed(images, labels, replay, None)
    kept = bench.replayed(images, labels, replay, KeepOriginals())
    assert len(plain[1]) == 8 and int((plain[1] == 9).sum()) == 2  # a quarter of the rows replaced
    assert len(kept[1]) == 10 and int((kept[1][:8] == 9).sum()) == 2
    replaced = set(range(8)) - set(kept[1][:8].tolist())
    assert sorted(kept[1][8:].tolist()) == sorted(replaced)  # each replaced row's original, once
    assert torch.equal(kept[0][8:], images[kept[1][8:]])
    assert torch.equal(images, given) and torch.equal(labels, torch.arange(8))  # each call replays a copy


@pytest.mark.slow  # scenes made, a ResNet-18 stepped: half a minute on 2 busy cores
def test_the_script_prints_each_share_with_the_originals_it_appended(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["keep_originals.py", "--batch", "4", "--changed", "0.0", "0.5", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("batch 4 of 3x32x32 scenes, ResNet-18, device: CPU") and "clock: cpu" in lines[0]
    assert lines[1].startswith("0.00 of the rows changed (0 originals appended)") and "(batch 4 / 4 = 1.00)" in lines[1]
    assert lines[2].startswith("0.50 of the rows changed (2 originals appended)") and "(batch 6 / 4 = 1.50)" in lines[2]
