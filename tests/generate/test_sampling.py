from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dlguard.generate import balanced_correct_subset
from tests.probes.fingerprint import assert_unchanged, fingerprint

PER_CLASS_AVAILABLE = 30


class PlantedOracle(nn.Module):
    """Reads the class written into pixel 0 of each input, but gets every 3 wrong (says 4) and
    the inputs of class 7 whose pixel 1 is set wrong (says 1): a model with planted mistakes."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.dropout = nn.Dropout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cls = x[:, 0, 0, 0].round().long()
        wrong = torch.where(cls == 3, 4, cls)
        wrong = torch.where((cls == 7) & (x[:, 0, 0, 1] > 0), 1, wrong)
        return nn.functional.one_hot(wrong, 10).float() * self.scale


def planted_dataset() -> TensorDataset:
    labels = torch.arange(10).repeat_interleave(PER_CLASS_AVAILABLE)
    images = torch.rand(len(labels), 1, 4, 4, generator=torch.Generator().manual_seed(0)) * 0.1
    images[:, 0, 0, 0] = labels.float()
    images[:, 0, 0, 1] = 0
    sevens = torch.nonzero(labels == 7).flatten()
    images[sevens[:10], 0, 0, 1] = 1.0  # 10 of the 30 sevens are mispredicted
    return TensorDataset(images, labels)


def test_keeps_only_correct_predictions_with_the_right_counts() -> None:
    dataset, model = planted_dataset(), PlantedOracle()
    with pytest.warns(UserWarning, match=r"classes \{3: 0\}"):
        subset = balanced_correct_subset(model, dataset, per_class=15, seed=0)
    assert subset.found_per_class == {c: 0 if c == 3 else 20 if c == 7 else 30 for c in range(10)}
    assert subset.drawn_per_class == {c: 0 if c == 3 else 15 for c in range(10)}
    images, labels = dataset.tensors
    chosen = torch.tensor(subset.indices)
    assert len(chosen) == 9 * 15 and len(set(chosen.tolist())) == len(chosen)
    # independent check: every kept input is predicted correctly by the model
    assert torch.equal(model(images[chosen]).argmax(1), labels[chosen])
    assert torch.bincount(labels[chosen], minlength=10).tolist() == [0 if c == 3 else 15 for c in range(10)]


def test_short_classes_are_used_whole_and_reported() -> None:
    with pytest.warns(UserWarning, match=r"per_class=25.*\{3: 0, 7: 20\}"):
        subset = balanced_correct_subset(PlantedOracle(), planted_dataset(), per_class=25)
    assert subset.drawn_per_class[7] == 20 and subset.drawn_per_class[0] == 25


def test_draw_is_fixed_by_the_seed() -> None:
    dataset, model = planted_dataset(), PlantedOracle()
    with pytest.warns(UserWarning):
        a = balanced_correct_subset(model, dataset, per_class=10, seed=0, max_batch=7)
        b = balanced_correct_subset(model, dataset, per_class=10, seed=0, max_batch=64)
        c = balanced_correct_subset(model, dataset, per_class=10, seed=1)
    assert a.indices == b.indices
    assert a.indices != c.indices


def test_num_classes_includes_absent_classes() -> None:
    dataset, model = planted_dataset(), PlantedOracle()
    with pytest.warns(UserWarning, match="12: 0"):
        subset = balanced_correct_subset(model, dataset, per_class=5, num_classes=13)
    assert subset.drawn_per_class[12] == 0


def test_model_is_left_as_found() -> None:
    model = PlantedOracle().train()
    before = fingerprint(model)
    with pytest.warns(UserWarning):
        balanced_correct_subset(model, planted_dataset(), per_class=5)
    assert_unchanged(model, before)


@pytest.mark.parametrize("per_class", [0, -3, 2.5, True])
def test_per_class_must_be_positive_integer(per_class: object) -> None:
    with pytest.raises(ValueError, match="per_class: expected an integer of at least 1"):
        balanced_correct_subset(PlantedOracle(), planted_dataset(), per_class=per_class)


def test_dataset_without_labels_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"dataset: expected items \(input, label\)"):
        balanced_correct_subset(PlantedOracle(), TensorDataset(torch.rand(4, 1, 4, 4)))
    with pytest.raises(ValueError, match="dataset: is empty"):
        balanced_correct_subset(PlantedOracle(), TensorDataset(torch.rand(0, 1), torch.zeros(0)))


def test_model_must_return_logits() -> None:
    with pytest.raises(
        ValueError, match=r"model: expected logits of shape \(\d+, K\), got \(\d+,\); pass output_transform="
    ):
        balanced_correct_subset(nn.Flatten(0), planted_dataset())
    model = PlantedOracle().train()
    before = fingerprint(model)
    with pytest.raises(ValueError, match="got dict"):
        balanced_correct_subset(model, planted_dataset(), output_transform=lambda out: {"logits": out})
    assert_unchanged(model, before)
