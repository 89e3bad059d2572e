#!/usr/bin/env bash
# The closed-loop benchmark on one GPU: one process per (arms, seed), JOBS side by side, then one merged file.
# Each loop runs with its controls in one process (a control follows its loop's dose); plain with dlguard.
# usage: bash benchmarks/closed_loop_gpu.sh OUT.json [closed_loop.py options, e.g. --setting scenes --seeds 0 1 2]
# Fit times compare only within a process: the processes share the GPU and the CPU cores.
# ACCELERATOR=cpu runs the same on the CPU (a check of the script, not a benchmark).
set -euo pipefail
out="$1"
shift
seeds=(0 1 2)
options=()
while [ $# -gt 0 ]; do
    if [ "$1" = "--seeds" ]; then
        shift
        seeds=()
        while [ $# -gt 0 ] && [[ "$1" != --* ]]; do seeds+=("$1"); shift; done
    else
        options+=("$1")
        shift
    fi
done
groups=("plain dlguard" "augmix noise" "trivialaugment randaugment" "robustness robustness-open"
    "dscore dscore-open" "metamorphic metamorphic-open" "hda hda-open hda-pgd" "relevancy relevancy-open")
setting="mnist"
for ((i = 0; i < ${#options[@]}; i++)); do [ "${options[$i]}" = "--setting" ] && setting="${options[$((i + 1))]}"; done
[ "$setting" = "mnist" ] && groups=("${groups[@]:0:7}")  # object relevancy needs the scenes' masks
parts="$(mktemp -d)"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
for group in "${groups[@]}"; do
    for seed in "${seeds[@]}"; do
        name="${group%% *}_s${seed}"
        echo "python benchmarks/closed_loop.py --accelerator ${ACCELERATOR:-gpu} ${options[*]} --seeds $seed --arms $group --out $parts/$name.json > $parts/$name.log 2>&1"
    done
done | xargs -P "${JOBS:-15}" -I{} bash -c {}
grep -h "^seed " "$parts"/*.log
python benchmarks/closed_loop.py --results "$parts"/*.json --out "$out"
echo "per-process logs and files: $parts"
