"""Every callback on ``accelerator="cuda"`` reports the CPU's numbers, within a stated tolerance (skipped without CUDA).

Tolerance: the probe sets hold 64 inputs or more, and CUDA's kernels (which depend on the batch
size) may flip a prediction that sits on a decision boundary; every logged rate or accuracy is a
mean over at least 64 inputs, so two flipped predictions move it by at most 2/64 -- ``abs=0.035``.
HDA's GA is a search whose selection can take another path after one such flip: its seed choice
(the density share) is compared, its AE figures are checked to exist and lie in range.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest

from dlguard.callbacks import (
    DScoreCallback,
    HDACallback,
    MetamorphicCallback,
    NeuronCoverageCallback,
    ObjectRelevancyCallback,
    RobustnessCallback,
)
from dlguard.data import MNISTDataModule, SceneDataModule
from dlguard.zoo import ClassifierModule, mnist_b, pretrained

pytestmark = pytest.mark.gpu

TOLERANCE = 0.035


def _logged(tmp_path: Path, accelerator: str, make: Any, module: Any, data: Any) -> dict[str, float]:
    L.seed_everything(0, verbose=False)
    callback = make()
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, callbacks=[callback], logger=False, default_root_dir=tmp_path,
        limit_val_batches=4, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.validate(module(), datamodule=data(), verbose=False)
    assert callback.latest is not None
    return dict(callback.latest["logged"])


CASES = {
    "dscore": lambda: DScoreCallback(probe_size=64, budget=None),
    "coverage": lambda: NeuronCoverageCallback(max_profile_batches=4),
    "robustness": lambda: RobustnessCallback(per_class=8, budget=None),
    "metamorphic": lambda: MetamorphicCallback(probe_size=64, budget=None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_callback_on_cuda_reports_the_cpus_numbers(name: str, tmp_path: Path) -> None:
    def module() -> ClassifierModule:
        return ClassifierModule(pretrained("mnist_a"))

    def data() -> MNISTDataModule:
        return MNISTDataModule(batch_size=100)

    on_cpu = _logged(tmp_path / "cpu", "cpu", CASES[name], module, data)
    on_gpu = _logged(tmp_path / "cuda", "cuda", CASES[name], module, data)
    assert on_gpu.keys() == on_cpu.keys()
    for key, value in on_cpu.items():
        if key.endswith("/forward_passes"):
            assert on_gpu[key] == value, key  # the same sets, sized the same way
        else:
            assert on_gpu[key] == pytest.approx(value, abs=TOLERANCE), key


def test_hda_on_cuda_selects_the_cpus_seeds_and_searches(tmp_path: Path) -> None:
    def make() -> HDACallback:
        return HDACallback(k=4, probe_size=64, population=40, iterations=5, budget=None, fit_inputs=500)

    def module() -> ClassifierModule:
        return ClassifierModule(pretrained("mnist_a"))

    on_cpu = _logged(tmp_path / "cpu", "cpu", make, module, MNISTDataModule)
    on_gpu = _logged(tmp_path / "cuda", "cuda", make, module, MNISTDataModule)
    assert on_gpu["hda/seed_density"] == pytest.approx(on_cpu["hda/seed_density"], rel=1e-3)
    assert 0.0 <= on_gpu["hda/ae_proportion"] <= 1.0 and on_gpu["hda/forward_passes"] > 0


def test_object_relevancy_callback_on_cuda_reports_the_cpus_numbers(tmp_path: Path) -> None:
    def make() -> ObjectRelevancyCallback:
        return ObjectRelevancyCallback(probe_size=64, budget=None, min_accuracy=None)

    def module() -> ClassifierModule:
        L.seed_everything(0, verbose=False)
        return ClassifierModule(mnist_b(in_channels=3, input_size=32))

    def data() -> SceneDataModule:
        return SceneDataModule(batch_size=64)

    on_cpu = _logged(tmp_path / "cpu", "cpu", make, module, data)
    on_gpu = _logged(tmp_path / "cuda", "cuda", make, module, data)
    for key, value in on_cpu.items():
        assert on_gpu[key] == pytest.approx(value, abs=TOLERANCE), key
