from __future__ import annotations

import math

import pytest
import torch

from dlguard.augment.functional.photometric import brightness_shift
from dlguard.metrics.functional.metamorphic import (
    TASKS,
    UNFILTERED,
    MetamorphicRelation,
    check_outputs,
    classification_violations,
    is_filtered,
    passes_filter,
    regression_violations,
    squared_errors,
)
from dlguard.metrics.metamorphic import MetamorphicViolations

# ---- functional checks, by hand ----------------------------------------------------------------


def test_eq2_and_eq3_by_hand() -> None:
    target = torch.tensor([0.0, 0.5, -0.5, 0.25])
    preds = target + torch.tensor([0.5, 0.0, -0.25, 0.125])  # squared errors 0.25, 0, 0.0625, 0.015625
    assert squared_errors(preds, target).tolist() == [0.25, 0.0, 0.0625, 0.015625]
    # λ·MSE_orig = 2·0.03125 = 0.0625: "≤" holds at the bound, so 0.0625 is no violation
    assert regression_violations(preds, target, 0.03125, 2.0).tolist() == [True, False, False, False]
    flags = regression_violations(preds, target, torch.tensor(0.03125), torch.tensor([0.25, 2.0, 10.0]))
    assert flags.tolist() == [[True, True, False], [False, False, False], [True, False, False], [True, False, False]]
    # eq. 3: |MSE_trans − 0.25| against ε = 0 and 0.0625 (bounds exact in binary)
    kept = passes_filter(torch.tensor([0.25, 0.3125, 0.125, float("nan")]), 0.25, torch.tensor([0.0, 0.0625]))
    assert kept.tolist() == [[True, True], [False, True], [False, False], [False, False]]
    assert passes_filter(torch.tensor([0.25, 0.5]), torch.tensor([0.25, 0.25]), 0.0).tolist() == [True, False]


def test_classification_violations_and_outputs() -> None:
    source = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 1.0, 0.0]])
    transformed = torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 5.0], [1.0, 1.0, 0.5]])  # ties: argmax is the first
    assert classification_violations(source, transformed).tolist() == [False, True, False]
    assert check_outputs("classification", source) is source
    out = check_outputs("regression", torch.tensor([[1.0], [2.0]]))
    assert out.shape == (2,) and out.tolist() == [1.0, 2.0]


def test_filter_exemptions() -> None:
    assert UNFILTERED == ("fog", "rain", "guided")
    assert [is_filtered(n) for n in ("rotation", "fog", "rain", "guided", "rotation+fog", "blur+shear")] == [
        True, False, False, False, False, False,
    ]  # fmt: skip
    assert is_filtered("fog", unfiltered=()) and not is_filtered("rotation", unfiltered=("rotation",))


def test_relation_regression_uses_batch_mse_when_not_given() -> None:
    relation = MetamorphicRelation("regression", lam=2.0)
    target = torch.zeros(4)
    source = torch.tensor([0.5, -0.5, 0.0, 0.0])  # MSE_orig 0.125, bound 0.25
    transformed = torch.tensor([0.5, 0.75, -0.25, 0.0])  # 0.25, 0.5625, 0.0625, 0
    assert relation.violations(source, transformed, target).tolist() == [False, True, False, False]
    # given MSE_orig wins over the batch's
    assert relation.violations(source, transformed, target, mse_orig=0.03125).tolist() == [True, True, False, False]
    classification = MetamorphicRelation("classification")
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert classification.violations(logits, logits.flip(1)).tolist() == [True, True]
    assert classification.violations(logits, logits * 3).tolist() == [False, False]


# ---- metric against an independent reference ---------------------------------------------------

NAMES = {"rotation": (3.0, 6.0, 9.0), "brightness": (0.1, 0.2), "fog": (1.0, 2.0, 3.0), "rotation+fog": (0.0,)}
LAMBDAS = (1.0, 2.0, 5.0, 10.0)
EPSILONS = (0.0, 0.005, 0.02, 0.05)


