"""Under ``ddp_spawn`` on 2 CPU processes, a ``p`` held by ``p_from="unpadded"`` is the same in every process."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import lightning as L
import pytest

from dlguard.augment import ScoreGuidedPadding
from dlguard.callbacks import DScoreCallback
from dlguard.data import MNISTDataModule
from dlguard.zoo import ClassifierModule, pretrained
from tests.quick import quick_trainer


class _PaddedWith(L.Callback):
    """Writes, per process, the ``p`` each training batch was padded with (after DScoreCallback's hook)."""

    def __init__(self, dscore: DScoreCallback, out: Path) -> None:
        self.dscore, self.out, self.seen = dscore, out, []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        padded = self.dscore._guide_ready()
        self.seen.append([trainer.current_epoch, self.dscore.guide.p if padded else None])

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        record = {"seen": self.seen, "guided": self.dscore.state_dict()["guided"]}
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


@pytest.mark.ddp
@pytest.mark.slow
def test_every_process_pads_with_the_p_of_the_measurement_before_padding(tmp_path: Path) -> None:
    held = DScoreCallback(n=3, budget=None, probe_size=100, guide=ScoreGuidedPadding(), p_from="unpadded")
    trainer = quick_trainer(
        tmp_path, [held, _PaddedWith(held, tmp_path)], epochs=3, train_batches=8, val_batches=4,
        accelerator="cpu", devices=2, strategy="ddp_spawn",
    )  # fmt: skip
    trainer.fit(ClassifierModule(pretrained("mnist_a").train()), datamodule=MNISTDataModule(batch_size=64))
    with (tmp_path / "metrics.csv").open() as handle:
        logged = {
            int(row["epoch"]): {key: float(value) for key, value in row.items() if value and key.startswith("dscore/")}
            for row in csv.DictReader(handle)
            if row.get("dscore/d_score")
        }
    assert sorted(logged) == [0, 1, 2]
    v_robust = [logged[epoch]["dscore/v_robust"] for epoch in (0, 1, 2)]  # p = v_robust / g(n)
    assert v_robust[2] != pytest.approx(v_robust[0], abs=1e-3)  # padding moved v_robust: holding is visible
    p = logged[0]["dscore/guide_p"]
    assert 0 < p < 1 and [logged[epoch]["dscore/guide_p"] for epoch in (1, 2)] == [p, p]
    for rank in (0, 1):  # epoch 0 unpadded; epochs 1 and 2 padded every batch at epoch 0's p, in both processes
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["seen"] == [[0, None]] * 8 + [[1, pytest.approx(p)]] * 8 + [[2, pytest.approx(p)]] * 8
        assert record["guided"] == 16
