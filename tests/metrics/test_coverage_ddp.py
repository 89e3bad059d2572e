from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlguard.metrics import KMultisectionCoverage, NeuronBoundaryCoverage, NeuronCoverage, TopKNeuronCoverage
from dlguard.metrics.functional import NeuronRange
from tests.quick import run_on_two_processes


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


def _shard_results(rank: int, world: int) -> list:
    acts, _ = data()
    results = []
    for metric in metrics():
        metric.update({k: v[rank::world] for k, v in acts.items()})
        results.append(metric.compute())
    return results


@pytest.mark.ddp
def test_two_processes_equal_one(tmp_path: Path) -> None:
    reduced = run_on_two_processes(_shard_results, tmp_path)
    acts, _ = data()
    for metric, got in zip(metrics(), reduced, strict=True):
        metric.update(acts)
        expected = metric.compute()
        if isinstance(expected, dict):
            assert {k: float(v) for k, v in got.items()} == {k: float(v) for k, v in expected.items()}
        else:
            assert float(got) == float(expected)


def _logged_coverage(tmp_path: Path, devices: int) -> dict[str, float]:
    import csv

    from dlguard.callbacks import NeuronCoverageCallback
    from dlguard.data import MNISTDataModule
    from dlguard.zoo import ClassifierModule, pretrained
    from tests.quick import quick_trainer

    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    callback = NeuronCoverageCallback()  # profiles all 4,000 training images: each rank half of them
    trainer = quick_trainer(
        tmp_path, [callback], train_batches=1, val_batches=1.0, accelerator="cpu", devices=devices, **extra
    )
    # lr 1e-12: one step leaves the weights as they are, so both runs probe the same model
    trainer.fit(ClassifierModule(pretrained("mnist_a"), lr=1e-12), datamodule=MNISTDataModule(batch_size=250))
    with (tmp_path / "metrics.csv").open() as handle:
        row = next(row for row in csv.DictReader(handle) if row.get("coverage/nc"))
    return {key: float(value) for key, value in row.items() if key.startswith("coverage/")}


@pytest.mark.ddp
@pytest.mark.slow
def test_callback_under_ddp_spawn_equals_one_process(tmp_path: Path) -> None:
    """Coverage is a union over inputs and ranges a min/max: sharding must not change a number."""
    single = _logged_coverage(tmp_path / "one", devices=1)
    double = _logged_coverage(tmp_path / "two", devices=2)
    assert set(single) == {f"coverage/{c}" for c in ("nc", "kmnc", "nbc", "snac", "tknc")}
    assert double == pytest.approx(single, abs=1e-9)
