"""The replayed-failures reading (benchmarks/replayed_failures.py): each bank's rows, read by hand-checkable readers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import closed_loop as cl  # scripts beside the package, not part of it
import replayed_failures as rf

from dlguard.data import FailureBank


def test_a_bank_s_rows_are_every_origin_s_and_an_empty_bank_reads_as_no_rows() -> None:
    bank = FailureBank(capacity=8)
    bank.add(torch.zeros(2, 1, 2, 2), torch.tensor([3, 4]), "robustness")
    bank.add(torch.ones(1, 1, 2, 2), torch.tensor([5]), "hda")
    inputs, labels = rf.bank_rows(cl.Arm([cl.FailureReplay(bank=bank)]))
    assert sorted(labels.tolist()) == [3, 4, 5] and inputs.shape == (3, 1, 2, 2)
    assert float(inputs[labels == 5].sum()) == 4.0  # the hda row's ones stay with its label
    assert rf.reading(*rf.bank_rows(cl.Arm([cl.FailureReplay(bank=FailureBank())])), {}) == {"rows": 0}


def test_each_reader_s_accuracy_and_the_classes_the_rows_cover() -> None:
    # the reader predicts the largest coordinate: rows 0-3 point at classes 1, 1, 2, 7
    inputs = torch.zeros(4, 10)
    inputs[torch.arange(4), torch.tensor([1, 1, 2, 7])] = 1.0
    labels = torch.tensor([1, 1, 1, 7])  # by hand: 3 of 4 read right; classes 1 and 7; class 1 holds 3 of 4
    record = rf.reading(inputs, labels, {"argmax": nn.Identity()})
    assert record == {"rows": 4, "argmax": 0.75, "classes": 2, "largest_class_share": 0.75}


def test_the_picture_draws_both_banks_and_nothing_when_both_are_empty(tmp_path: Path) -> None:
    empty = (torch.empty(0, 1, 4, 4), torch.empty(0, dtype=torch.long))
    rf.picture({"loop": empty, "control": empty}, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
    one = (torch.rand(3, 1, 4, 4), torch.tensor([1, 2, 3]))
    rf.picture({"loop": one, "control": empty}, tmp_path / "one.png")
    assert (tmp_path / "one.png").stat().st_size > 0


@pytest.mark.slow
def test_the_loop_s_failures_are_harder_for_other_readers_than_its_control_s_cases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "read.json"
    argv = ["replayed_failures.py", "--seeds", "0", "--out", str(out), "--picture", str(tmp_path / "b.png")]
    monkeypatch.setattr(sys, "argv", argv)
    rf.main()
    results = json.loads(out.read_text())
    (loop,), (control,) = results["robustness"], results["robustness-open"]
    assert loop["rows"] == control["rows"] > 0  # the control follows the loop's dose
    assert loop["pretrained"] < control["pretrained"] and loop["plain"] < control["plain"]
    assert (tmp_path / "b.png").stat().st_size > 0
