"""The shared argument check for a choice among named options, and the entry points that use it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from dlguard._validation import one_of
from dlguard.augment.functional import pad_resize
from dlguard.augment.functional.object_mutations import follow_up_images
from dlguard.metrics.functional.perceptual import perceptual_quality


def test_one_of_returns_the_option_the_value_equals() -> None:
    assert one_of("mode", "b", ("a", "b")) == "b"
    chosen = one_of("scenario", np.int64(2), (1, 2))
    assert chosen == 2 and type(chosen) is int
    named = one_of("mode", np.str_("b"), ("a", "b"))  # a str subclass: the plain option flows on
    assert named == "b" and type(named) is str


@pytest.mark.parametrize("allowed", ["ab", ()])
def test_one_of_refuses_a_bare_string_or_no_options_as_a_programming_error(allowed: object) -> None:
    with pytest.raises(TypeError, match="one_of: expected a non-empty sequence of options for mode"):
        one_of("mode", "a", allowed)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        (True, (1, 2)),  # a bool is not an option even where it equals one
        ("1", (1, 2)),
        (1, ("1", "2")),
        (1.0, (1, 2)),
        ("c", ("a", "b")),
        (None, ("a", "b")),
        (torch.tensor([1, 2]), (1, 2)),  # `in` would raise torch's ambiguous-truth RuntimeError
        (np.array(["a", "b"]), ("a", "b")),  # ... and numpy's unnamed ValueError
        (np.array("a"), ("a", "b")),  # a 0-d array is not a string
        (["a"], ("a", "b")),
    ],
)
def test_one_of_names_the_argument_and_the_options(value: object, allowed: tuple[object, ...]) -> None:
    with pytest.raises(ValueError) as raised:
        one_of("mode", value, allowed)  # type: ignore[arg-type]
    assert str(raised.value).startswith(f"mode: expected one of {allowed!r}, got ")


def _images() -> torch.Tensor:
    return torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))


ENTRY_POINTS: dict[str, Callable[[], object]] = {
    "padding_mode": lambda: pad_resize(
        _images(), torch.tensor([0.5]), torch.tensor([1.0]), torch.tensor([1.0]), padding_mode="mirror"
    ),
    "removal": lambda: follow_up_images(
        _images(), torch.ones(1, 8, 8, dtype=torch.bool), torch.rand(1, 3, 8, 8), removal="outline"
    ),
    "perceptual": lambda: perceptual_quality(_images(), _images(), measure="l1"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_points_name_a_choice_outside_their_options(name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}: expected one of"):
        ENTRY_POINTS[name]()
