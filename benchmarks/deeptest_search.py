"""DeepTest's coverage-guided greedy search: several explorations per forward pass against one at a time.

    python benchmarks/deeptest_search.py [--seeds 100] [--lanes 1 16] [--threshold 0.6] [--device cpu|cuda]

Prints, in one run on one machine, for ``mnist_b`` and the first ``--seeds`` MNIST validation
digits as seeds, with DeepTest's transformations (:func:`~dlguard.augment.properties.deeptest_properties`):
for each number of lanes, images kept per second, candidates tried per second, the speed-up of each
over one lane (Algorithm 1 as printed: one candidate per forward pass), and the coverage reached
from the seeds' coverage. Lanes change which candidates are drawn, so runs keep different images;
tries per second compares the work rate. Times are medians of interleaved runs.

The threshold defaults to 0.6, not DeepTest's 0.2: with its per-input min-max scaling, ``mnist_b``'s
100 seeds already cover every neuron at 0.2 (and 88 % at 0.5), leaving the search nothing to find;
at 0.6 they cover about 65 %, near DeepTest's own baseline figures (25-46 %, Table 6).
"""

from __future__ import annotations

import argparse
import os

import torch
from _timing import timed

from dlguard.augment.properties import deeptest_properties
from dlguard.data import MNISTDataModule
from dlguard.generate.deeptest_search import SearchResult, coverage_guided_search
from dlguard.zoo import pretrained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--threshold", type=float, default=0.6)
    parser.add_argument("--max-failed-tries", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (1 on a machine shared with others)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"mnist_b, {args.seeds} MNIST validation seeds, 12 DeepTest transformations, threshold {args.threshold}, "
          f"max_failed_tries {args.max_failed_tries}, device: {name}")  # fmt: skip
    print(f"torch {torch.__version__}, load average before the run: {os.getloadavg()[0]:.2f}")

    data = MNISTDataModule()
    data.setup()
    seeds = torch.stack([data.val_set[i][0] for i in range(args.seeds)])
    net = pretrained("mnist_b", map_location=device)
    props = deeptest_properties()
    results: dict[int, SearchResult] = {}

    def run(lanes: int) -> None:
        results[lanes] = coverage_guided_search(
            net,
            seeds,
            props,
            threshold=args.threshold,
            max_failed_tries=args.max_failed_tries,
            lanes=lanes,
        )

    times = timed({str(lanes): (lambda lanes=lanes: run(lanes)) for lanes in args.lanes}, device, args.repeats)
    base = args.lanes[0]
    base_tries = results[base].tries / times[str(base)]
    base_images = len(results[base].images) / times[str(base)]
    for lanes in args.lanes:
        result, seconds = results[lanes], times[str(lanes)]
        tries, images = result.tries / seconds, len(result.images) / seconds
        print(
            f"lanes {lanes:3d}: {seconds:6.2f} s  {len(result.images):4d} images {images:7.2f}/s  "
            f"{result.tries:5d} tries {tries:8.1f}/s  over {base} lane(s): tries/s {tries / base_tries:5.2f}x, "
            f"images/s {images / base_images if base_images else float('nan'):5.2f}x  "
            f"coverage {result.coverage_seeds:.1%} -> {result.coverage:.1%}"
        )


if __name__ == "__main__":
    main()
