from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import dlguard.report
import dlguard.utilities.plot
from dlguard.report import plot_training_curves

ROOT = Path(__file__).resolve().parents[2]


def run_fresh(code: str, backend: str = "svg") -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``MPLBACKEND=backend``."""
    env = {**os.environ, "MPLBACKEND": backend, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_importing_dlguard_leaves_the_backend_alone() -> None:
    result = run_fresh(
        """
        import matplotlib
        before = matplotlib.rcParams["backend"]
        import dlguard.report, dlguard.metrics, dlguard.callbacks
        print(before, matplotlib.rcParams["backend"])
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["svg", "svg"]


def test_figures_save_as_png_without_pyplot_or_a_backend(tmp_path: Path) -> None:
    result = run_fresh(
        f"""
        import matplotlib, torch
        from dlguard.metrics.functional import d_score
        from dlguard.report import (plot_coverage_by_layer, plot_dscore_heatmaps, plot_image_grid,
                                    plot_robustness_curves, plot_training_curves, summarize_errors)

        zero = torch.zeros(2, dtype=torch.long)
        summary = summarize_errors(["noise"], zero, zero, torch.tensor([[5, 1], [2, 3]]),
                                   torch.tensor([[6, 1], [2, 3]]), 10)
        figures = {{
            "training": plot_training_curves([{{"epoch": 0, "val_loss": 1.0, "val_acc": 0.5}}]),
            "grid": plot_image_grid(torch.rand(2, 3, 8, 8), ["a", "b"]),
            "dscore": plot_dscore_heatmaps(d_score(0.9, [0.9, 0.8, 0.85, 0.9], [0.5, 0.6, 0.7, 0.8], 10)),
            "coverage": plot_coverage_by_layer({{"nc": {{"conv": 0.5}}}}),
            "curves": plot_robustness_curves({{"noise": [0.9, 0.5]}}, {{"noise": [0.1, 0.2]}}),
            "rates": summary.plot_failure_rates(),
            "confusions": summary.plot_top_confusions(),
        }}
        import sys
        pyplot = sys.modules.get("matplotlib.pyplot")
        for name, figure in figures.items():
            figure.savefig(r"{tmp_path}/" + name + ".png")
            assert pyplot is None or not pyplot.fignum_exists(figure), name  # pyplot never saw it
        print(matplotlib.rcParams["backend"])
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "svg"
    written = sorted(path.stem for path in tmp_path.glob("*.png"))
    assert written == sorted(["training", "grid", "dscore", "coverage", "curves", "rates", "confusions"])
    assert all(path.read_bytes()[:4] == b"\x89PNG" for path in tmp_path.glob("*.png"))


def test_report_re_exports_the_plot_helpers_from_their_home() -> None:
    for name in ("plot_coverage_by_layer", "plot_dscore_heatmaps", "plot_image_grid", "plot_robustness_curves"):
        assert getattr(dlguard.report, name) is getattr(dlguard.utilities.plot, name)
        assert name in dlguard.report.__all__


@pytest.mark.parametrize(
    ("history", "message"),
    [
        ({"epoch": 0}, "history: expected a sequence of per-epoch mappings"),
        ([0.5], "history: expected one mapping"),
    ],
)
def test_training_curves_reject_bad_input(history, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plot_training_curves(history)


def test_training_curves_with_many_scalars_save_without_layout_warnings(tmp_path: Path) -> None:
    keys = ["train_loss", "val_loss", "val_acc", *(f"robustness/noise@{i}" for i in range(15))]
    figure = plot_training_curves([{"epoch": e, **dict.fromkeys(keys, 0.5)} for e in range(3)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "constrained_layout not applied because axes sizes collapsed"
        figure.savefig(tmp_path / "curves.png", dpi=120, bbox_inches="tight")
