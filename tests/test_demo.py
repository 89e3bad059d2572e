from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlguard.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def test_dlguard_demo_fast_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    executable = shutil.which("dlguard") or str(Path(sys.executable).with_name("dlguard"))
    env = {**os.environ, "WANDB_DIR": str(tmp_path / "wandb-dir"), "WANDB_MODE": "offline"}
    result = subprocess.run(
        [executable, "demo", "--fast", "--out", str(out), "--wandb", "offline"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "validation accuracy" in result.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == 3 and len(summary["history"]) == 3
    assert summary["val_acc"] > 0.8
    # our post-fit evaluation agrees with what Lightning logged for the last epoch
    assert summary["val_acc"] == pytest.approx(summary["history"][-1]["val_acc"], abs=1e-4)
    per_class = summary["per_class_acc"].values()
    assert sum(per_class) / 10 == pytest.approx(summary["val_acc"], abs=1e-3)  # 100 images per class
    assert sum(map(sum, summary["confusion_matrix"])) == 1000
    assert summary["wandb"] == "offline" and "ModelCheckpoint" in summary["callbacks"]
    assert "DScoreCallback" in summary["callbacks"]
    dscore_history = json.loads((out / "dscore.json").read_text())
    assert [record["epoch"] for record in dscore_history] == [0, 1, 2]
    latest = dscore_history[-1]
    assert summary["dscore"]["d_score"] == pytest.approx(latest["v_fitness"] - latest["v_robust"], abs=1e-4)
    assert summary["dscore"]["guide_p"] == pytest.approx(latest["augment_probability"], abs=1e-4)
    assert 0 < latest["augment_probability"] < 1
    assert latest["probe_size"] == 500
    coverage = json.loads((out / "coverage.json").read_text())
    assert [record["epoch"] for record in coverage] == [0, 1, 2]
    assert set(summary["coverage"]) == {"nc", "kmnc", "nbc", "snac", "tknc"}
    assert all(0.0 <= value <= 1.0 for value in summary["coverage"].values())
    assert summary["coverage"]["nc"] == pytest.approx(coverage[-1]["nc"], abs=1e-4)
    robustness = json.loads((out / "robustness.json").read_text())
    assert [record["epoch"] for record in robustness] == [0, 1, 2]
    assert {"noise", "rotation", "brightness", "noise@0.3"} <= set(summary["robustness"])
    assert summary["robustness"]["noise"] == pytest.approx(sum(robustness[-1]["local"]["noise"]["lr_p"]) / 5, abs=1e-4)
    error_summary = json.loads((out / "error_summary.json").read_text())
    assert error_summary["pairs"] == 300 * 5 * 3 and "# Error summary" in (out / "error_summary.md").read_text()
    figures = ("training_curves", "confusion_matrix", "misclassified", "dscore_distributions", "coverage_by_layer")
    figures += ("robustness_curves",)
    for name in (f"{figure}.png" for figure in figures):
        assert name in summary["figures"] and (out / name).read_bytes()[:8] == PNG
    assert (out / "metrics.csv").is_file() and list((out / "checkpoints").glob("*.ckpt"))
    offline_runs = list((out / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1 and list(offline_runs[0].rglob("training_curves_*.png"))
    # with a WandbLogger attached, the D-Score callback sends its heatmaps to W&B, one per epoch
    assert len(list(offline_runs[0].rglob("dscore/distributions_*.png"))) == 3
    # and the coverage callback its per-layer bar charts, as W&B tables
    assert list(offline_runs[0].rglob("coverage/by_layer/nc*table.json"))
    # robustness curves, one chart per property over its own levels, and the error summary files
    assert list(offline_runs[0].rglob("robustness/curve/rotation*table.json"))
    assert list(offline_runs[0].rglob("files/robustness/error_summary.json"))
    assert list(offline_runs[0].rglob("files/robustness/error_summary.md"))
    # every callback measured, and the failures four of them found were replayed into training
    names = {"MetamorphicCallback", "HDACallback", "ObjectRelevancyCallback", "FailureReplay"}
    assert names <= set(summary["callbacks"])
    metamorphic = json.loads((out / "metamorphic.json").read_text())
    assert [record["epoch"] for record in metamorphic] == [0, 1, 2]
    assert 0 < summary["metamorphic"]["violation_rate"] < 1
    assert {"ae_proportion", "seed_density"} <= set(summary["hda"])
    assert {"score", "preserving", "removing", "unreliable_rate"} <= set(summary["relevancy"])
    assert all(value == value for part in ("hda", "metamorphic", "relevancy") for value in summary[part].values())
    bank = summary["replay"]["bank"]
    assert bank.get("robustness", 0) > 0 and bank.get("metamorphic", 0) > 0
    assert summary["replay"]["replayed_rows"] > 0


def test_demo_without_wandb_writes_no_wandb_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--epochs", "1", "--out", str(tmp_path), "--wandb", "disabled"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["wandb"] == "disabled" and summary["epochs"] == 1
    assert not (tmp_path / "wandb").exists()
    assert "run folder" in capsys.readouterr().out


def test_demo_rejects_bad_epochs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--epochs", "0"])
    assert "--epochs: expected at least 1" in capsys.readouterr().err
