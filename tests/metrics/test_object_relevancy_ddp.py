"""Object relevancy's metrics reduce across processes: 2 gloo processes with uneven shards = 1 process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlguard.metrics.functional import detection_relevancy, object_relevancy
from dlguard.metrics.object_relevancy import ObjectRelevancy
from tests.metrics.test_object_relevancy import FUNCTION, PRESERVING, random_case
from tests.quick import run_on_two_processes

SHARDS = ((slice(0, 2), slice(2, 3)), (slice(3, 11),))  # rank 0: 3 inputs in 2 batches; rank 1: 8


def data():
    logits, follow, target, valid = random_case(batch=11, seed=5)
    target[:7] = logits[:7].argmax(1)
    return logits, follow, target, valid


def detections(rows: range):
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in rows:
        boxes = torch.tensor([[4.0, 4.0, 20.0, 20.0]])
        jitter = torch.rand(len(FUNCTION), 4, generator=gen) * 12
        source = {"boxes": boxes + 1, "labels": torch.tensor([2]), "scores": torch.tensor([0.95])}
        follow = [{"boxes": boxes + j, "labels": torch.tensor([2]), "scores": torch.tensor([0.9])} for j in jitter]
        out.append((source, follow, {"boxes": boxes, "labels": torch.tensor([2])}))
    return out


def feed(metrics, part: slice) -> None:
    logits, follow, target, valid = data()
    scores = object_relevancy(logits[part], follow[part], target[part], FUNCTION, PRESERVING, valid[part])
    metrics["classification"].update(scores)
    rows = detections(range(11))[part]
    metrics["detection"].update(detection_relevancy(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], torch.zeros(len(rows), dtype=torch.long),
        FUNCTION, PRESERVING,
    ))  # fmt: skip


def fresh():
    return {"classification": ObjectRelevancy(p_high=0.5, s_low=0.7), "detection": ObjectRelevancy()}


def _shard(rank: int, world: int):
    metrics = fresh()
    for part in SHARDS[rank]:
        feed(metrics, part)
    return {name: metric.compute() for name, metric in metrics.items()}


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_equal_one(tmp_path: Path) -> None:
    reduced = run_on_two_processes(_shard, tmp_path)
    metrics = fresh()
    feed(metrics, slice(0, 11))
    single = {name: metric.compute() for name, metric in metrics.items()}
    assert int(single["classification"]["unreliable"]) > 0  # the comparison covers the flagged count too
    for name in single:
        assert int(reduced[name]["inferences"]) == 11
        for key, value in single[name].items():
            if key == "per_function":
                for function, mean in value.items():
                    torch.testing.assert_close(
                        reduced[name][key][function], mean, rtol=1e-12, atol=1e-12, equal_nan=True
                    )
            else:
                torch.testing.assert_close(reduced[name][key], value, rtol=1e-12, atol=1e-12, equal_nan=True)
