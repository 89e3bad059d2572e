from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
from torch import nn

from dlguard.augment import Property, default_properties
from dlguard.data import MNISTDataModule
from dlguard.generate import balanced_correct_subset
from dlguard.report import ErrorSummary, summarize_errors
from dlguard.zoo import pretrained


class WeakOnNoisyFives(nn.Module):
    """The pretrained mnist_a, with a planted weakness: a 5 in a noisy image is read as 3.

    Noise is recognised by its background: MNIST backgrounds are exactly 0, and stay 0 under
    rotation and brightness scaling, while Gaussian noise lifts about half of them."""

    def __init__(self) -> None:
        super().__init__()
        self.net = pretrained("mnist_a")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.net(x)
        noisy = (x.flatten(1) > 0).float().mean(1) > 0.5
        fives = logits.argmax(1) == 5
        planted = torch.nn.functional.one_hot(torch.full_like(fives, 3, dtype=torch.long), 10).float() * 100
        return torch.where((noisy & fives).unsqueeze(1), planted, logits)


def sweep_pairs(model: nn.Module, properties: list[Property], pairs: int = 300) -> dict[str, torch.Tensor]:
    dm = MNISTDataModule()
    dm.setup()
    with warnings.catch_warnings():  # classes with fewer than 20 correct inputs warn
        warnings.simplefilter("ignore")
        subset = balanced_correct_subset(model, dm.val_set, per_class=20)
    images = torch.stack([dm.val_set[i][0] for i in subset.indices])
    labels = torch.tensor([dm.val_set[i][1] for i in subset.indices])
    gen = torch.Generator().manual_seed(0)
    records = {"property_index": [], "level": [], "targets": [], "predictions": []}
    for index, prop in enumerate(properties):
        torch.manual_seed(index)
        with torch.no_grad():
            predicted = model(prop(images, prop.levels[0])).argmax(1)
        first = torch.randint(len(images), (pairs,), generator=gen)
        second = torch.randint(len(images), (pairs,), generator=gen)
        records["property_index"].append(torch.full((pairs,), index))
        records["level"].append(torch.zeros(pairs, dtype=torch.long))
        records["targets"].append(torch.stack([labels[first], labels[second]], 1))
        records["predictions"].append(torch.stack([predicted[first], predicted[second]], 1))
    return {k: torch.cat(v) for k, v in records.items()}


def test_planted_weakness_is_the_top_cell_and_confusion() -> None:
    # noise 0.1, 20°, 2x; replace() keeps every other field of the property (e.g. how it draws noise)
    properties = [dataclasses.replace(p, levels=(p.levels[2],)) for p in default_properties()]
    model = WeakOnNoisyFives().eval()
    records = sweep_pairs(model, properties)
    summary = summarize_errors([p.name for p in properties], num_classes=10, **records)
    assert summary.ranked_cells[0]["class"] == 5 and summary.ranked_cells[0]["property"] == "noise"
    top = summary.confusions[0]
    assert (top["true"], top["predicted"], top["property"]) == (5, 3, "noise")
    noise = summary.properties.index("noise")
    assert summary.failure_rate[5][noise] == pytest.approx(1.0)  # every 5 fails under noise
    assert summary.proposal[5][noise] == 1.0 and max(max(row) for row in summary.proposal) == 1.0
    assert json.loads(summary.to_json())["failed_pairs"] == summary.failed_pairs
    report = summary.to_markdown()
    assert "| 5 | noise |" in report and "5 → 3" in report
    heatmap = summary.plot_failure_rates()
    assert heatmap.axes[0].images[0].get_array().shape == (10, 3)
    bars = summary.plot_top_confusions(top=3)
    assert bars.axes[0].get_yticklabels()[-1].get_text() == "5 → 3 (noise)"  # most frequent on top


