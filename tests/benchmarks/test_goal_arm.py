"""README's callbacks for the anchored run are the benchmark's anchored arm, argument for argument."""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import anchor
import closed_loop as cl  # scripts beside the package, not part of it

from dlguard.data import FailureBank

README = (Path(__file__).parents[2] / "README.md").read_text()
MARK = "KeepOriginals(batch_keys=keys),  # the loader's rows beside the loops' own"

PROJECT_OWN = {"batch_keys", "preprocess", "masks", "accessor", "training"}
"""What a project sets for its own batches and network (dict keys, normalisation, the mask's key), not the arm."""


BANK_ARGUMENTS = tuple(inspect.signature(FailureBank).parameters)


def readme_callbacks() -> list:
    (block,) = [code for code in re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M) if MARK in code]
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(block, "README.md", "exec"), namespace)
    return namespace["callbacks"]


def benchmark_callbacks(monkeypatch: pytest.MonkeyPatch) -> list:
    """The anchored arm of README's "Against the goal": `anchor.py --on noise --arms dlguard --properties framework
    capture --combine dscore robustness hda metamorphic relevancy --guide strength=0.125 --padding
    "padding_mode='reflection'" --dscore "p_from='unpadded'" start_epoch=2`, seed 0, as `closed_loop.main` sets
    those flags."""
    monkeypatch.setattr(cl, "ON", ["noise"])
    monkeypatch.setattr(cl, "COMBINED", ["dscore", "robustness", "hda", "metamorphic", "relevancy"])
    monkeypatch.setattr(cl, "PROPERTIES", ["framework", "capture"])
    for name, given in {
        "guide": {"strength": 0.125},
        "padding": {"padding_mode": "reflection"},
        "dscore": {"p_from": "unpadded", "start_epoch": 2},
    }.items():
        monkeypatch.setitem(cl.OPTIONS, name, given)
    pictures, labels = torch.rand(20, 3, 32, 32), torch.arange(20) % 10
    setting = cl.Setting(
        (pictures, labels), (pictures, labels), (pictures, labels), cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32)
    )
    arm, _ = anchor.anchored(cl.make_arm("dlguard", setting, 0, {}))
    return [c for c in arm.callbacks if not isinstance(c, cl.Underneath | cl.Dose)]  # the harness's own


def configured(thing: Any) -> dict[str, Any]:
    """``thing``'s public settings: scalars, containers of them, its properties and its guide's and bank's settings."""
    out: dict[str, Any] = {}
    for name, value in vars(thing).items():
        if name.startswith("_") or name in PROJECT_OWN:
            continue
        if name == "properties":
            out[name] = [(p.name, tuple(p.levels), p.deterministic) for p in value]
        elif name == "guide":
            out[name] = None if value is None else (type(value).__name__, configured(value))
        elif name == "bank":  # the benchmark's bank is a FailureBank that also records its deposits: its arguments
            out[name] = None if value is None else {arg: getattr(value, arg) for arg in BANK_ARGUMENTS}
        elif isinstance(value, bool | int | float | str | None | tuple | list | dict):
            out[name] = value
    return out


def test_readme_s_anchored_callbacks_are_the_benchmark_s_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    readme, benchmark = readme_callbacks(), benchmark_callbacks(monkeypatch)
    assert [type(c).__name__ for c in readme] == [type(c).__name__ for c in benchmark]
    for mine, theirs in zip(readme, benchmark, strict=True):
        assert configured(mine) == configured(theirs), type(mine).__name__
    for callbacks in (readme, benchmark):  # one bank, which every loop fills and the replay draws from
        replay = next(c for c in callbacks if isinstance(c, cl.FailureReplay))
        banked = [type(c).__name__ for c in callbacks if getattr(c, "bank", None) is replay.bank]
        assert banked == ["RobustnessCallback", "HDACallback", "MetamorphicCallback", "ObjectRelevancyCallback",
                          "FailureReplay"]  # fmt: skip

    # the comparison reads the settings that make the arm: the goal's own arguments are among them
    dscore, robustness = configured(readme[0]), configured(readme[1])
    assert dscore["p_from"] == "unpadded" and dscore["start_epoch"] == 2
    assert dscore["guide"][0] == "ScoreGuidedPadding" and "reflection" in str(dscore["guide"][1])
    assert robustness["guide"][1]["strength"] == 0.125
    assert {"reduced_contrast", "defocus", "low_resolution"} <= {name for name, *_ in robustness["properties"]}
