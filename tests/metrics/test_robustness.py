from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlguard.augment import Property
from dlguard.augment.functional import brightness_scale
from dlguard.metrics import AdderGlobalRobustness, LocalRobustness
from dlguard.metrics.functional import adder_global_robustness, local_robustness
from tests.quick import run_on_two_processes

GAIN = 10.0


def threshold_model(images: torch.Tensor) -> torch.Tensor:
    """Class 1 when the mean pixel exceeds 0.4: logits ±GAIN·(mean − 0.4)."""
    margin = GAIN * (images.flatten(1).mean(1) - 0.4)
    return torch.stack([-margin, margin], dim=1)


def brightness_sweep() -> tuple[torch.Tensor, torch.Tensor, Property]:
    images = torch.cat([torch.full((3, 1, 4, 4), 0.2), torch.full((2, 1, 4, 4), 0.6)])
    target = torch.tensor([0, 0, 0, 1, 1])
    prop = Property("brightness", brightness_scale, (1.0, 1.5, 2.5))
    logits = torch.stack([threshold_model(prop(images, level)) for level in prop.levels])
    return logits, target, prop


def test_local_robustness_by_hand() -> None:
    # class 0 means 0.2, 0.3, 0.5 -> predicted 0, 0, 1; class 1 means 0.6, 0.9, 1.0 -> 1, 1, 1
    logits, target, _ = brightness_sweep()
    result = local_robustness(logits, target, num_classes=2)
    assert result.per_class.tolist() == [[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]]
    assert result.per_level.tolist() == [1.0, 1.0, 0.5]
    sigmoid = lambda z: 1 / (1 + torch.exp(torch.tensor(-2 * GAIN * z)))  # noqa: E731  p(true) of a ±margin pair
    expected_class0 = [float(sigmoid(0.4 - m)) for m in (0.2, 0.3, 0.5)]
    torch.testing.assert_close(result.confidence[:, 0], torch.tensor(expected_class0), rtol=1e-5, atol=1e-6)


def test_metric_accumulates_per_property_and_matches_functional() -> None:
    logits, target, prop = brightness_sweep()
    metric = LocalRobustness(num_classes=2, properties=[prop, "noise"], levels=3)
    metric.update(logits[:, :2], target[:2], "brightness")
    metric.update(logits[:, 2:], target[2:], "brightness")
    results = metric.compute()
    assert list(results) == ["brightness"]  # "noise" never received inputs
    expected = local_robustness(logits, target, 2)
    for got, want in zip(results["brightness"], expected, strict=True):
        torch.testing.assert_close(got.float(), want.float())
    figure, _ = metric.plot()
    assert [line.get_label() for line in figure.axes[0].get_lines()] == ["brightness"]


def test_adder_pairs_and_sums() -> None:
    first, second = torch.tensor([3, 2, 5, 1]), torch.tensor([4, 5, 6, 1])
    true_first, true_second = torch.tensor([3, 3, 5, 1]), torch.tensor([4, 4, 5, 1])
    overall, per_pair = adder_global_robustness((first, second), (true_first, true_second), 10)
    assert float(overall) == pytest.approx(3 / 4)  # 7=7, 7=7 (both wrong, sum right), 11!=10, 2=2
    assert float(per_pair[3, 4]) == 1.0 and float(per_pair[5, 5]) == 0.0 and float(per_pair[1, 1]) == 1.0
    assert torch.isnan(per_pair[0, 0])
    product, _ = adder_global_robustness((first, second), (true_first, true_second), 10, combine=torch.mul)
    assert float(product) == pytest.approx(2 / 4)  # 12=12, 10!=12, 30!=25, 1=1


def _shard(rank: int, world: int) -> tuple:
    logits, target, prop = brightness_sweep()
    local = LocalRobustness(num_classes=2, properties=[prop], levels=3)
    local.update(logits[:, rank::world], target[rank::world], "brightness")
    adder = AdderGlobalRobustness(num_classes=10, properties=["brightness"], levels=2)
    preds, truth = torch.arange(8) % 10, (torch.arange(8) * 3) % 10
    adder.update((preds[rank::world], truth[rank::world]), (truth[rank::world], truth[rank::world]), "brightness", 1)
    return local.compute()["brightness"], adder.compute()["brightness"]


