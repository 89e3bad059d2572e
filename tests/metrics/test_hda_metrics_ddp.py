"""HDA's metrics reduce across processes: 2 gloo processes with uneven shards report what 1 process reports."""

from __future__ import annotations

from dataclasses import astuple
from pathlib import Path

import pytest
import torch
from torch import nn

from dlguard.metrics.ae_quality import AEQuality
from dlguard.metrics.global_robustness import EmpiricalGlobalRobustness
from dlguard.metrics.latent_fid import LatentFrechetDistance
from tests.quick import run_on_two_processes

N = 20
SHARDS = ((slice(0, 3), slice(3, 7)), (slice(7, 8), slice(8, 20)))  # rank 0: 7 seeds in 2 batches; rank 1: 13


def data() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    target = torch.randint(0, 3, (N,), generator=gen)
    logits = torch.randn(N, 3, generator=gen)
    seeds = torch.rand(N, 1, 12, 12, generator=gen) * 0.8
    tests = seeds + torch.rand(N, 1, 12, 12, generator=gen) * 0.1
    log_density = -300.0 + 8.0 * torch.randn(N, generator=gen, dtype=torch.float64)  # exp() is 0 in float32
    return {"logits": logits, "target": target, "seeds": seeds, "tests": tests, "log_density": log_density}


def encoder() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(144, 4))


def metrics() -> dict[str, object]:
    return {
        "rg": EmpiricalGlobalRobustness(),
        "rg_deep": EmpiricalGlobalRobustness(),  # log densities around -1000: exp() is 0 in float64 too
        "rg_rank1_only": EmpiricalGlobalRobustness(),  # rank 0 (whose result comes back) adds nothing: -inf states
        "quality": AEQuality(),
        "fid": LatentFrechetDistance(encoder(), num_features=4),
    }


def feed(every: dict[str, object], d: dict[str, torch.Tensor], part: slice, rank: int | None) -> None:
    every["rg"].update(d["logits"][part], d["target"][part], d["log_density"][part])
    every["rg_deep"].update(d["logits"][part], d["target"][part], d["log_density"][part] - 700.0)
    if rank in (1, None):
        every["rg_rank1_only"].update(d["logits"][part], d["target"][part], d["log_density"][part])
    every["quality"].update(d["logits"][part], d["target"][part], d["tests"][part], d["seeds"][part])
    every["fid"].update(d["seeds"][part], real=True)
    every["fid"].update(d["tests"][part], real=False)


def results(every: dict[str, object]) -> dict[str, object]:
    out = {name: metric.compute() for name, metric in every.items()}
    out["quality"] = astuple(out["quality"])
    return out


def _shard_results(rank: int, world: int) -> dict[str, object]:
    d, every = data(), metrics()
    for part in SHARDS[rank]:
        feed(every, d, part, rank)
    return results(every)


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_equal_one(tmp_path: Path) -> None:
    reduced = run_on_two_processes(_shard_results, tmp_path)
    d, every = data(), metrics()
    feed(every, d, slice(0, N), None)
    rank1 = EmpiricalGlobalRobustness()
    rank1.update(d["logits"][7:], d["target"][7:], d["log_density"][7:])
    single = results(every)
    single["rg_rank1_only"] = rank1.compute()

    # an independent reference: plain exp in float64 after a shift that keeps it representable
    weights = (d["log_density"] + 300.0).exp()
    correct = (d["logits"].argmax(1) == d["target"]).double()
    reference = float((weights * correct).sum() / weights.sum())
    assert 0.1 < reference < 0.9
    for name in ("rg", "rg_deep"):
        assert float(single[name]) == pytest.approx(reference, rel=1e-12)
        torch.testing.assert_close(reduced[name], single[name], rtol=1e-12, atol=0.0)
    torch.testing.assert_close(reduced["rg_rank1_only"], single["rg_rank1_only"], rtol=1e-12, atol=0.0)
    assert float(reduced["rg_rank1_only"]) != pytest.approx(reference)  # a shard alone differs from the whole

    assert int(reduced["quality"][-1]) == N  # count
    assert 0 < float(reduced["quality"][0]) < 1  # some AEs, not all
    for got, want in zip(reduced["quality"], single["quality"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reduced["fid"], single["fid"], rtol=1e-5, atol=1e-7)
    assert float(single["fid"]) > 0
