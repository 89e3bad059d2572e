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


def test_no_images_make_no_failures_and_count_must_be_positive() -> None:
    empty = objects_on_fresh_backgrounds(torch.rand(0, 3, 8, 8), torch.zeros(0, 8, 8, dtype=torch.bool),
                                         torch.zeros(0, dtype=torch.long), 3, seed=0)  # fmt: skip
    assert len(empty) == 0
    with pytest.raises(ValueError, match="count"):
        objects_on_fresh_backgrounds(torch.rand(1, 3, 8, 8), torch.ones(1, 8, 8, dtype=torch.bool),
                                     torch.tensor([0]), 0, seed=0)  # fmt: skip