@pytest.mark.ddp
def test_two_processes_equal_one(tmp_path: Path) -> None:
    local, adder = run_on_two_processes(_shard, tmp_path)
    logits, target, _ = brightness_sweep()
    torch.testing.assert_close(local.per_class.float(), local_robustness(logits, target, 2).per_class)
    preds, truth = torch.arange(8) % 10, (torch.arange(8) * 3) % 10
    overall, _ = adder_global_robustness((preds, truth), (truth, truth), 10)
    assert float(adder[0]) == pytest.approx(float(overall))


def test_bad_input() -> None:
    metric = LocalRobustness(num_classes=2, properties=["noise", "rotation"], levels=3)
    logits, target, _ = brightness_sweep()
    with pytest.raises(ValueError, match=r"property: unknown 'fog'; known properties: \['noise', 'rotation'\]"):
        metric.update(logits, target, "fog")
    with pytest.raises(ValueError, match="logits: expected 1 to 3 levels"):
        metric.update(torch.cat([logits, logits[:2]]), target, "noise")
    with pytest.raises(ValueError, match=r"target: expected labels in \[0, 2\)"):
        metric.update(logits, target + 1, "noise")
    with pytest.raises(ValueError, match="no inputs were added"):
        metric.compute()
    with pytest.raises(ValueError, match="levels: expected severities in increasing order"):
        Property("rotation", brightness_scale, (10.0, 5.0))
    adder = AdderGlobalRobustness(num_classes=10, properties=["noise"], levels=2)
    with pytest.raises(ValueError, match=r"level: expected an index in 0\.\.1"):
        adder.update((torch.tensor([1]), torch.tensor([2])), (torch.tensor([1]), torch.tensor([2])), "noise", 2)


def test_a_property_with_fewer_levels_reports_its_own_levels() -> None:
    logits, target, _ = brightness_sweep()  # three levels
    metric = LocalRobustness(num_classes=2, properties=["noise", "rotation"], levels=3)
    metric.update(logits, target, "noise")
    metric.update(logits[:2], target, "rotation")
    result = metric.compute()
    expected = local_robustness(logits, target, 2)
    assert torch.equal(result["noise"].per_level, expected.per_level)
    assert torch.equal(result["rotation"].per_level, expected.per_level[:2])  # not padded with a third level


def test_the_adder_takes_a_whole_record_in_one_update() -> None:
    """Per-pair property and level indices give the counts of one update per (property, level)."""
    generator = torch.Generator().manual_seed(0)
    pairs = 300
    preds = (torch.randint(0, 10, (pairs,), generator=generator), torch.randint(0, 10, (pairs,), generator=generator))
    truth = (torch.randint(0, 10, (pairs,), generator=generator), torch.randint(0, 10, (pairs,), generator=generator))
    prop, level = torch.randint(0, 2, (pairs,), generator=generator), torch.randint(0, 3, (pairs,), generator=generator)
    whole = AdderGlobalRobustness(num_classes=10, properties=["noise", "rotation"], levels=3)
    whole.update(preds, truth, prop, level)
    apart = AdderGlobalRobustness(num_classes=10, properties=["noise", "rotation"], levels=3)
    for p in range(2):
        for lv in range(3):
            rows = (prop == p) & (level == lv)
            apart.update(
                (preds[0][rows], preds[1][rows]), (truth[0][rows], truth[1][rows]), ["noise", "rotation"][p], lv
            )
    assert torch.equal(whole.correct, apart.correct) and torch.equal(whole.total, apart.total)
    with pytest.raises(ValueError, match=r"level: expected indices in 0\.\.2"):
        whole.update(preds, truth, prop, level + 1)


