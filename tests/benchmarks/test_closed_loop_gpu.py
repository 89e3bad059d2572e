"""The GPU launcher (benchmarks/closed_loop_gpu.sh), run with a stand-in ``python`` that records its arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

# writes {first arm: [{seed, mCA}]} to --out; fails for the dscore group; the merge runs the real python
STAND_IN = """#!/usr/bin/env bash
if [[ " $* " == *" --results "* ]]; then exec {python} "$@"; fi
printf '%s\\n' "$@" > "{record}/$$.args"
args=("$@")
for ((i = 0; i < ${{#args[@]}}; i++)); do
    case "${{args[$i]}}" in --out) out="${{args[$((i + 1))]}}" ;; --seeds) seed="${{args[$((i + 1))]}}" ;;
        --arms) arm="${{args[$((i + 1))]}}" ;; esac
done
[ "$arm" = dscore ] && exit 1
echo "seed $seed $arm"
printf '{{"%s": [{{"seed": %s, "mCA": 0.5, "seconds": 1.0}}]}}' "$arm" "$seed" > "$out"
"""


def _launch(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir(exist_ok=True)
    record.mkdir(exist_ok=True)
    stand_in = bin_dir / "python"
    stand_in.write_text(STAND_IN.format(python=sys.executable, record=record))
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "JOBS": "3", "TMPDIR": str(tmp_path)}
    script = ROOT / "benchmarks" / "closed_loop_gpu.sh"
    return subprocess.run(["bash", str(script), *options], cwd=ROOT, env=env, capture_output=True, text=True)


def test_one_process_per_group_and_seed_options_intact_and_a_failed_one_leaves_the_others_merged(
    tmp_path: Path,
) -> None:
    out = tmp_path / "merged.json"
    done = _launch(tmp_path, str(out), "--setting=scenes", "--seeds", "4", "5", "--hda", "k=(1, 2)", "budget=None")
    assert done.returncode == 1 and "dscore_s4.log" in done.stderr  # the failed group is named
    calls = [path.read_text().splitlines() for path in (tmp_path / "record").glob("*.args")]
    assert len(calls) == 8 * 2  # seven groups and, on the scenes, relevancy's; two seeds each
    assert all(call[call.index("--hda") + 1 : call.index("--hda") + 3] == ["k=(1, 2)", "budget=None"] for call in calls)
    merged = json.loads(out.read_text())
    assert list(merged) == ["plain", "augmix", "trivialaugment", "robustness", "hda", "metamorphic", "relevancy"]
    assert all([run["seed"] for run in runs] == [4, 5] for runs in merged.values())


@pytest.mark.parametrize(
    ("options", "said"),
    [((), "usage"), (("x.json", "--arms", "plain"), "--arms: this script chooses"), (("x.json", "--seeds"), "--seeds")],
)
def test_bad_invocations_are_refused_before_any_process_starts(
    tmp_path: Path, options: tuple[str, ...], said: str
) -> None:
    done = _launch(tmp_path, *options)
    assert done.returncode == 2 and said in done.stderr
    assert not list((tmp_path / "record").glob("*.args"))