def test_failed_pairs_by_hand() -> None:
    targets = torch.tensor([[5, 1], [5, 2], [3, 4], [2, 2]])
    predictions = torch.tensor([[6, 1], [5, 2], [4, 3], [3, 2]])  # pair 2: both wrong, sum right
    summary = summarize_errors(["noise", "rotation"], torch.tensor([0, 0, 1, 1]), torch.zeros(4, dtype=torch.long),
                               targets, predictions, num_classes=10)  # fmt: skip
    assert (summary.pairs, summary.failed_pairs) == (4, 2)
    assert summary.failure_rate[5][0] == pytest.approx(0.5) and summary.failure_rate[3][1] == pytest.approx(1.0)
    assert summary.failure_rate[2][1] == pytest.approx(0.5)  # one of the two 2s of pair 4 was mispredicted
    assert [(c["class"], c["property"], c["share"]) for c in summary.ranked_cells] == [
        (2, "rotation", 0.5),
        (5, "noise", 0.5),
    ]
    assert [f["mispredicted"] for f in summary.failures] == [[True, False], [True, False]]
    # a cell no pair held an input of takes the property's pooled rate (noise 1 of 4, rotation 3 of 4), not 0
    assert summary.proposal[0] == pytest.approx([0.25, 0.75]) and summary.proposal[5] == pytest.approx([0.5, 0.75])
    assert summary.proposal[1] == pytest.approx([0.0, 0.75]) and summary.proposal[3] == pytest.approx([0.25, 1.0])
    assert summary.failure_rate[0] == [0.0, 0.0]  # the reported rates stay what was measured


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=r"predictions: expected shape \(2, 2\)"):
        summarize_errors(["noise"], torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                         torch.zeros(2, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long), 10)  # fmt: skip
    with pytest.raises(ValueError, match="property_index: expected indices"):
        summarize_errors(["noise"], torch.ones(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                         torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2, dtype=torch.long), 10)  # fmt: skip


def test_to_dict_can_leave_out_the_failures() -> None:
    targets = torch.tensor([[5, 1], [5, 2], [3, 4], [2, 2]])
    predictions = torch.tensor([[6, 1], [5, 2], [4, 3], [3, 2]])
    summary = summarize_errors(["noise", "rotation"], torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 2]),
                               targets, predictions, num_classes=10)  # fmt: skip
    full = summary.to_dict()
    assert full["failures"] == [
        {"property": "noise", "level": 0, "targets": [5, 1], "predictions": [6, 1], "mispredicted": [True, False]},
        {"property": "rotation", "level": 2, "targets": [2, 2], "predictions": [3, 2], "mispredicted": [True, False]},
    ]
    compact = summary.to_dict(include_failures=False)
    assert "failures" not in compact and {k: v for k, v in full.items() if k != "failures"} == compact
    assert json.loads(summary.to_json()) == full  # JSON keeps everything
    restored = ErrorSummary(**compact)  # e.g. from a checkpoint
    assert restored.failures == [] and restored.to_markdown() == summary.to_markdown()
    assert ErrorSummary(**json.loads(summary.to_json())) == summary
    with pytest.raises(ValueError, match="include_failures: expected a bool"):
        summary.to_dict(include_failures="no")
    with pytest.raises(ValueError, match="top: expected an integer of at least 1"):
        summary.to_markdown(top=0)


def test_default_digit_sum_needs_ten_classes_and_labels_in_range() -> None:
    zero = torch.zeros(2, dtype=torch.long)
    pairs = torch.tensor([[0, 1], [1, 1]])
    with pytest.raises(ValueError, match=r"combine: digit_sum adds labels as digits 0-9, but num_classes is 2"):
        summarize_errors(["noise"], zero, zero, pairs, pairs, num_classes=2)
    summary = summarize_errors(["noise"], zero, zero, pairs, pairs.flip(1), num_classes=2, combine=torch.mul)
    assert summary.failed_pairs == 0  # 0·1 = 1·0 and 1·1 = 1·1
    with pytest.raises(ValueError, match=r"predictions: expected labels in \[0, 10\), got labels in \[0, 12\]"):
        summarize_errors(["noise"], zero, zero, pairs, pairs + torch.tensor([[0, 11], [0, 0]]), num_classes=10)
    with pytest.raises(ValueError, match=r"targets: expected labels in \[0, 10\)"):
        summarize_errors(["noise"], zero, zero, pairs - 1, pairs, num_classes=10)
    with pytest.raises(ValueError, match="level: expected severity level indices >= 0"):
        summarize_errors(["noise"], zero, zero - 1, pairs, pairs, num_classes=10)
    with pytest.raises(ValueError, match="properties: expected distinct property names"):
        summarize_errors(["noise", "noise"], zero, zero, pairs, pairs, num_classes=10)
