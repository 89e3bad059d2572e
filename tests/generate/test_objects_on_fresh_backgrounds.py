"""objects_on_fresh_backgrounds: what object-relevancy feedback deposits, against move_objects one image at a time."""

from __future__ import annotations

import pytest
import torch

from dlguard.augment.functional import move_objects
from dlguard.data import make_scenes, scene_backgrounds
from dlguard.data.mnist import embedded_mnist
from dlguard.generate import objects_on_fresh_backgrounds


def test_each_object_goes_onto_count_backgrounds_of_its_own() -> None:
    digits, labels = embedded_mnist()
    scenes = make_scenes(digits[[0, 1, 2]], labels[[0, 1, 2]], seed=2)
    moved = objects_on_fresh_backgrounds(scenes.images, scenes.masks, scenes.labels, 2, seed=5)
    drawn, _ = scene_backgrounds(6, 32, seed=5)  # image b takes backgrounds 2b and 2b + 1
    for b in range(3):
        own = move_objects(scenes.images[b : b + 1], scenes.masks[b : b + 1], drawn[2 * b : 2 * b + 2])[0]
        torch.testing.assert_close(moved.inputs[2 * b : 2 * b + 2], own, rtol=0, atol=0)
    assert moved.labels.tolist() == labels[[0, 1, 2]].repeat_interleave(2).tolist()
    again = objects_on_fresh_backgrounds(scenes.images, scenes.masks, scenes.labels, 2, seed=6)
    assert not torch.equal(again.inputs, moved.inputs)  # another seed, other backgrounds


def test_backgrounds_are_cropped_to_images_that_are_not_square() -> None:
    images = torch.rand(2, 3, 20, 28, generator=torch.Generator().manual_seed(1))
    masks = torch.zeros(2, 20, 28, dtype=torch.bool)
    masks[0, 4:12, 3:9], masks[1, 10:18, 20:26] = True, True
    moved = objects_on_fresh_backgrounds(images, masks, torch.tensor([0, 1]), 3, seed=4)
    drawn, _ = scene_backgrounds(6, 28, seed=4)  # squares of the longer side, cropped to 20 x 28
    expected = move_objects(images, masks, drawn[..., :20, :28].unflatten(0, (2, 3))).flatten(0, 1)
    assert moved.inputs.shape == (6, 3, 20, 28)
    torch.testing.assert_close(moved.inputs, expected, rtol=0, atol=0)


def test_no_images_make_no_failures() -> None:
    empty = objects_on_fresh_backgrounds(
        torch.rand(0, 3, 8, 8), torch.zeros(0, 8, 8, dtype=torch.bool), torch.zeros(0, dtype=torch.long), 3, seed=0
    )
    assert len(empty) == 0 and empty.inputs.dtype == torch.float32


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"count": 0}, "count"),
        ({"count": True}, "count"),
        ({"count": 2.5}, "count"),
        ({"labels": torch.tensor([0, 1, 2])}, "labels"),
        ({"labels": [0, 1]}, "labels"),
        ({"masks": torch.ones(2, 8, 7, dtype=torch.bool)}, "masks"),
        ({"images": torch.rand(2, 3, 8, 8) * 2}, "images"),
    ],
)
def test_bad_input_is_refused_naming_the_argument_before_any_background_is_drawn(
    change: dict, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlguard.generate.object_relevancy as module

    monkeypatch.setattr(module, "scene_backgrounds", lambda *a, **k: pytest.fail("drew backgrounds"))
    given = {
        "images": torch.rand(2, 3, 8, 8),
        "masks": torch.ones(2, 8, 8, dtype=torch.bool),
        "labels": torch.tensor([0, 1]),
        "count": 2,
    } | change
    with pytest.raises(ValueError, match=match):
        objects_on_fresh_backgrounds(given["images"], given["masks"], given["labels"], given["count"], seed=0)
