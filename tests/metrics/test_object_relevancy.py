from __future__ import annotations

import math

import pytest
import torch

from dlguard.metrics.functional.object_relevancy import (
    OBJECT_MUTATION_FUNCTIONS,
    class_probability_and_rank,
    detection_relevancy,
    object_relevancy,
    preserving_score,
    relevancy_weights,
    removing_score,
    unreliable,
)
from dlguard.metrics.object_relevancy import ObjectRelevancy

# the SPEC's six functions with 2 backgrounds: move ×2, blend ×2, gray, 9 colours, 2 inpaints, 2 margin statistics
FUNCTION = torch.tensor([0, 0, 1, 1, 2] + [3] * 9 + [4, 4, 5, 5])
PRESERVING = FUNCTION < 3


def reference_scores(logits, follow, target, function, preserving, valid):
    """S⁺, S⁻, S per row with plain Python numbers: probabilities by math.exp, ranks by sorting, weights by counting."""
    rows = []
    num_classes = logits.shape[1]
    for b in range(logits.shape[0]):

        def p_and_rank(row: list[float], y: int) -> tuple[float, int]:
            z = sum(math.exp(v) for v in row)
            order = sorted(range(num_classes), key=lambda k: -row[k])
            rank = 1 + sum(1 for k in order if row[k] > row[y])
            return math.exp(row[y]) / z, rank

        y = int(target[b])
        p, r = p_and_rank(logits[b].tolist(), y)
        totals = {True: 0.0, False: 0.0}
        for kind in (True, False):
            funcs = sorted({int(function[f]) for f in range(len(function)) if bool(preserving[f]) == kind})
            alive = [i for i in funcs if any(bool(valid[b, f]) and int(function[f]) == i for f in range(len(function)))]
            for i in alive:
                ops = [f for f in range(len(function)) if int(function[f]) == i and bool(valid[b, f])]
                for f in ops:
                    q, s = p_and_rank(follow[b, f].tolist(), y)
                    if kind:
                        value = (1 - abs(p - q)) * (1 - abs(s - r) / (num_classes - 1))
                    else:
                        rank_factor = 1.0 if r == num_classes else 1 - max(s - r, 0) / (num_classes - r)
                        value = 1 - (1 - max(p - q, 0) / p) * rank_factor
                    totals[kind] += value / (len(ops) * len(alive))
        rows.append((totals[True], totals[False], (totals[True] + totals[False]) / 2))
    return torch.tensor(rows, dtype=torch.float64)


def random_case(batch: int = 7, classes: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, classes, generator=gen) * 3
    follow = logits[:, None] + torch.randn(batch, len(FUNCTION), classes, generator=gen) * 2
    target = torch.randint(0, classes, (batch,), generator=gen)
    valid = torch.ones(batch, len(FUNCTION), dtype=torch.bool)
    valid[1, -2:] = False  # no margin: the removing side has 2 functions for this input
    valid[2, 2] = False  # one blend failed: the other blend weighs 1/(1·3)
    valid[3, 5:9] = False  # four colours missing
    return logits, follow, target, valid


def test_scores_by_hand() -> None:
    # p 0.9 → 0.6 and rank 1 → 3 among 10 classes: (1 - 0.3)(1 - 2/9)
    s = preserving_score(torch.tensor(0.9), torch.tensor(1), torch.tensor(0.6), torch.tensor(3), 10)
    assert float(s) == pytest.approx(0.7 * 7 / 9)
    # removing: p 0.8 → 0.2 (drop factor 1 - 0.75), rank 2 → 5 of 10 (fall factor 1 - 3/8)
    s = removing_score(torch.tensor(0.8), torch.tensor(2), torch.tensor(0.2), torch.tensor(5), 10)
    assert float(s) == pytest.approx(1 - 0.25 * (1 - 3 / 8))
    # a probability that rises and a rank that improves remove nothing
    s = removing_score(torch.tensor(0.5), torch.tensor(3), torch.tensor(0.7), torch.tensor(1), 10)
    assert float(s) == pytest.approx(0.0)
    # at the last rank the rank factor is 1 (no division by K - r = 0)
    s = removing_score(torch.tensor(0.1), torch.tensor(10), torch.tensor(0.05), torch.tensor(10), 10)
    assert float(s) == pytest.approx(0.5)
    p, r = class_probability_and_rank(torch.tensor([[1.0, 3.0, 2.0, 3.0]]), torch.tensor([2]))
    assert int(r) == 3  # two classes strictly above
    assert float(p) == pytest.approx(math.exp(2) / (math.exp(1) + 2 * math.exp(3) + math.exp(2)))


