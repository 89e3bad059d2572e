#!/usr/bin/env bash
# The closed-loop benchmark on one GPU: one process per (arms, seed), JOBS side by side, then one merged file.
# Each loop runs with its controls in one process (a control follows its loop's dose); plain with dlguard.
# usage: bash benchmarks/closed_loop_gpu.sh OUT.json [--seeds 0 1 2] [other closed_loop.py options]
#   e.g. bash benchmarks/closed_loop_gpu.sh scenes.json --setting scenes --hda k=50 budget=None
# Fit times compare only within a process: the processes share the GPU and the CPU cores.
# JOBS (default 15) processes at a time; ACCELERATOR=cpu runs the same on the CPU (a check of the script).
# A process that fails (out of GPU memory, say) leaves its log; the others' files are merged all the same,
# and the script exits with status 1.
set -euo pipefail
if [ $# -lt 1 ] || [[ "$1" == --* ]]; then
    sed -n '2,9p' "$0" >&2
    exit 2
fi
out="$1"
shift
seeds=(0 1 2)
setting="mnist"
options=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seeds | --seeds=*)
            seeds=()
            if [[ "$1" == --seeds=* ]]; then seeds+=("${1#--seeds=}"); fi
            shift
            while [ $# -gt 0 ] && [[ "$1" != --* ]]; do seeds+=("$1"); shift; done
            if [ ${#seeds[@]} -eq 0 ]; then echo "--seeds: expected at least one seed" >&2; exit 2; fi
            ;;
        --arms | --arms=* | --out | --out=* | --results | --results=*)
            echo "${1%%=*}: this script chooses the arms and files of each process; run closed_loop.py for one" >&2
            exit 2
            ;;
        --setting=*) setting="${1#--setting=}"; options+=("$1"); shift ;;
        --setting)
            if [ $# -lt 2 ]; then echo "--setting: expected mnist, scenes or spurious" >&2; exit 2; fi
            setting="$2"; options+=("$1" "$2"); shift 2
            ;;
        *) options+=("$1"); shift ;;
    esac
done
groups=("plain dlguard" "augmix noise oracle" "trivialaugment randaugment" "robustness robustness-open"
    "dscore dscore-open" "metamorphic metamorphic-open" "hda hda-open hda-pgd")
[ "$setting" = "mnist" ] || groups+=("relevancy relevancy-open")  # object relevancy needs the scenes' masks
parts="$(mktemp -d)"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
status=0
for group in "${groups[@]}"; do
    for seed in "${seeds[@]}"; do
        name="${group%% *}_s${seed}"
        # shellcheck disable=SC2086  # the group's arm names split on purpose
        command=(python benchmarks/closed_loop.py --accelerator "${ACCELERATOR:-gpu}" "${options[@]}"
            --seeds "$seed" --arms $group --out "$parts/$name.json")
        printf '%q ' "${command[@]}"
        printf '> %q 2>&1 || { echo "failed, see %q" >&2; exit 1; }\n' "$parts/$name.log" "$parts/$name.log"
    done
done | xargs -d '\n' -P "${JOBS:-15}" -I{} bash -c {} || status=1
grep -h "^seed " "$parts"/*.log || true
shopt -s nullglob
files=("$parts"/*.json)
if [ ${#files[@]} -gt 0 ]; then
    python benchmarks/closed_loop.py --results "${files[@]}" --out "$out" || status=1
fi
echo "per-process logs and files: $parts"
exit "$status"
