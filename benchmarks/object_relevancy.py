"""ObjectRelevancyCallback's cost against a plain validation epoch, first measurement and later ones.

    python benchmarks/object_relevancy.py [--probe 256] [--batch 256] [--repeats 3] [--device cpu|cuda]

One ``trainer.validate`` over the 1,000 validation scenes (32x32 RGB, ``mnist_b`` on 3 channels)
without callbacks is the baseline. With ``ObjectRelevancyCallback(probe_size=--probe)`` the first
validation draws the probe set and generates its 22 follow-ups per scene with OpenCV (once); every
later validation only runs the model on the cached follow-ups. Printed: median seconds and the
ratio to the plain epoch, and the follow-ups per second of the first measurement.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import lightning as L
import torch

from dlguard.callbacks import ObjectRelevancyCallback
from dlguard.data import SceneDataModule
from dlguard.zoo import ClassifierModule, mnist_b


def validate(module: ClassifierModule, data: SceneDataModule, callbacks: list, device: str) -> float:
    trainer = L.Trainer(
        accelerator=device,
        devices=1,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir="/tmp/dlguard-bench-relevancy",
    )
    start = time.perf_counter()
    trainer.validate(module, datamodule=data, verbose=False)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probe", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    L.seed_everything(0, verbose=False)
    module = ClassifierModule(mnist_b(in_channels=3, input_size=32))
    data = SceneDataModule(batch_size=args.batch)
    data.setup()
    validate(module, data, [], args.device)  # warm-up

    plain, first, later = [], [], []
    for _ in range(args.repeats):
        plain.append(validate(module, data, [], args.device))
        callback = ObjectRelevancyCallback(probe_size=args.probe)
        first.append(validate(module, data, [callback], args.device))
        later.append(validate(module, data, [callback], args.device))  # same probe set: cached follow-ups
    base = statistics.median(plain)
    follow_ups = args.probe * 22
    print(f"device {args.device}, threads {torch.get_num_threads()}, probe {args.probe}, batch {args.batch}")
    print(f"{'validation epoch':44s} {'seconds':>8s} {'ratio':>6s}")
    print(f"{'plain (no callback)':44s} {base:8.2f} {1.0:6.2f}")
    print(f"{'with the callback, first (generates follow-ups)':44s} {statistics.median(first):8.2f} "
          f"{statistics.median(first) / base:6.2f}")  # fmt: skip
    print(f"{'with the callback, later epochs (cached)':44s} {statistics.median(later):8.2f} "
          f"{statistics.median(later) / base:6.2f}")  # fmt: skip
    extra = statistics.median(first) - statistics.median(later)
    print(f"follow-up generation: {follow_ups} images in about {extra:.2f} s ({follow_ups / max(extra, 1e-9):.0f} /s)")


if __name__ == "__main__":
    main()
