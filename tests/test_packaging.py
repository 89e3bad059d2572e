"""pyproject's lower bounds are exactly the versions `.ci/run`'s floors leg installs and tests."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _floors() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "floors.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_every_dependency_has_a_pinned_floor_that_ci_installs() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = _floors()
    for requirement in dependencies:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9A-Za-z.]*)", requirement)
        assert match, f"{requirement!r}: a runtime dependency needs a plain lower bound (name>=version)"
        name, lower = match[1].lower(), match[2]
        assert floors.get(name) == lower, f"{name}: pyproject says >={lower}, .ci/floors.txt pins {floors.get(name)}"


def test_ci_runs_the_floors_leg_with_the_constraints_file() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert "-c .ci/floors.txt" in script and ".ci/versions.py" in script
