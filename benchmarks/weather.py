"""Fog and rain throughput against albumentations and kornia, in one run on one machine.

    pip install -e ".[bench]"          # albumentations, only for this comparison
    python benchmarks/weather.py [--batch 64] [--size 224] [--device cpu|cuda]

Images per second on RGB ``size x size`` batches: dlguard's RandomFog against albumentations'
RandomFog (one uint8 HWC image at a time, as it is used in a DataLoader), and dlguard's RandomRain
against albumentations' RandomRain and kornia's RandomRain (batched). Every transform is applied
with probability 1 at a middle severity. Targets on CPU: fog at least 50x albumentations'
RandomFog; rain at least as fast as kornia's RandomRain.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from _timing import timed
from kornia.augmentation import RandomRain as KorniaRain

from dlguard.augment import RandomFog, RandomRain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"RGB {args.size}x{args.size}, batch {args.batch}, device: {name}, torch {torch.__version__}")

    torch.manual_seed(0)
    batch = torch.rand(args.batch, 3, args.size, args.size, device=device)
    ours_fog, ours_rain = RandomFog(severity=3, p=1.0), RandomRain(severity=3, p=1.0)
    kornia_rain = KorniaRain(p=1.0, number_of_drops=(1000, 2000), drop_height=(5, 20), drop_width=(-5, 5))
    seconds = timed(
        {
            "dlguard RandomFog": lambda: ours_fog(batch),
            "dlguard RandomRain": lambda: ours_rain(batch),
            "kornia RandomRain": lambda: kornia_rain(batch),
        },
        device,
        args.repeats,
    )
    try:
        import albumentations as A
    except ImportError:
        print("albumentations is not installed (pip install -e '.[bench]'): skipping its baselines")
    else:
        frames = [
            (image.permute(1, 2, 0).cpu().numpy() * 255).astype(np.uint8) for image in batch
        ]  # its native input: uint8 HWC, one image per call
        album_fog = A.RandomFog(fog_coef_range=(0.5, 0.5), alpha_coef=0.08, p=1.0)
        album_rain = A.RandomRain(p=1.0)
        seconds |= timed(
            {
                "albumentations RandomFog": lambda: [album_fog(image=f)["image"] for f in frames],
                "albumentations RandomRain": lambda: [album_rain(image=f)["image"] for f in frames],
            },
            torch.device("cpu"),
            args.repeats,
        )
    results = {label: args.batch / value for label, value in seconds.items()}  # images per second
    for label, rate in results.items():
        print(f"{label:<27}: {rate:10.1f} images/s")
    fog, rain, kornia = results["dlguard RandomFog"], results["dlguard RandomRain"], results["kornia RandomRain"]
    if "albumentations RandomFog" in results:
        print(f"fog : dlguard / albumentations = {fog / results['albumentations RandomFog']:.1f}x (target >= 50x)")
        print(f"rain: dlguard / albumentations = {rain / results['albumentations RandomRain']:.1f}x")
    print(f"rain: dlguard / kornia         = {rain / kornia:.2f}x (target >= 1x)")


if __name__ == "__main__":
    main()
