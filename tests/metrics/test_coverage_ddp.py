from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dlguard.metrics import KMultisectionCoverage, NeuronBoundaryCoverage, NeuronCoverage, TopKNeuronCoverage
from dlguard.metrics.functional import NeuronRange
from tests.metrics.test_dscore_ddp import free_port


def data() -> tuple[dict[str, torch.Tensor], dict[str, NeuronRange]]:
    gen = torch.Generator().manual_seed(0)
    acts = {"conv": torch.randn(25, 4, 5, 5, generator=gen), "fc": torch.randn(25, 7, generator=gen)}
    ranges = {
        "conv": NeuronRange(-0.2 * torch.ones(4), 0.2 * torch.ones(4)),
        "fc": NeuronRange(-torch.ones(7), torch.ones(7)),
    }
    return acts, ranges


def metrics() -> list:
    _, ranges = data()
    sizes = {"conv": 4, "fc": 7}
    return [
        NeuronCoverage(sizes, 0.4, per_layer=True),
        KMultisectionCoverage(ranges, k=6),
        NeuronBoundaryCoverage(ranges),
        TopKNeuronCoverage(sizes, k=2),
    ]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        acts, _ = data()
        results = []
        for metric in metrics():
            metric.update({k: v[rank::world] for k, v in acts.items()})
            results.append(metric.compute())
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_two_processes_equal_one(tmp_path: Path) -> None:
    out = tmp_path / "rank0.pt"
    mp.spawn(_worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    reduced = torch.load(out, weights_only=False)
    acts, _ = data()
    for metric, got in zip(metrics(), reduced, strict=True):
        metric.update(acts)
        expected = metric.compute()
        if isinstance(expected, dict):
            assert {k: float(v) for k, v in got.items()} == {k: float(v) for k, v in expected.items()}
        else:
            assert float(got) == float(expected)
