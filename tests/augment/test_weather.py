from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from sklearn.datasets import load_sample_images
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from torchmetrics.functional.image import structural_similarity_index_measure as ssim

from dlguard.augment import RandomFog, RandomRain
from dlguard.augment.functional import (
    FOG_DENSITY,
    RAIN_BLUR,
    RAIN_DARKENING,
    RAIN_DROPS,
    RAIN_LENGTH,
    fog,
    plasma_field,
    rain,
    rain_streaks,
)


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    images = torch.stack([torch.tensor(p) for p in load_sample_images().images]).permute(0, 3, 1, 2).float() / 255
    return F.interpolate(images, size=(128, 128), mode="bilinear", antialias=True).clamp(0, 1)


@pytest.mark.parametrize("effect", [RandomFog, RandomRain])
@pytest.mark.parametrize(("channels", "dtype"), [(1, torch.float32), (3, torch.float32), (3, torch.float64)])
def test_shape_dtype_and_range_are_kept(effect, channels: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    images = torch.rand(4, channels, 40, 56, dtype=dtype)
    out = effect(severity=(1, 5), p=1.0)(images)
    assert out.shape == images.shape and out.dtype == dtype and out.device == images.device
    assert out.min() >= 0 and out.max() <= 1
    assert not torch.allclose(out, images)


@pytest.mark.parametrize("effect", [RandomFog, RandomRain])
def test_replaying_parameters_reproduces_the_output(effect) -> None:
    torch.manual_seed(0)
    images = torch.rand(3, 3, 32, 32)
    aug = effect(p=1.0)
    first = aug(images)
    torch.manual_seed(123)  # a different RNG state must not matter when parameters are given
    assert torch.equal(aug(images, params=aug._params), first)


@pytest.mark.parametrize("effect", [RandomFog, RandomRain])
def test_parameters_differ_per_sample_unless_same_on_batch(effect) -> None:
    torch.manual_seed(0)
    images = torch.rand(6, 3, 32, 32)
    out = effect(severity=3, p=1.0)(images[:1].expand(6, -1, -1, -1))
    assert not torch.allclose(out[0], out[1])
    same = effect(severity=3, p=1.0, same_on_batch=True)(images[:1].expand(6, -1, -1, -1))
    assert torch.allclose(same[0], same[5])


def test_fog_ssim_falls_with_severity(photos: torch.Tensor) -> None:
    depth = 0.35 + 0.65 * plasma_field(len(photos), 128, 128, generator=torch.Generator().manual_seed(0))
    scores = [float(ssim(fog(photos, depth, beta, 0.9), photos, data_range=1.0)) for beta in FOG_DENSITY]
    assert all(a > b for a, b in pairwise(scores)), scores
    assert scores[0] < 0.99 and scores[-1] < 0.6


def test_rain_ssim_falls_with_severity(photos: torch.Tensor) -> None:
    batch, _, height, width = photos.shape
    scores = []
    for level in range(5):
        streaks = rain_streaks(
            batch,
            height,
            width,
            density=torch.full((batch,), RAIN_DROPS[level]),
            length=torch.full((batch,), RAIN_LENGTH[level] * height),
            angle=torch.full((batch,), 10.0),
            generator=torch.Generator().manual_seed(0),
        )
        rainy = rain(photos, streaks, 0.8, RAIN_DARKENING[level], RAIN_BLUR[level])
        scores.append(float(ssim(rainy, photos, data_range=1.0)))
    assert all(a > b for a, b in pairwise(scores)), scores


def test_fog_follows_the_scattering_model() -> None:
    images = torch.rand(2, 3, 8, 8)
    depth = torch.rand(2, 1, 8, 8)
    out = fog(images, depth, torch.tensor([0.5, 2.0]), torch.tensor([0.9, 0.8]))
    tau = torch.exp(-torch.tensor([0.5, 2.0]).view(2, 1, 1, 1) * depth)
    expected = images * tau + torch.tensor([0.9, 0.8]).view(2, 1, 1, 1) * (1 - tau)
    torch.testing.assert_close(out, expected)


def test_a_drop_becomes_a_streak_of_the_given_length_and_slant() -> None:
    from dlguard.augment.functional.weather import _draw_streaks

    def one_drop(angle: float) -> torch.Tensor:
        centre = torch.tensor([[20.0]])
        return _draw_streaks(centre, centre, torch.ones(1, 1), torch.tensor([20.0]), torch.tensor([angle]), 41, 41)[
            0, 0
        ]

    upright = one_drop(0.0)
    assert torch.nonzero(upright.sum(1) > 0.5).flatten().tolist() == list(range(10, 31))  # 21 rows through y = 20
    assert torch.nonzero(upright.sum(0) > 0).flatten().tolist() == [20]  # one column, x = 20
    slanted = one_drop(20.0)
    ys, xs = torch.nonzero(slanted > 0.3, as_tuple=True)
    design = torch.stack([ys.float(), torch.ones_like(ys.float())], dim=1)
    slope = float(torch.linalg.lstsq(design, xs.float()[:, None]).solution[0])  # dx / dy
    assert slope == pytest.approx(-float(torch.tan(torch.deg2rad(torch.tensor(20.0)))), abs=0.05)  # top leans right
    # 21 unit steps; where two round to the same row their sum is clamped to 1
    assert float(slanted.max()) <= 1.0 and float(slanted.sum()) == pytest.approx(21.0, rel=0.1)


def test_gradcheck() -> None:
    gen = torch.Generator().manual_seed(0)
    images = (torch.rand(2, 1, 8, 8, generator=gen, dtype=torch.float64) * 0.6 + 0.2).requires_grad_(True)
    depth = torch.rand(2, 1, 8, 8, generator=gen, dtype=torch.float64)
    streaks = torch.rand(2, 1, 8, 8, generator=gen, dtype=torch.float64) * 0.5
    assert torch.autograd.gradcheck(lambda x: fog(x, depth, torch.tensor([0.5, 1.5]).double(), 0.9), (images,))
    assert torch.autograd.gradcheck(lambda x: rain(x, streaks, 0.8, 0.9, 0.6), (images,))


class _Digits(Dataset):
    def __init__(self) -> None:
        self.images = torch.rand(4, 1, 28, 28)
        self.fog = RandomFog(severity=2, p=1.0, keepdim=True)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.fog(self.images[index])


def test_works_in_a_dataloader_worker() -> None:
    batch = next(iter(DataLoader(_Digits(), batch_size=4, num_workers=1)))
    assert batch.shape == (4, 1, 28, 28) and batch.min() >= 0 and batch.max() <= 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: RandomFog(severity=0), "severity: expected an integer in 1..5"),
        (lambda: RandomRain(severity=(2, 6)), "severity"),
        (
            lambda: fog(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.ones(2, 1, 8, 8), 1.0),
            "images: expected float",
        ),
        (lambda: fog(torch.rand(2, 3, 8, 8) * 2, torch.ones(2, 1, 8, 8), 1.0), "images: expected values in \\[0, 1\\]"),
        (lambda: fog(torch.rand(3, 8, 8), torch.ones(1, 1, 8, 8), 1.0), "images: expected images \\(B, C, H, W\\)"),
        (
            lambda: fog(torch.rand(2, 3, 8, 8), torch.ones(2, 1, 8, 8), torch.ones(3)),
            "density: expected a scalar or shape \\(2,\\)",
        ),
        (lambda: rain(torch.rand(2, 3, 8, 8), torch.zeros(2, 1, 8, 8), darkening=torch.ones(5)), "darkening"),
        (lambda: rain(torch.rand(2, 3, 8, 8), torch.zeros(1, 1, 8, 8)), "streaks: expected"),
    ],
)
def test_bad_input(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_fast_and_differentiable_paths_agree() -> None:
    images = torch.rand(2, 3, 16, 16, dtype=torch.float64)
    streaks = torch.rand(2, 1, 16, 16, dtype=torch.float64) * 0.3
    fast = rain(images, streaks, 0.8, 0.9, torch.tensor([0.4, 1.0]))
    slow = rain(images.clone().requires_grad_(True), streaks, 0.8, 0.9, torch.tensor([0.4, 1.0]))
    torch.testing.assert_close(fast, slow.detach())
    # the blur is the vertical 3-tap Gaussian: an image constant along rows is left as it is
    stripes = torch.arange(16, dtype=torch.float64).remainder(2).expand(1, 1, 16, 16).clone()
    assert torch.equal(rain(stripes, torch.zeros(1, 1, 16, 16, dtype=torch.float64), 0.8, 1.0, 1.0), stripes)


@pytest.mark.parametrize("effect", [RandomFog, RandomRain])
def test_range_is_checked_on_the_cpu_and_never_read_elsewhere(effect) -> None:
    with pytest.raises(ValueError, match=r"images: expected values in \[0, 1\]"):
        effect(p=1.0)(torch.rand(2, 3, 16, 16) * 2)  # on the CPU: every call
    with pytest.raises(ValueError, match="images: contains NaN"):
        effect(p=1.0)(torch.full((2, 3, 16, 16), float("nan")))
    # elsewhere no value is read, neither to draw parameters nor to apply them (each read would be a
    # host sync per batch): a meta tensor has no values to read
    for p in (1.0, 0.5):
        aug = effect(severity=(1, 5), p=p).to("meta")
        out = aug(torch.rand(2, 3, 16, 16, device="meta"))
        assert out.shape == (2, 3, 16, 16) and out.device.type == "meta" and aug._params["severity"].is_meta


def test_streak_sizes_given_as_upper_bounds_change_nothing() -> None:
    """RandomRain passes the largest drop count and streak of its severities instead of reading them."""
    from dlguard.augment.functional.weather import _streak_maps

    keys = torch.tensor([3, 1000, 77])
    density, length, angle = torch.tensor([0.004, 0.03, 0.013]), torch.tensor([2.0, 9.6, 6.5]), torch.full((3,), 15.0)
    exact = rain_streaks(3, 48, 40, density, length, angle, keys=keys)
    bounded = _streak_maps(3, 48, 40, density, length, angle, drops=200, half=12, keys=keys)
    torch.testing.assert_close(bounded, exact, rtol=0, atol=1e-6)
    assert float(exact.sum()) > 10
