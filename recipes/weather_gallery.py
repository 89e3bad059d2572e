"""Fog and rain at severities 1-5 on real photographs and on MNIST digits, in one figure.

    python recipes/weather_gallery.py [--out docs/images/weather_gallery.png]

Rows: the two photos scikit-learn ships (``load_sample_images``, resized to 224x224) and an
embedded MNIST digit; columns: clean, fog 1-5, rain 1-5. Seeded, so the figure is reproducible.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from matplotlib.figure import Figure
from sklearn.datasets import load_sample_images
from torch.nn import functional as F

from dlguard.augment import RandomFog, RandomRain
from dlguard.data import MNISTDataModule


def sample_photos(size: int = 224) -> torch.Tensor:
    photos = torch.stack([torch.tensor(p) for p in load_sample_images().images]).permute(0, 3, 1, 2).float() / 255
    return F.interpolate(photos, size=(size, size), mode="bilinear", antialias=True).clamp(0, 1)


def digit(size: int = 224) -> torch.Tensor:
    dm = MNISTDataModule()
    dm.setup()
    image = dm.val_set[0][0][None].expand(1, 3, 28, 28)
    return F.interpolate(image, size=(size, size), mode="nearest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("docs/images/weather_gallery.png"))
    args = parser.parse_args()
    torch.manual_seed(0)
    images = torch.cat([sample_photos(), digit()])
    columns = [("clean", images)]
    for name, effect in (("fog", RandomFog), ("rain", RandomRain)):
        columns += [(f"{name} {s}", effect(severity=s, p=1.0)(images)) for s in range(1, 6)]
    figure = Figure(figsize=(1.6 * len(columns), 1.7 * len(images)))
    axes = figure.subplots(len(images), len(columns))
    for col, (title, batch) in enumerate(columns):
        for row in range(len(images)):
            axes[row, col].imshow(batch[row].permute(1, 2, 0).numpy())
            axes[row, col].axis("off")
        axes[0, col].set_title(title, fontsize=9)
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=90)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
