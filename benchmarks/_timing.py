"""Timing shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def timed(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds of each function, run interleaved so that machine drift hits all alike.

    ``clock`` is the wall clock by default; ``time.process_time`` times the CPU seconds the process
    spent instead (for CPU work on a machine that other jobs share).
    """
    for fn in fns.values():
        fn()  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = clock()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in samples.items()}
