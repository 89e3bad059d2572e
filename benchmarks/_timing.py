"""Timing shared by the benchmark scripts."""

from __future__ import annotations

import argparse
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


def add_device_and_clock(parser: argparse.ArgumentParser) -> None:
    """``--device`` (CUDA when there is one) and ``--clock`` (CPU seconds on the CPU, else wall)."""
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--clock", choices=["cpu", "wall"], default=None, help="default: cpu on the CPU, else wall")


def device_and_clock(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[torch.device, Callable[[], float], str]:
    """The device, the clock and a header line naming both (and torch) for a scenes batch of ``args.batch``."""
    device = torch.device(args.device)
    clock_name = args.clock or ("cpu" if device.type == "cpu" else "wall")
    if clock_name == "cpu" and device.type == "cuda":
        parser.error("--clock cpu: the CPU seconds leave out the GPU's; time a GPU with --clock wall")
    clock = time.process_time if clock_name == "cpu" else time.perf_counter
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    header = (f"batch {args.batch} of 3x32x32 scenes, ResNet-18, device: {name}, torch {torch.__version__}, "
              f"clock: {clock_name}")  # fmt: skip
    return device, clock, header