def test_adder_rejects_labels_outside_the_classes() -> None:
    good = torch.tensor([1, 2])
    for preds, targets, name in (
        ((torch.tensor([1, 10]), good), (good, good), r"preds\[0\]"),
        ((good, good), (good, torch.tensor([-1, 2])), r"targets\[1\]"),
    ):
        with pytest.raises(ValueError, match=name + r": expected labels in \[0, 10\)"):
            adder_global_robustness(preds, targets, 10)
        metric = AdderGlobalRobustness(num_classes=10, properties=["noise"], levels=1)
        with pytest.raises(ValueError, match=name + r": expected labels in \[0, 10\)"):
            metric.update(preds, targets, "noise", 0)
        assert int(metric.total.sum()) == 0
    with pytest.raises(ValueError, match=r"preds\[1\]: expected labels of shape \(2,\)"):
        adder_global_robustness((good, torch.tensor([1])), (good, good), 10)
    with pytest.raises(ValueError, match="preds: expected two label tensors"):
        adder_global_robustness(good, (good, good), 10)
    with pytest.raises(ValueError, match=r"preds\[0\]: expected integer class labels"):
        adder_global_robustness((good.float(), good), (good, good), 10)
    with pytest.raises(ValueError, match=r"level: expected an index in 0\.\.0"):
        AdderGlobalRobustness(num_classes=10, properties=["noise"], levels=1).update(
            (good, good), (good, good), "noise", 0.5
        )


def test_digit_sum_needs_ten_classes() -> None:
    pairs = (torch.tensor([0, 1, 1]), torch.tensor([1, 0, 1])), (torch.tensor([1, 0, 0]), torch.tensor([0, 1, 1]))
    with pytest.raises(
        ValueError, match=r"combine: digit_sum adds labels as digits 0-9, but num_classes is 2; pass a combine"
    ):
        AdderGlobalRobustness(num_classes=2, properties=["noise"], levels=1)
    with pytest.raises(ValueError, match="combine: digit_sum adds labels as digits 0-9"):
        adder_global_robustness(*pairs, num_classes=2)
    # a combine that fits the labels: here "are both inputs of the same class" (1 = yes)
    same = lambda a, b: (a == b).long()  # noqa: E731
    overall, per_pair = adder_global_robustness(*pairs, num_classes=2, combine=same)
    assert float(overall) == pytest.approx(2 / 3)  # pairs (0,1)->(1,0): 0=0; (1,0)->(0,1): 0=0; (1,1)->(0,1): 1!=0
    assert float(per_pair[1, 0]) == 1.0 and float(per_pair[0, 1]) == 0.5 and torch.isnan(per_pair[0, 0])
    metric = AdderGlobalRobustness(num_classes=2, properties=["noise"], levels=1, combine=same)
    metric.update(*pairs, "noise", 0)
    assert float(metric.compute()["noise"][0]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="combine: expected a callable"):
        AdderGlobalRobustness(num_classes=10, properties=["noise"], levels=1, combine="sum")


def test_local_robustness_keeps_level_values_and_plots_them() -> None:
    from matplotlib.figure import Figure

    logits, target, prop = brightness_sweep()
    noise = Property("noise", brightness_scale, (0.05, 0.1))  # fewer values than levels: padded by sweeps
    metric = LocalRobustness(num_classes=2, properties=[prop, noise], levels=3)
    assert metric.level_values == {"brightness": (1.0, 1.5, 2.5), "noise": (0.05, 0.1)}
    metric.update(logits, target, prop)  # a Property object names itself
    metric.update(logits, target, "noise")
    figure, axes = metric.plot()
    assert len(axes) == 2 and [ax.get_xlabel() for ax in axes] == ["brightness", "noise"]
    assert list(axes[0].get_lines()[0].get_xdata()) == [1.0, 1.5, 2.5]
    assert list(axes[0].get_lines()[0].get_ydata()) == [1.0, 1.0, 0.5]
    assert list(axes[1].get_lines()[0].get_xdata()) == [0.05, 0.1]  # the padded third level is not drawn
    given = Figure().subplots(1, 2)
    figure, axes = metric.plot(ax=given)
    assert figure is given[0].figure and list(axes) == list(given) and given[1].get_xlabel() == "noise"
    with pytest.raises(ValueError, match="ax: expected a sequence of 2 matplotlib Axes"):
        metric.plot(ax=given[0])
    single = LocalRobustness(num_classes=2, properties=["brightness"], levels=3)  # names: severity index
    single.update(logits, target, "brightness")
    axis = Figure().subplots()
    figure, got = single.plot(ax=axis)
    assert got is axis and figure is axis.figure and list(axis.get_lines()[0].get_xdata()) == [1, 2, 3]
    with pytest.raises(ValueError, match="levels: is 2 but property 'brightness' has 3 severity values"):
        LocalRobustness(num_classes=2, properties=[prop], levels=2)
