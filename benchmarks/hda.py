"""HDA's two-step GA: all seeds' populations in one batch against one seed at a time, and where the time goes.

    python benchmarks/hda.py [--seeds 16] [--population 1000] [--iterations T] [--device cpu|cuda] [--threads 1]

Prints, in one run on one machine, for ``mnist_a`` and the first correctly classified validation digits:

1. seeds per second and time per seed of :func:`~dlguard.generate.genetic.two_step_ga` given every
   seed at once -- with its default chunks and passes, and with all populations in one pass --
   against the shape of the authors' implementation: one seed at a time, its population as one
   batch, the same ``N`` and ``T``; on CPU all must return identical test cases (each seed draws from
   its own generator); on CUDA, whose kernels depend on the batch size, a fitness tie can break
   another way and a seed's search take another path, so the three must agree within a tolerance:
   the seeds that found an AE may differ by a tenth of the seeds, and every test case lies in its
   seed's ball;
2. a profile of the batched run: model forward, random numbers, fitness and perceptual quality,
   and the rest (elite, parent choice, crossover, mutation, projection).

``T`` defaults to 100 (the paper's) on CUDA and 10 on CPU, where 16 seeds x 1000 individuals x 101
forward passes of mnist_a take minutes; the cost per iteration is flat, so seeds per second scale as
``1 / (T + 1)``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from _timing import timed

from dlguard.data import MNISTDataModule
from dlguard.generate import genetic
from dlguard.generate.genetic import GAResult, two_step_ga
from dlguard.probes.adapter import ModelAdapter
from dlguard.zoo import pretrained


def correct_seeds(net: torch.nn.Module, count: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    dm = MNISTDataModule()
    dm.setup()
    images = torch.stack([dm.val_set[i][0] for i in range(10 * count)]).to(device)
    labels = torch.tensor([dm.val_set[i][1] for i in range(10 * count)], device=device)
    with torch.no_grad():
        right = net(images).argmax(1) == labels
    return images[right][:count], labels[right][:count]


def identical(a: GAResult, b: GAResult) -> bool:
    names = ("examples", "found", "loss", "quality", "first_success", "ae_proportion")  # logits: last bits vary
    return all(torch.equal(getattr(a, n).nan_to_num(-7.0), getattr(b, n).nan_to_num(-7.0)) for n in names)


def agree(a: GAResult, b: GAResult, seeds: torch.Tensor, radius: float, device: torch.device) -> bool:
    """Identical on CPU; on CUDA the same number of seeds with an AE give or take a tenth, every case in its ball."""
    if device.type != "cuda":
        return identical(a, b)
    slack = max(1, len(seeds) // 10)
    within = all(
        bool(((r.examples - seeds[:, None]).abs().amax() <= radius + 1e-5).item()) for r in (a, b)
    )  # fmt: skip
    return within and abs(int(a.success.sum()) - int(b.success.sum())) <= slack


def one_at_a_time(results: list[GAResult]) -> GAResult:
    fields = {
        n: torch.cat([getattr(r, n) for r in results]) for n in ("examples", "found", "loss", "logits", "quality")
    }
    fields |= {n: torch.cat([getattr(r, n) for r in results]) for n in ("first_success", "ae_proportion")}
    return GAResult(iterations=results[0].iterations, **fields)


@contextmanager
def profiled(device: torch.device) -> Iterator[dict[str, float]]:
    """Seconds spent in the model, the random draws and the fitness, by wrapping them for one run."""
    spent: dict[str, float] = defaultdict(float)

    def clocked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            spent[name] += time.perf_counter() - start
            return out

        return wrapper

    saved = (ModelAdapter.logits, genetic._breeding_draws, genetic._minmax, genetic.perceptual_quality)
    ModelAdapter.logits = clocked("model forward (logits)", ModelAdapter.logits)  # type: ignore[method-assign]
    genetic._breeding_draws = clocked("random numbers (per-seed loop)", genetic._breeding_draws)
    genetic._minmax = clocked("fitness: min-max", genetic._minmax)
    genetic.perceptual_quality = clocked("fitness: perceptual quality", genetic.perceptual_quality)
    try:
        yield spent
    finally:
        ModelAdapter.logits, genetic._breeding_draws, genetic._minmax, genetic.perceptual_quality = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--population", type=int, default=1000)
    parser.add_argument("--iterations", type=int, default=None, help="T (default 100 on cuda, 10 on cpu)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (1 on a machine shared with others)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    iterations = args.iterations if args.iterations is not None else (100 if device.type == "cuda" else 10)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"mnist_a, {args.seeds} seeds, N = {args.population}, T = {iterations}, device: {name}")
    print(f"torch {torch.__version__}, load average before the run: {os.getloadavg()[0]:.2f}")

    net = pretrained("mnist_a", map_location=device)
    seeds, labels = correct_seeds(net, args.seeds, args.device)
    options = {"population": args.population, "iterations": iterations}
    outcome: dict[str, GAResult] = {}

    def batched() -> None:
        outcome["batched"] = two_step_ga(net, seeds, labels, 0.1, **options)

    def per_seed() -> None:
        one = {**options, "max_batch": args.population}  # the population as one batch
        runs = [two_step_ga(net, seeds[i : i + 1], labels[i : i + 1], 0.1, **one) for i in range(len(seeds))]
        outcome["per_seed"] = one_at_a_time(runs)

    def one_pass() -> None:
        outcome["one_pass"] = two_step_ga(net, seeds, labels, 0.1, **options, max_elements=2**26, max_batch=10**9)

    times = timed({"per_seed": per_seed, "batched": batched, "one_pass": one_pass}, device, args.repeats)
    for other, what in (("per_seed", "batched and per-seed results differ"),
                        ("one_pass", "results depend on chunking or pass size")):  # fmt: skip
        assert agree(outcome["batched"], outcome[other], seeds, 0.1, device), what
    found = int(outcome["batched"].success.sum())
    how = "identical test cases" if device.type != "cuda" else "test cases agreeing within the tolerance"
    print(f"{how} all three ways: yes; AEs found for {found} of {len(seeds)} seeds at r = 0.1")
    rows = [
        ("one seed at a time (authors' shape)", "per_seed"),
        ("all seeds, default chunks and passes", "batched"),
        ("all seeds in one pass (2**26 budget)", "one_pass"),
    ]
    for label, key in rows:
        seconds = times[key]
        print(
            f"{label:38s}: {len(seeds) / seconds:8.3f} seeds/s  {seconds / len(seeds) * 1e3:9.1f} ms per seed  "
            f"speed-up over one at a time {times['per_seed'] / seconds:5.2f}x"
        )

    with profiled(device) as spent:
        start = time.perf_counter()
        batched()
        total = time.perf_counter() - start
    print(f"profile of one batched run ({total:.2f} s):")
    for part, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"  {part:34s} {seconds:8.3f} s  {seconds / total:6.1%}")
    rest = total - sum(spent.values())
    print(f"  {'rest (elite, parents, crossover...)':34s} {rest:8.3f} s  {rest / total:6.1%}")


if __name__ == "__main__":
    main()
