"""Metamorphic violations reduce across processes: 2 gloo processes with uneven shards = 1 process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlguard.metrics.metamorphic import MetamorphicViolations
from tests.metrics.test_metamorphic import EPSILONS, LAMBDAS, NAMES, regression_batches
from tests.quick import run_on_two_processes

BATCHES = 13
# rank 0: three batches; rank 1: the other ten (some names and parameters only on one rank)
SHARDS = ((0, 5, 11), tuple(i for i in range(BATCHES) if i not in (0, 5, 11)))
MSE_ORIG = 0.02  # over the whole probe set: every rank passes the same value


def classification_batches():
    gen = torch.Generator().manual_seed(2)
    batches = []
    for i in range(BATCHES):
        source = torch.randn(1 + i % 4, 3, generator=gen)
        batches.append(
            ("rotation" if i % 3 else "fog", i % 2, source, source + torch.randn(source.shape, generator=gen))
        )
    return batches


def fresh():
    return {
        "regression": MetamorphicViolations(NAMES, lambdas=LAMBDAS, epsilons=EPSILONS),
        "classification": MetamorphicViolations({"rotation": (3.0, 6.0), "fog": (1.0, 2.0)}, task="classification"),
    }


def feed(metrics, rows) -> None:
    regression, classification = regression_batches(seed=9, count=BATCHES), classification_batches()
    for i in rows:
        name, p, preds, target = regression[i]
        metrics["regression"].update(preds, name, p, target=target, mse_orig=MSE_ORIG)
        name, p, source, transformed = classification[i]
        metrics["classification"].update(transformed, name, p, source_outputs=source)


def _shard(rank: int, world: int):
    metrics = fresh()
    feed(metrics, SHARDS[rank])
    return {name: metric.compute() for name, metric in metrics.items()}


@pytest.mark.ddp
def test_two_processes_equal_one(tmp_path: Path) -> None:
    reduced = run_on_two_processes(_shard, tmp_path)
    metrics = fresh()
    feed(metrics, range(BATCHES))
    single = {name: metric.compute() for name, metric in metrics.items()}
    assert int(single["regression"]["total"]["violations"].sum()) > 0
    assert int(single["classification"]["total"]["violations"]) > 0
    for task, result in single.items():
        assert result.keys() == reduced[task].keys()
        for name, values in result.items():
            assert values.keys() == reduced[task][name].keys()
            for key, value in values.items():
                torch.testing.assert_close(reduced[task][name][key], value, rtol=1e-12, atol=1e-12, equal_nan=True)