def regression_batches(seed: int = 0, count: int = 14):
    """Batches ``(name, parameter index, preds, target)``: noise growing with the parameter, sizes 1..7."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    names = list(NAMES)
    for i in range(count):
        name = names[i % len(names)]
        p = int(torch.randint(len(NAMES[name]), (1,), generator=gen))
        size = 1 + int(torch.randint(7, (1,), generator=gen))
        target = torch.randn(size, generator=gen) * 0.3
        preds = target + torch.randn(size, generator=gen) * 0.1 * (1 + p)
        batches.append((name, p, preds, target))
    return batches


def reference_regression(batches, mse_orig: float) -> dict:
    """Plain Python: gather squared errors per (name, p), filter with the MSE over all of them, count by loops."""
    errors: dict[tuple[str, int], list[float]] = {}
    for name, p, preds, target in batches:
        for y_hat, y in zip(preds.tolist(), target.tolist(), strict=True):
            errors.setdefault((name, p), []).append((y_hat - y) ** 2)
    out = {}
    total = [[0] * len(EPSILONS) for _ in LAMBDAS]
    for name, values in NAMES.items():
        rows = []
        for p in range(len(values)):
            errs = errors.get((name, p), [])
            mse = sum(errs) / len(errs) if errs else math.nan
            filtered = "+" not in name and name not in ("fog", "rain", "guided")
            kept = [(not filtered) or (bool(errs) and abs(mse - mse_orig) <= e) for e in EPSILONS]
            counts = [[sum(1 for s in errs if s > lam * mse_orig) * k for k in kept] for lam in LAMBDAS]
            for li in range(len(LAMBDAS)):
                for ei in range(len(EPSILONS)):
                    total[li][ei] += counts[li][ei]
            rows.append((len(errs), mse, kept, counts))
        out[name] = rows
    return out, total


def test_regression_matches_plain_python_reference() -> None:
    batches = regression_batches()
    mse_orig = 0.02
    metric = MetamorphicViolations(NAMES, lambdas=LAMBDAS, epsilons=EPSILONS)
    for name, p, preds, target in batches:
        parameter = NAMES[name][p] if p % 2 else p  # values and indices both name a parameter
        metric.update(preds.unsqueeze(1), name, parameter, target=target, mse_orig=mse_orig)
    result = metric.compute()
    expected, total = reference_regression(batches, mse_orig)
    assert 0 < total[0][-1] < sum(len(b[2]) for b in batches)  # λ = 1, largest ε: some inputs violate, not all
    some_kept = False
    for name, rows in expected.items():
        got = result[name]
        size = len(NAMES[name])
        for p, (inputs, mse, kept, counts) in enumerate(rows):
            assert int(got["inputs"].reshape(size)[p]) == inputs
            if inputs:
                assert float(got["mse"].reshape(size)[p]) == pytest.approx(mse, rel=1e-12)
            else:
                assert math.isnan(float(got["mse"].reshape(size)[p]))
            assert got["kept"].reshape(size, -1)[p].tolist() == kept
            assert got["violations"].reshape(size, len(LAMBDAS), len(EPSILONS))[p].tolist() == counts
            some_kept |= NAMES[name] != (0.0,) and any(kept) and not all(kept)
    assert some_kept  # the filter splits some parameter across the ε values
    assert result["total"]["violations"].tolist() == total
    assert int(result["total"]["inputs"]) == sum(len(b[2]) for b in batches)
    torch.testing.assert_close(
        result["total"]["rate"], result["total"]["violations"].double() / result["total"]["inputs"].double()
    )
    assert float(result["total"]["mse_orig"]) == mse_orig


def test_classification_matches_plain_python_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    names = {"rotation": (3.0, 6.0), "fog": (1.0, 2.0, 3.0)}
    metric = MetamorphicViolations(names, task="classification")
    changed: dict[tuple[str, int], list[int]] = {}
    for i in range(9):
        name = list(names)[i % 2]
        p = (i // 2) % len(names[name])
        source = torch.randn(5, 4, generator=gen)
        transformed = source + torch.randn(5, 4, generator=gen) * (0.3 + p)
        metric.update(transformed, name, names[name][p], source_outputs=source)
        for s, t in zip(source.tolist(), transformed.tolist(), strict=True):
            changed.setdefault((name, p), []).append(int(s.index(max(s)) != t.index(max(t))))
    result = metric.compute()
    for name, values in names.items():
        assert result[name]["inputs"].tolist() == [len(changed[(name, p)]) for p in range(len(values))]
        assert result[name]["violations"].tolist() == [sum(changed[(name, p)]) for p in range(len(values))]
    assert int(result["total"]["violations"]) == sum(map(sum, changed.values())) > 0
    assert int(result["total"]["inputs"]) == 45


def test_hand_example_through_the_metric() -> None:
    metric = MetamorphicViolations({"shear": (0.1, 0.2), "rain": (1.0,)}, lambdas=(1.0, 4.0), epsilons=(0.0, 0.25))
    target = torch.zeros(4)
    mse_orig = 0.0625  # λ·MSE_orig: 0.0625 and 0.25
    # shear 0.1: squared errors 0.25, 0.0625, 0.0625, 0 → MSE 0.09375, |0.09375 − 0.0625| = 0.03125 (kept at ε 0.25)
    metric.update(torch.tensor([0.5, 0.25, -0.25, 0.0]), "shear", 0.1, target=target, mse_orig=mse_orig)
    # shear 0.2: squared errors 1, 1 → MSE 1 (filtered out at both ε)
    metric.update(torch.tensor([1.0, -1.0]), "shear", 0.2, target=target[:2], mse_orig=mse_orig)
    # rain (never filtered): squared errors 1, 0.25, 0 → 2 violations at λ 1, 1 at λ 4
    metric.update(torch.tensor([1.0, 0.5, 0.0]), "rain", 1.0, target=target[:3], mse_orig=mse_orig)
    result = metric.compute()
    assert result["shear"]["kept"].tolist() == [[False, True], [False, False]]
    assert result["shear"]["violations"].tolist() == [[[0, 1], [0, 0]], [[0, 0], [0, 0]]]
    assert result["shear"]["mse"].tolist() == [0.09375, 1.0]
    assert result["shear"]["rate"][0, 0].tolist() == [0.0, 0.25]
    assert result["rain"]["violations"].tolist() == [[[2, 2], [1, 1]]]
    assert result["rain"]["kept"].tolist() == [[True, True]]
    assert result["rain"]["inputs"].tolist() == [3]  # one parameter: still (P,), not squeezed to 0-d
    assert result["total"]["violations"].tolist() == [[2, 3], [1, 1]]
    assert int(result["total"]["inputs"]) == 9


# ---- planted defects ---------------------------------------------------------------------------


def images_and_angles() -> tuple[torch.Tensor, torch.Tensor]:
    """Images in [0.2, 0.6] whose first two pixels differ by the angle, give or take 0.05 (constant |error|)."""
    gen = torch.Generator().manual_seed(7)
    angles = torch.rand(16, generator=gen) * 0.2 - 0.1
    images = 0.2 + torch.rand(16, 1, 4, 4, generator=gen) * 0.2
    images[:, 0, 3, 3] = 0.25  # a pixel the second model reads its brightness from
    sign = torch.where(torch.rand(16, generator=gen) < 0.5, -1.0, 1.0)
    images[:, 0, 0, 0] = 0.4 + (angles + 0.05 * sign) / 2
    images[:, 0, 0, 1] = 0.4 - (angles + 0.05 * sign) / 2
    return images, angles


def steady_model(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0, 0, 0] - x[:, 0, 0, 1]  # a difference: blind to an additive brightness change


def brightness_reader(x: torch.Tensor) -> torch.Tensor:
    return steady_model(x) + 5 * (x[:, 0, 3, 3] - 0.25)  # follows the brightness: +0.1 moves it by 0.5


@pytest.mark.parametrize("task", TASKS)
def test_a_model_blind_to_the_transformation_has_no_violations_one_that_follows_it_has(task: str) -> None:
    images, angles = images_and_angles()
    before = images.clone()
    levels = (0.1, 0.2)
    names = {"brightness": levels, "fog": levels}  # fog: the same shift, but exempt from eq. 3
    results = {}
    for model in (steady_model, brightness_reader):
        metric = MetamorphicViolations(names, task=task, lambdas=(2.0, 5.0), epsilons=(0.01,))
        source = model(images)
        mse_orig = float(((source - angles) ** 2).mean())
        for name in names:
            for beta in levels:
                out = model(brightness_shift(images, beta))
                if task == "classification":  # two classes: left or right
                    metric.update(
                        torch.stack([out, -out], 1), name, beta, source_outputs=torch.stack([source, -source], 1)
                    )
                else:
                    metric.update(out, name, beta, target=angles, mse_orig=mse_orig)
        results[model.__name__] = metric.compute()
    assert torch.equal(images, before)  # the data was not changed
    steady, reader = results["steady_model"], results["brightness_reader"]
    assert steady["total"]["violations"].sum() == 0
    assert int(reader["fog"]["violations"].sum()) > len(images)
    if task == "regression":
        assert steady["brightness"]["kept"].all()  # its MSE does not move
        assert not reader["brightness"]["kept"].any()  # eq. 3 filters the drifting transformation out ...
        assert reader["brightness"]["violations"].sum() == 0  # ... so its violations do not count
        assert (reader["fog"]["rate"][:, 0] > 0.9).all()  # fog is never filtered: nearly every input violates


# ---- parameters, the torchmetrics protocol -----------------------------------------------------


def test_parameters_by_value_or_index() -> None:
    metric = MetamorphicViolations(
        {"rotation": (3.0, 6.0, 9.0), "blur": (3, 5, 7), "steps": (0, 1, 2)}, "classification"
    )
    logits = torch.tensor([[1.0, 0.0]])
    row = metric._row
    assert [row("rotation", p) for p in (3.0, 6.0, 9.0, 0, 1, 2)] == [0, 1, 2, 0, 1, 2]
    assert row("rotation", torch.tensor(6.0, dtype=torch.float32)) == 1  # a float32 level round trip
    assert row("rotation", float(torch.tensor(0.1 * 90, dtype=torch.float32))) == 2
    assert [row("blur", p) for p in (3, 5, 7, 0, 1, 2, 5.0)] == [3, 4, 5, 3, 4, 5, 4]
    assert [row("steps", p) for p in (0, 1, 2, torch.tensor(2))] == [6, 7, 8, 8]  # index = value: not ambiguous
    with pytest.raises(ValueError, match="parameter: expected one of 'rotation'"):
        metric.update(logits, "rotation", 4.0, source_outputs=logits)
    with pytest.raises(ValueError, match="parameter: expected one of 'rotation'"):
        metric.update(logits, "rotation", 3, source_outputs=logits)
    with pytest.raises(ValueError, match="ambiguous"):
        MetamorphicViolations({"size": (1, 2, 3)}, "classification").update(logits, "size", 2, source_outputs=logits)
    with pytest.raises(ValueError, match="parameter"):
        metric.update(logits, "rotation", True, source_outputs=logits)
    with pytest.raises(ValueError, match="property: unknown 'shear'"):
        metric.update(logits, "shear", 0, source_outputs=logits)


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric MetamorphicViolations was called before")
def test_forward_reset_and_update_leave_the_inputs_alone() -> None:
    batches = regression_batches(seed=4, count=8)
    stepped = MetamorphicViolations(NAMES, lambdas=LAMBDAS, epsilons=EPSILONS)
    updated = MetamorphicViolations(NAMES, lambdas=LAMBDAS, epsilons=EPSILONS)
    for name, p, preds, target in batches:
        copies = preds.clone(), target.clone()
        batch_result = stepped(preds, name, p, target=target, mse_orig=0.02)  # forward: this batch alone
        assert int(batch_result["total"]["inputs"]) == len(preds)
        updated.update(preds, name, p, target=target, mse_orig=0.02)
        assert torch.equal(preds, copies[0]) and torch.equal(target, copies[1])
    a, b = stepped.compute(), updated.compute()
    for name in a:
        for key in a[name]:
            torch.testing.assert_close(a[name][key], b[name][key], equal_nan=True)
    updated.reset()
    with pytest.raises(ValueError, match="no inputs"):
        updated.compute()


@pytest.mark.parametrize("task", TASKS)
def test_shapes_survive_dimensions_of_one(task: str) -> None:
    metric = MetamorphicViolations(
        {"bilateral_blur": (9.0,), "rotation": (3.0, 6.0)}, task, lambdas=(5,), epsilons=(0.03,)
    )
    logits = torch.tensor([[1.0, 0.0]])
    for _ in range(2):  # the second time through the clone's re-wrapped compute
        if task == "classification":
            metric.update(logits, "bilateral_blur", 9.0, source_outputs=logits)
        else:
            metric.update(torch.tensor([0.5]), "bilateral_blur", 9.0, target=torch.zeros(1), mse_orig=0.01)
        result = metric.compute()
        counts = (1, 1) if task == "regression" else ()
        assert result["bilateral_blur"]["inputs"].shape == (1,)
        assert result["bilateral_blur"]["violations"].shape == result["bilateral_blur"]["rate"].shape == (1, *counts)
        assert result["rotation"]["violations"].shape == (2, *counts)
        assert result["total"]["violations"].shape == counts and result["total"]["inputs"].shape == ()
        if task == "regression":
            assert result["bilateral_blur"]["mse"].shape == (1,) and result["bilateral_blur"]["kept"].shape == (1, 1)
            assert result["total"]["mse_orig"].shape == ()
        metric = metric.clone()


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"properties": {}}, "properties: expected a non-empty list of dlguard.augment.Property or a mapping"),
        ({"properties": ["rotation"]}, "'rotation' needs a non-empty sequence of parameter values"),
        ({"properties": {"rotation": ()}}, "'rotation' needs a non-empty sequence"),
        ({"properties": {"rotation": 3.0}}, "'rotation' needs a non-empty sequence"),
        ({"properties": {"rotation": (3.0, float("nan"))}}, "finite numbers"),
        ({"properties": {"rotation": (3.0, 3.0)}}, "twice"),
        ({"properties": {"total": (1.0,)}}, "other than 'total'"),
        ({"task": "detection"}, r"task: expected one of \('classification', 'regression'\)"),
        ({"lambdas": (5.0, 0.0)}, "lambdas: expected finite numbers > 0"),
        ({"lambdas": (-1.0,)}, "lambdas: expected finite numbers > 0"),
        ({"lambdas": (math.inf,)}, "lambdas"),
        ({"lambdas": ()}, "lambdas: expected a non-empty sequence"),
        ({"epsilons": (0.03, -0.01)}, "epsilons: expected finite numbers >= 0"),
        ({"epsilons": (float("nan"),)}, "epsilons"),
        ({"unfiltered": "fog"}, "unfiltered"),
    ],
)
def test_bad_construction(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MetamorphicViolations(**({"properties": {"rotation": (3.0,)}} | kwargs))


def test_bad_functional_input() -> None:
    preds, target = torch.zeros(3), torch.zeros(3)
    with pytest.raises(ValueError, match=r"outputs: .*a regression output; use task='regression'"):
        check_outputs("classification", torch.zeros(3))
    with pytest.raises(ValueError, match=r"source_logits: .*a regression output; use task='regression'"):
        classification_violations(torch.zeros(3, 1), torch.zeros(3, 1))
    with pytest.raises(ValueError, match=r"preds: .*class logits \(B, K\); use task='classification'"):
        squared_errors(torch.zeros(3, 4), target)
    with pytest.raises(ValueError, match="task: expected one of"):
        check_outputs("steering", preds)
    with pytest.raises(ValueError, match="transformed_preds: contains NaN"):
        regression_violations(torch.tensor([0.0, math.nan, 0.0]), target, 0.1, 5.0)
    with pytest.raises(ValueError, match="target: contains NaN"):
        regression_violations(preds, torch.tensor([0.0, math.nan, 0.0]), 0.1, 5.0)
    with pytest.raises(ValueError, match=r"target: expected labels of shape \(3,\)"):
        regression_violations(preds, torch.zeros(4), 0.1, 5.0)
    for lam in (0.0, -1.0, torch.tensor([1.0, 0.0]), math.nan):
        with pytest.raises(ValueError, match="lam: expected a finite number > 0"):
            regression_violations(preds, target, 0.1, lam)
    with pytest.raises(ValueError, match="mse_orig"):
        regression_violations(preds, target, -0.1, 5.0)
    for epsilon in (-0.01, torch.tensor([0.0, -0.01]), math.inf):
        with pytest.raises(ValueError, match="epsilon: expected a finite number >= 0"):
            passes_filter(torch.tensor([0.1]), 0.1, epsilon)
    with pytest.raises(ValueError, match="lam"):
        MetamorphicRelation("regression", lam=0.0)
    with pytest.raises(ValueError, match="task"):
        MetamorphicRelation("steering")
    with pytest.raises(ValueError, match=r"source_outputs: .*use task='classification'"):
        MetamorphicRelation("regression").violations(torch.zeros(3, 2), torch.zeros(3, 2), target)
    with pytest.raises(ValueError, match="target: the regression relation"):
        MetamorphicRelation("regression").violations(preds, preds)
    with pytest.raises(ValueError, match="transformation"):
        is_filtered("")


def test_bad_update() -> None:
    regression = MetamorphicViolations({"rotation": (3.0,)})
    classification = MetamorphicViolations({"rotation": (3.0,)}, task="classification")
    preds, target = torch.zeros(3), torch.zeros(3)
    with pytest.raises(ValueError, match=r"transformed_outputs: .*class logits \(B, K\); use task='classification'"):
        regression.update(torch.zeros(3, 5), "rotation", 3.0, target=target, mse_orig=0.1)
    with pytest.raises(ValueError, match=r"transformed_outputs: .*a regression output; use task='regression'"):
        classification.update(preds, "rotation", 3.0, source_outputs=torch.zeros(3, 5))
    with pytest.raises(ValueError, match="source_outputs: the classification relation"):
        classification.update(torch.zeros(3, 5), "rotation", 3.0)
    with pytest.raises(ValueError, match="target: the regression relation"):
        regression.update(preds, "rotation", 3.0, mse_orig=0.1)
    with pytest.raises(ValueError, match="mse_orig: the regression relation"):
        regression.update(preds, "rotation", 3.0, target=target)
    with pytest.raises(ValueError, match="mse_orig"):
        regression.update(preds, "rotation", 3.0, target=target, mse_orig=math.nan)
    with pytest.raises(ValueError, match="transformed_outputs: contains NaN"):
        regression.update(torch.tensor([0.0, math.nan, 0.0]), "rotation", 3.0, target=target, mse_orig=0.1)
    assert int(regression.inputs.sum()) == 0  # nothing was counted before the errors
    regression.update(preds, "rotation", 3.0, target=target, mse_orig=0.1)
    regression.update(preds, "rotation", 3.0, target=target, mse_orig=0.2)  # e.g. each rank's own shard MSE
    with pytest.raises(ValueError, match="mse_orig: updates were given different values"):
        regression.compute()
