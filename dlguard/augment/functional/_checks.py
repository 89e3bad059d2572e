"""Input checks shared by the functional ops (SPEC §0: float images in [0, 1])."""

from __future__ import annotations

from torch import Tensor


def check_images(images: Tensor, name: str = "images") -> None:
    """Raise ``ValueError`` unless ``images`` is a float ``(B, C, H, W)`` tensor in ``[0, 1]``."""
    if images.ndim != 4:
        raise ValueError(f"{name}: expected (B, C, H, W), got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"{name}: expected float pixels in [0, 1], got {images.dtype}")
    if images.numel() and (images.isnan().any() or images.min() < 0 or images.max() > 1):
        raise ValueError(f"{name}: expected values in [0, 1] without NaN")
