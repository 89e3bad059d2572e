"""ImageNet-C-style corruptions at five severities from albumentations, an implementation dlguard does not share.

Fifteen corruptions in the four families of Hendrycks & Dietterich (2019) -- noise (Gaussian, shot,
ISO), blur (defocus, motion, zoom, glass), weather and digital (snow, spatter, fog, brightness,
contrast, elastic, pixelate, JPEG) -- each at severities 1-5 whose parameters grow with the
severity and are scaled for 28-32 pixel images. A grey image is corrupted as three equal channels
and averaged back. Every corruption of every image is seeded, so each arm of a benchmark is judged
on the same corrupted test set. Needs the ``bench`` extra (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

SEVERITIES = 5
_AREA_NEAREST = {"downscale": 3, "upscale": 0}  # cv2.INTER_AREA down, INTER_NEAREST up: blocks


def _table() -> dict[str, Callable[[int], object]]:
    import albumentations as A

    def pick(values: list) -> Callable[[int], object]:
        return lambda severity: values[severity - 1]

    noise, shot = pick([0.08, 0.12, 0.18, 0.26, 0.38]), pick([0.05, 0.1, 0.2, 0.35, 0.5])
    iso = pick([(0.01, 0.1), (0.02, 0.2), (0.03, 0.35), (0.04, 0.5), (0.05, 0.7)])
    defocus = pick([(1, 0.1), (2, 0.1), (2, 0.4), (3, 0.2), (3, 0.5)])
    motion, zoom = pick([3, 5, 5, 7, 9]), pick([1.06, 1.11, 1.16, 1.21, 1.26])
    glass = pick([(0.5, 1, 1), (0.6, 1, 2), (0.7, 2, 1), (0.8, 2, 2), (1.0, 2, 3)])
    snow = pick([(0.1, 1.5), (0.2, 1.8), (0.3, 2.0), (0.4, 2.3), (0.5, 2.5)])
    spatter, fog = pick([0.2, 0.35, 0.5, 0.65, 0.8]), pick([0.02, 0.03, 0.045, 0.06, 0.08])
    bright, low_contrast = pick([0.1, 0.2, 0.3, 0.4, 0.5]), pick([0.3, 0.45, 0.6, 0.7, 0.8])
    elastic = pick([(8, 4.0), (12, 4.0), (16, 4.0), (20, 3.5), (24, 3.0)])
    pixelate, jpeg = pick([0.75, 0.6, 0.45, 0.35, 0.25]), pick([30, 20, 15, 10, 7])
    return {
        "gaussian_noise": lambda s: A.GaussNoise(std_range=(noise(s), noise(s)), p=1),
        "shot_noise": lambda s: A.ShotNoise(scale_range=(shot(s), shot(s)), p=1),
        "iso_noise": lambda s: A.ISONoise(color_shift=(iso(s)[0],) * 2, intensity=(iso(s)[1],) * 2, p=1),
        "defocus_blur": lambda s: A.Defocus(radius=(defocus(s)[0],) * 2, alias_blur=(defocus(s)[1],) * 2, p=1),
        "motion_blur": lambda s: A.MotionBlur(blur_limit=(motion(s), motion(s)), p=1),
        "zoom_blur": lambda s: A.ZoomBlur(max_factor=(zoom(s), zoom(s)), p=1),
        "glass_blur": lambda s: A.GlassBlur(sigma=glass(s)[0], max_delta=glass(s)[1], iterations=glass(s)[2], p=1),
        "snow": lambda s: A.RandomSnow(snow_point_range=(snow(s)[0],) * 2, brightness_coeff=snow(s)[1], p=1),
        "spatter": lambda s: A.Spatter(mode="mud", intensity=(spatter(s), spatter(s)), p=1),
        "fog": lambda s: A.RandomFog(fog_coef_range=(0.5, 0.5), alpha_coef=fog(s), p=1),
        "brightness": lambda s: A.RandomBrightnessContrast(
            brightness_limit=(bright(s), bright(s)), contrast_limit=(0, 0), p=1
        ),
        "contrast": lambda s: A.RandomBrightnessContrast(
            brightness_limit=(0, 0), contrast_limit=(-low_contrast(s), -low_contrast(s)), p=1
        ),
        "elastic": lambda s: A.ElasticTransform(alpha=elastic(s)[0], sigma=elastic(s)[1], p=1),
        "pixelate": lambda s: A.Downscale(
            scale_range=(pixelate(s), pixelate(s)), interpolation_pair=_AREA_NEAREST, p=1
        ),
        "jpeg": lambda s: A.ImageCompression(quality_range=(jpeg(s), jpeg(s)), p=1),
    }


def _pixels(images: Tensor) -> np.ndarray:
    """``(N, H, W, 3)`` uint8 of float ``(N, C, H, W)`` images in ``[0, 1]`` (a grey image as three equal channels)."""
    rgb = images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images
    return (rgb.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).cpu().numpy()


def _images(pixels: np.ndarray, grey: bool) -> Tensor:
    """Float ``(N, C, H, W)`` in ``[0, 1]`` of ``(N, H, W, 3)`` uint8 (a grey image: the channels' mean)."""
    tensor = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255
    return tensor.mean(1, keepdim=True) if grey else tensor


def corrupt(images: Tensor, seed: int = 0) -> dict[str, Tensor]:
    """``{corruption: (5, N, C, H, W)}``: every image of ``images`` ``(N, C, H, W)`` in ``[0, 1]`` at severities 1-5."""
    import albumentations as A

    pixels, out = _pixels(images), {}
    for index, (name, make) in enumerate(_table().items()):
        levels = []
        for severity in range(1, SEVERITIES + 1):
            compose = A.Compose([make(severity)], seed=seed + 1000 * index + severity)
            corrupted = np.stack([compose(image=np.ascontiguousarray(image))["image"] for image in pixels])
            levels.append(_images(corrupted, grey=images.shape[1] == 1))
        out[name] = torch.stack(levels)
    return out


def random_corruption(fraction: float = 0.5, seed: int = 0) -> Callable[[Tensor], Tensor]:
    """Training on the judge's own corruptions: a reference, not an augmentation a user could pick.

    Each image of a batch, with probability ``fraction``, goes through one of the fifteen corruptions
    at one of its five severities, both drawn at random, with draws of its own (seeded ``seed``, not
    the judge's seeds, and neither torch's nor NumPy's global generator). How much mCA training on
    the test corruptions themselves buys tells how much there is to gain in the same fit.

    Example:
        >>> import torch
        >>> augment = random_corruption(fraction=0.5, seed=0)
        >>> x = torch.zeros(64, 1, 28, 28); x[:, :, 8:20, 12:16] = 1
        >>> out = augment(x)
        >>> out.shape, 16 < int((out != x).flatten(1).any(1).sum()) < 48  # about half of them corrupted
        (torch.Size([64, 1, 28, 28]), True)
    """
    import albumentations as A

    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction: expected a probability in [0, 1], got {fraction}")
    draws = np.random.default_rng(seed)
    composes = [
        [A.Compose([make(severity)], seed=int(draws.integers(2**31))) for severity in range(1, SEVERITIES + 1)]
        for make in _table().values()
    ]

    def apply(images: Tensor) -> Tensor:
        chosen = np.flatnonzero(draws.random(len(images)) < fraction)
        if not len(chosen):
            return images
        kinds, severities = (
            draws.integers(len(composes), size=len(chosen)),
            draws.integers(SEVERITIES, size=len(chosen)),
        )
        pixels = _pixels(images[torch.as_tensor(chosen)])
        corrupted = np.stack(
            [
                composes[k][s](image=np.ascontiguousarray(image))["image"]
                for k, s, image in zip(kinds, severities, pixels, strict=True)
            ]
        )
        out = images.clone()
        out[torch.as_tensor(chosen)] = _images(corrupted, grey=images.shape[1] == 1).to(images)
        return out

    return apply