def test_weights_give_every_function_equal_say() -> None:
    _, _, _, valid = random_case()
    w = relevancy_weights(FUNCTION, valid, PRESERVING).double()
    assert torch.allclose(w[:, PRESERVING].sum(1), torch.ones(len(w), dtype=torch.float64))
    assert torch.allclose(w[:, ~PRESERVING].sum(1), torch.ones(len(w), dtype=torch.float64))
    assert w[0, 0] == pytest.approx(1 / 6) and w[0, 4] == pytest.approx(1 / 3)  # 2 moves; gray alone
    assert w[0, 5] == pytest.approx(1 / 27) and w[0, 16] == pytest.approx(1 / 6)
    assert w[1, 5] == pytest.approx(1 / 18) and w[1, 16] == 0  # no margin: M = 2 removing functions
    assert w[2, 3] == pytest.approx(1 / 3) and w[2, 2] == 0
    assert w[3, 9] == pytest.approx(1 / 15)  # five colours left


def test_matches_an_independent_reference() -> None:
    logits, follow, target, valid = random_case()
    scores = object_relevancy(logits, follow, target, FUNCTION, PRESERVING, valid)
    expected = reference_scores(logits, follow, target, FUNCTION, PRESERVING, valid)
    torch.testing.assert_close(scores.preserving, expected[:, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scores.removing, expected[:, 1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scores.score, expected[:, 2], rtol=1e-5, atol=1e-6)
    assert scores.per_function.shape == (7, 6)
    assert torch.isnan(scores.per_function[1, 5]) and not torch.isnan(scores.per_function[0]).any()
    assert ((scores.score >= 0) & (scores.score <= 1)).all()


def test_object_reader_and_background_reader_are_told_apart() -> None:
    # a planted defect: model A's inferences follow the object, model B's follow the background
    logits = torch.tensor([[6.0, 0.0, 0.0, 0.0]]).repeat(3, 1)
    target = torch.zeros(3, dtype=torch.long)
    gone = torch.tensor([0.0, 6.0, 0.0, 0.0])
    reads_object = torch.where(PRESERVING[:, None], logits[0], gone)  # (F, K)
    reads_background = torch.where(PRESERVING[:, None], gone, logits[0])
    follow = torch.stack([reads_object, reads_background, reads_object])
    scores = object_relevancy(logits, follow, target, FUNCTION, PRESERVING)
    assert scores.score[0] > 0.99 and scores.score[1] < 0.01
    assert unreliable(scores).tolist() == [False, True, False]
    assert unreliable(scores, s_low=0.0).tolist() == [False, False, False]


def test_metric_accumulates_what_the_functional_gives() -> None:
    logits, follow, target, valid = random_case(batch=12, seed=3)
    target[:6] = logits[:6].argmax(1)  # at least half correct
    functional = object_relevancy(logits, follow, target, FUNCTION, PRESERVING, valid)
    metric = ObjectRelevancy(p_high=0.5, s_low=0.6)
    for part in (slice(0, 5), slice(5, 6), slice(6, 12)):
        metric.update(object_relevancy(logits[part], follow[part], target[part], FUNCTION, PRESERVING, valid[part]))
    result = metric.compute()
    assert float(result["score"]) == pytest.approx(float(functional.score.mean()))
    assert float(result["preserving"]) == pytest.approx(float(functional.preserving.mean()))
    assert float(result["removing"]) == pytest.approx(float(functional.removing.mean()))
    flagged = unreliable(functional, 0.5, 0.6)
    assert int(result["unreliable"]) == int(flagged.sum())
    assert float(result["unreliable_rate"]) == pytest.approx(float(flagged.sum() / functional.correct.sum()))
    assert int(result["inferences"]) == 12 and float(result["histogram"].sum()) == 12
    margin = functional.per_function[:, 5]
    assert float(result["per_function"]["FillObjectWithMarginStatistic"]) == pytest.approx(
        float(margin[~torch.isnan(margin)].mean())
    )
    assert list(result["per_function"]) == list(OBJECT_MUTATION_FUNCTIONS)


def test_detection_by_hand() -> None:
    obj = torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    target = {"boxes": obj, "labels": torch.tensor([4, 4])}
    source = {
        "boxes": torch.tensor([[0.0, 0.0, 10.0, 8.0], [21.0, 20.0, 30.0, 30.0], [50.0, 50.0, 60.0, 60.0]]),
        "labels": torch.tensor([4, 4, 4]),
        "scores": torch.tensor([0.97, 0.6, 0.99]),
    }
    kept = {"boxes": torch.tensor([[0.0, 0.0, 10.0, 5.0]]), "labels": torch.tensor([4]), "scores": torch.tensor([0.9])}
    relabelled = {"boxes": obj[:1], "labels": torch.tensor([7]), "scores": torch.tensor([0.9])}
    function, preserving = torch.tensor([0, 3]), torch.tensor([True, False])
    scores = detection_relevancy(
        [source, source],
        [[kept, relabelled], [kept, kept]],
        [target, target],
        torch.tensor([0, 1]),
        function,
        preserving,
    )
    # object 0: its record has IoU 0.8; preserved follow-up IoU 0.5 → u = 0.625; removed: another label → u = 0
    # object 1: its record has IoU 0.9; follow-ups do not overlap it → u = 0; the third record overlaps nothing
    assert scores.preserving.tolist() == pytest.approx([0.625, 0.0])
    assert scores.removing.tolist() == pytest.approx([1.0, 1.0])
    assert scores.correct.tolist() == [True, True]
    assert scores.probability.tolist() == pytest.approx([0.97, 0.6])
    # each follow-up's own score: s⁺ = u of the preserving one, s⁻ = 1 − u of the removing one
    assert scores.follow_up.flatten().tolist() == pytest.approx([0.625, 1.0, 0.0, 1.0])
    metric = ObjectRelevancy(p_high=0.9, s_low=0.9)  # one metric adds detection scores alike
    metric.update(
        detection_relevancy([source], [[kept, relabelled]], [target], torch.tensor([0]), function, preserving)
    )
    assert int(metric.compute()["unreliable"]) == 1  # (0.625 + 1)/2 < 0.9 with score 0.97


def test_bad_input_is_named() -> None:
    logits, follow, target, valid = random_case()
    with pytest.raises(ValueError, match="p_high"):
        ObjectRelevancy(p_high=1.5)
    with pytest.raises(ValueError, match="s_low"):
        ObjectRelevancy(s_low=-0.1)
    with pytest.raises(ValueError, match="follow_up_logits"):
        object_relevancy(logits, follow[:, :, :3], target, FUNCTION, PRESERVING)
    with pytest.raises(ValueError, match="function"):
        object_relevancy(logits, follow, target, FUNCTION[:-1], PRESERVING[:-1])
    with pytest.raises(ValueError, match="both types"):
        object_relevancy(logits, follow, target, FUNCTION, PRESERVING.roll(1))
    no_removing = valid.clone()
    no_removing[4, ~PRESERVING] = False
    with pytest.raises(ValueError, match="valid: input 4 has no valid removing"):
        object_relevancy(logits, follow, target, FUNCTION, PRESERVING, no_removing)
    nan = follow.clone()
    nan[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="follow_up_logits: contains NaN"):
        object_relevancy(logits, nan, target, FUNCTION, PRESERVING)
    with pytest.raises(ValueError, match="scores: expected ObjectRelevancyScores"):
        ObjectRelevancy().update(logits)
    box = torch.tensor([[0.0, 0.0, 4.0, 4.0]])
    with pytest.raises(ValueError, match=r"detections: entry 0 lacks \['scores'\].*output_transform"):
        detection_relevancy(
            [{"boxes": box, "labels": torch.tensor([1])}],
            [[{"boxes": box, "labels": torch.tensor([1]), "scores": torch.ones(1)}] * 2],
            [{"boxes": box, "labels": torch.tensor([1])}],
            torch.tensor([0]),
            torch.tensor([0, 3]),
            torch.tensor([True, False]),
        )
    with pytest.raises(ValueError, match="no inferences"), pytest.warns(UserWarning, match="before the ``update``"):
        ObjectRelevancy().compute()
