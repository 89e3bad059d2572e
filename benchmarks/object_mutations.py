"""Object-relevancy follow-up generation: images per second in a thread pool against one thread, and the cache.

    python benchmarks/object_mutations.py [--images 256] [--size 32] [--backgrounds 4] [--workers N] [--threads 1]

Prints, in one run on one machine, for ``--images`` digit scenes (:func:`~dlguard.data.scenes.make_scenes`
over the embedded MNIST digits, RGB ``size x size``) and ``--backgrounds`` scene backgrounds:

1. source images per second of :func:`~dlguard.augment.object_follow_ups` (all ``F = 2·backgrounds + 14``
   follow-ups of each) with ``workers=1`` (one thread, the authors' shape: one image after another) and with
   ``--workers`` threads (default: every core), their ratio, and whether both gave identical follow-ups
   (they must);
2. a :class:`~dlguard.augment.FollowUpCache` hit -- what every epoch after the first pays -- in images per
   second;
3. where one thread's time goes, by OpenCV step (timed around each of the steps of
   :mod:`dlguard.augment.functional.object_mutations`).

``--threads`` sets torch's and OpenCV's own thread pools (``cv2.setNumThreads``); the pool of ``--workers``
threads is separate. On a machine shared with other jobs, run with ``--threads 1`` and compare ratios.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import cv2
import torch
from _timing import timed

from dlguard.augment import FollowUpCache, FollowUps, object_follow_ups
from dlguard.augment.functional import object_mutations
from dlguard.data.backgrounds import scene_backgrounds
from dlguard.data.mnist import embedded_mnist
from dlguard.data.scenes import make_scenes


def identical(a: FollowUps, b: FollowUps) -> bool:
    return torch.equal(a.inputs, b.inputs) and torch.equal(a.valid, b.valid) and a.operation == b.operation


@contextmanager
def profiled() -> Iterator[dict[str, float]]:
    """Seconds spent in each OpenCV step, by wrapping the module's functions for one sequential run."""
    spent: dict[str, float] = defaultdict(float)

    def clocked(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[label] += time.perf_counter() - start
            return out

        return wrapper

    methods = {"blended": "blend (cv2.seamlessClone)", "inpainted": "inpaint (cv2.inpaint NS and Telea)"}
    saved = {name: getattr(object_mutations._Object, name) for name in methods}
    saved_blur = object_mutations._seam_blurred
    for name, label in methods.items():
        setattr(object_mutations._Object, name, clocked(label, saved[name]))
    object_mutations._seam_blurred = clocked("seam median of move / gray / colour fills", saved_blur)
    try:
        yield spent
    finally:
        for name, method in saved.items():
            setattr(object_mutations._Object, name, method)
        object_mutations._seam_blurred = saved_blur


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--backgrounds", type=int, default=4)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="threads of the parallel run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch and OpenCV threads (1 on a shared machine)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        cv2.setNumThreads(args.threads)
    digits, labels = embedded_mnist()
    scenes = make_scenes(digits[: args.images], labels[: args.images], size=args.size, seed=0)
    backgrounds, _ = scene_backgrounds(args.backgrounds, args.size, seed=1)
    images, masks = scenes.images, scenes.masks
    count = len(images)
    print(
        f"{count} digit scenes RGB {args.size}x{args.size}, {args.backgrounds} backgrounds "
        f"(F = {2 * args.backgrounds + 14} follow-ups each); CPU with {os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}, OpenCV {cv2.__version__} threads {cv2.getNumThreads()}"
    )
    print(f"torch {torch.__version__}, load average before the run: {os.getloadavg()[0]:.2f}")

    outcome: dict[str, FollowUps] = {}
    cache = FollowUpCache()
    keys = torch.arange(count)
    outcome["cached"] = cache.get_or_make(keys, images, masks, backgrounds)

    def sequential() -> None:
        outcome["sequential"] = object_follow_ups(images, masks, backgrounds, workers=1)

    def parallel() -> None:
        outcome["parallel"] = object_follow_ups(images, masks, backgrounds, workers=args.workers)

    def cache_hit() -> None:
        outcome["hit"] = cache.get_or_make(keys, images, masks, backgrounds)

    device = torch.device("cpu")
    seconds = timed({"sequential": sequential, "parallel": parallel, "hit": cache_hit}, device, args.repeats)
    same = identical(outcome["sequential"], outcome["parallel"]) and identical(outcome["sequential"], outcome["hit"])
    assert same, "the follow-ups depend on the number of workers or on the cache"
    assert cache.generated == count, "the cache generated an image twice"
    print("identical follow-ups with 1 and with several workers, and from the cache: yes")
    rows = [
        ("one thread (workers=1)", "sequential"),
        (f"thread pool (workers={args.workers})", "parallel"),
        ("cache hit (every later epoch)", "hit"),
    ]
    for label, key in rows:
        rate = count / seconds[key]
        print(
            f"{label:32s}: {rate:10.1f} images/s  {seconds[key] / count * 1e3:8.3f} ms per image  "
            f"speed-up over one thread {seconds['sequential'] / seconds[key]:8.2f}x"
        )

    with profiled() as spent:
        start = time.perf_counter()
        object_follow_ups(images, masks, backgrounds, workers=1)
        total = time.perf_counter() - start
    print(f"profile of one run with workers=1 ({total:.2f} s):")
    for part, value in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"  {part:50s} {value:8.3f} s  {value / total:6.1%}")
    rest = total - sum(spent.values())
    print(f"  {'rest (composites, margin statistics, conversions)':50s} {rest:8.3f} s  {rest / total:6.1%}")


if __name__ == "__main__":
    main()
