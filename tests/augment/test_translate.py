from __future__ import annotations

import pytest
import torch

from dlguard.augment import RegionTranslate
from dlguard.augment.functional import pad_to_region, region_translations


def centre_dot(height: int, width: int, batch: int = 1) -> torch.Tensor:
    image = torch.zeros(batch, 1, height, width)
    image[..., height // 2 - 1 : height // 2 + 1, width // 2 - 1 : width // 2 + 1] = 1
    return image


def brightest(image: torch.Tensor) -> tuple[float, float]:
    """Centre of mass of the bright dot (robust to the antialiased spread)."""
    weights = image[0, 0]
    ys, xs = torch.meshgrid(torch.arange(weights.shape[0]), torch.arange(weights.shape[1]), indexing="ij")
    return float((weights * ys).sum() / weights.sum()), float((weights * xs).sum() / weights.sum())


def region_of(y: float, x: float, height: int, width: int, n: int) -> int:
    rows = [round(j * height / n) for j in range(n + 1)]
    cols = [round(j * width / n) for j in range(n + 1)]
    row = next(r for r in range(n) if rows[r] <= y < rows[r + 1])
    col = next(c for c in range(n) if cols[c] <= x < cols[c + 1])
    return row * n + col


# The dot lands inside region i whenever the step is large enough: t·(n − 2) < 2·(n − 1).
@pytest.mark.parametrize(
    ("n", "t", "height", "width"),
    [(2, 5, 28, 28), (2, 8, 40, 24), (3, 2, 28, 28), (3, 3, 30, 45), (4, 2, 32, 20)],
)
def test_centre_dot_lands_in_each_region(n: int, t: int, height: int, width: int) -> None:
    for region in range(n * n):
        moved = pad_to_region(centre_dot(height, width), n, region, t)
        assert moved.shape == (1, 1, height, width)
        assert region_of(*brightest(moved), height, width, n) == region


@pytest.mark.parametrize(("n", "t", "height", "width"), [(3, 5, 28, 28), (4, 5, 32, 48), (5, 10, 50, 50)])
def test_dot_moves_where_the_padding_says(n: int, t: int, height: int, width: int) -> None:
    """Small steps (the paper's t = 5) move the dot part of the way: check the exact position."""
    for region in range(n * n):
        r, c = divmod(region, n)
        y, x = brightest(pad_to_region(centre_dot(height, width), n, region, t))
        padded_h, padded_w = height + (n - 1) * (height // t), width + (n - 1) * (width // t)
        # the dot's centre (height/2 - 0.5 in pixel-centre coordinates) after pad + resize
        expected_y = (r * (height // t) + height / 2) * height / padded_h - 0.5
        expected_x = (c * (width // t) + width / 2) * width / padded_w - 0.5
        assert y == pytest.approx(expected_y, abs=0.3) and x == pytest.approx(expected_x, abs=0.3)


def test_per_sample_regions_equal_one_region_at_a_time() -> None:
    images = torch.rand(6, 3, 20, 30, generator=torch.Generator().manual_seed(0))
    regions = torch.tensor([0, 4, 8, 4, 2, 6])
    batched = pad_to_region(images, 3, regions, t=4)
    for i, region in enumerate(regions.tolist()):
        torch.testing.assert_close(batched[i : i + 1], pad_to_region(images[i : i + 1], 3, region, t=4))
    views = region_translations(images, 3, t=4)
    torch.testing.assert_close(views[4, 1], batched[1])
    assert batched.min() >= 0 and batched.max() <= 1


def test_module_matches_functional_and_replays() -> None:
    images = torch.rand(5, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    aug = RegionTranslate(n=3, t=5)
    out = aug(images)
    regions = aug._params["region"]
    assert len(regions.unique()) > 1  # random per sample
    torch.testing.assert_close(out, pad_to_region(images, 3, regions, 5))
    torch.testing.assert_close(aug(images, params=aug._params), out)


def test_module_matrix_moves_a_point_like_the_image() -> None:
    aug = RegionTranslate(n=3, region=8, t=2, p=1.0)
    image = centre_dot(30, 30)
    out = aug(image)
    matrix = aug.transform_matrix[0]
    point = matrix @ torch.tensor([14.5, 14.5, 1.0])  # the dot's centre (x, y)
    y, x = brightest(out)
    assert (float(point[1]), float(point[0])) == pytest.approx((y, x), abs=0.3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 1, "region": 0}, "n: expected an integer grid size"),
        ({"n": 3, "region": 0, "t": 1}, "t: expected an integer greater than 1"),
        ({"n": 3, "region": 9}, "region: expected values in 0..8"),
    ],
)
def test_bad_input(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pad_to_region(torch.rand(1, 1, 8, 8), **kwargs)


def test_bad_images() -> None:
    with pytest.raises(ValueError, match="images: expected values in \\[0, 1\\]"):
        pad_to_region(torch.rand(1, 1, 8, 8) * 255, 2, 0)
    with pytest.raises(ValueError, match="images: expected float"):
        pad_to_region(torch.zeros(1, 1, 8, 8, dtype=torch.uint8), 2, 0)
    with pytest.raises(ValueError, match="images: expected images \\(B, C, H, W\\)"):
        pad_to_region(torch.rand(8, 8), 2, 0)
