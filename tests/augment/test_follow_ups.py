"""Object relevancy's follow-ups (SPEC §3): the functions' layout, selecting and moving, refused inputs."""

from __future__ import annotations

import pytest
import torch

from dlguard.augment import MUTATION_FUNCTIONS, follow_up_layout, object_follow_ups
from dlguard.augment.functional import object_mutations
from tests.augment.objects import BAD_INPUTS, SIZE, good_inputs


def test_layout_is_the_functions_in_order_with_the_specs_operation_counts(textured) -> None:
    follow_ups = textured[3]
    assert [f.name for f in MUTATION_FUNCTIONS] == [
        "MoveObjectToBackground",
        "BlendObjectIntoBackground",
        "GrayBackground",
        "FillObjectWithColor",
        "InpaintObject",
        "FillObjectWithMarginStatistic",
    ]
    assert follow_ups.inputs.shape == (3, 22, 3, SIZE, SIZE) and follow_ups.inputs.dtype == torch.float32
    assert follow_ups.function.tolist() == [0] * 4 + [1] * 4 + [2] + [3] * 9 + [4] * 2 + [5] * 2
    assert follow_ups.preserving.tolist() == [True] * 9 + [False] * 13
    assert follow_ups.operation[:2] == ["MoveObjectToBackground/0", "MoveObjectToBackground/1"]
    assert follow_ups.operation[7] == "BlendObjectIntoBackground/3"
    assert follow_ups.operation[9:18] == [
        f"FillObjectWithColor/{c}"
        for c in ("black", "white", "gray", "red", "green", "blue", "yellow", "cyan", "magenta")
    ]
    assert follow_ups.operation[18:] == [
        "InpaintObject/ns",
        "InpaintObject/telea",
        "FillObjectWithMarginStatistic/mean",
        "FillObjectWithMarginStatistic/median",
    ]
    assert bool(((follow_ups.inputs >= 0) & (follow_ups.inputs <= 1)).all())
    function, preserving, names = follow_up_layout(4)
    assert torch.equal(function, follow_ups.function) and torch.equal(preserving, follow_ups.preserving)
    assert names == follow_ups.operation


def test_follow_ups_select_and_move(textured) -> None:
    follow_ups = textured[3]
    assert len(follow_ups) == 3
    picked = follow_ups.select(torch.tensor([2, 0]))
    assert torch.equal(picked.inputs, follow_ups.inputs[[2, 0]]) and torch.equal(picked.valid, follow_ups.valid[[2, 0]])
    assert len(follow_ups.select(1)) == 1 and torch.equal(follow_ups.select([1]).inputs[0], follow_ups.inputs[1])
    moved = follow_ups.to("cpu")
    assert moved.operation == follow_ups.operation and torch.equal(moved.function, follow_ups.function)


@pytest.mark.parametrize(("change", "message"), BAD_INPUTS)
def test_bad_inputs_are_refused_before_any_work(change, message, monkeypatch) -> None:
    def planted(*args: object) -> None:
        raise AssertionError("work started before validation")

    monkeypatch.setattr(object_mutations, "_mutate", planted)
    x, m, bg = change(*good_inputs())
    with pytest.raises(ValueError, match=message):
        object_follow_ups(x, m, bg)


def test_bad_workers_are_refused() -> None:
    images, masks, _ = good_inputs()
    with pytest.raises(ValueError, match="workers: expected an integer of at least 1"):
        object_follow_ups(images, masks, images, workers=0)
