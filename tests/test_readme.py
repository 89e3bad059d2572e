"""Every Python block of README.md runs as written, on its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


def _cases() -> list:
    cases = []
    for index, code in enumerate(BLOCKS):
        first = next(line for line in code.splitlines() if line.strip() and not line.startswith(("import", "from")))
        marks = [pytest.mark.slow] if ".fit(" in code else []  # blocks that train take a minute or more
        cases.append(pytest.param(code, id=f"{index}:{first[:40]}", marks=marks))
    return cases


def test_the_readme_has_its_tour() -> None:
    assert len(BLOCKS) >= 7
    assert any("batch_keys=" in code and "preprocess=" in code and ".fit(" in code for code in BLOCKS)
    # an RGB project of the user's own: ResNet-18, normalisation, dict batches, every callback, a budget
    rgb = [code for code in BLOCKS if "resnet18" in code and ".fit(" in code]
    assert rgb and all(name in rgb[0] for name in ("budget=", '"mask"', "HDACallback", "ObjectRelevancyCallback"))


@pytest.mark.parametrize("code", _cases())
def test_block_runs_as_written(code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each block in an empty namespace (a missing import fails); blocks that train in a fresh interpreter."""
    monkeypatch.chdir(tmp_path)
    if ".fit(" not in code:
        exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
        return
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "MPLBACKEND": "Agg"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-4000:]
