"""Input checks shared by the functional ops (SPEC §0: float images in [0, 1])."""

from __future__ import annotations

from torch import Tensor


def check_images(images: Tensor, name: str = "images") -> None:
    """Raise ``ValueError`` unless ``images`` is a float ``(B, C, H, W)`` tensor in ``[0, 1]`` without NaN."""
    if images.ndim != 4:
        raise ValueError(f"{name}: expected (B, C, H, W), got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"{name}: expected float pixels in [0, 1], got {images.dtype}")
    # two reductions; a NaN makes amin/amax NaN and both comparisons false
    if images.numel() and not (images.amin() >= 0 and images.amax() <= 1):
        raise ValueError(f"{name}: expected values in [0, 1] without NaN")
