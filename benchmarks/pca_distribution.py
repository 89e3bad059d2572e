"""HDA's default distribution: PCADistribution's fit against the full eigendecomposition, in one run.

    python benchmarks/pca_distribution.py [--inputs 2000] [--sizes 32 64] [--repeats 3]

``HDACallback`` without a ``distribution`` fits a ``PCADistribution`` (32 components) on its first
``fit_inputs`` (2,000) training inputs before its first measurement. This times that fit on dlguard's
RGB scenes (the embedded digits on photographs and textures, upsampled for larger sizes) against
scikit-learn's exact ``covariance_eigh`` solver, what ``PCADistribution`` used until 2026-11-28, on the
same inputs, and prints the ratio and how far the two fits' components differ (``1 − |cos|``). The
baseline grows with the cube of the pixel count, so it is skipped above ``--baseline_max`` features.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from _timing import timed
from sklearn.decomposition import PCA

from dlguard.data import make_scenes
from dlguard.data.mnist import embedded_mnist
from dlguard.generate import PCADistribution


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=2000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline_max", type=int, default=3 * 32 * 32, help="largest feature count to time it on")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(f"{args.inputs} RGB scenes, 32 components, CPU, {threads} thread(s), torch {torch.__version__}")
    digits, labels = embedded_mnist()
    scenes = make_scenes(digits[: args.inputs], labels[: args.inputs], seed=0).images
    for size in args.sizes:
        images = scenes if size == 32 else torch.nn.functional.interpolate(scenes, size=size, mode="bilinear")
        flat = images.reshape(len(images), -1).double().numpy()
        fns = {"dlguard": lambda images=images: PCADistribution().fit(images)}
        if flat.shape[1] <= args.baseline_max:
            fns["covariance_eigh"] = lambda flat=flat: PCA(32, svd_solver="covariance_eigh").fit(flat)
        seconds = timed(fns, torch.device("cpu"), args.repeats)
        line = f"{size}x{size} ({flat.shape[1]} features): PCADistribution {seconds['dlguard']:.2f} s"
        if "covariance_eigh" in seconds:
            ours = PCADistribution().fit(images)._components.double().numpy()
            exact = PCA(32, svd_solver="covariance_eigh").fit(flat).components_
            gap = float(np.abs(1 - np.abs((ours * exact).sum(1))).max())
            ratio = seconds["covariance_eigh"] / seconds["dlguard"]
            line += f", covariance_eigh {seconds['covariance_eigh']:.2f} s: {ratio:.1f}x faster; 1 − |cos| ≤ {gap:.0e}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
