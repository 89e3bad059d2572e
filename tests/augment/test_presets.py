from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import pytest
import torch

from dlguard.augment import (
    PROPERTY_PRESETS,
    capture_properties,
    deeptest_properties,
    exposure_properties,
    label_preserving_properties,
    property_preset,
)
from tests.quick import mnist_validation


@pytest.fixture(scope="module")
def digits() -> torch.Tensor:
    return mnist_validation(300)[0]


def by_name(properties: list) -> dict:
    return {p.name: p for p in properties}


def ink_kept(prop, images: torch.Tensor, level: float) -> torch.Tensor:
    """Share of each digit's ink still in the frame (a zoom by s spreads the ink over s² the area)."""
    area = level * level if prop.name == "scale" else 1.0
    return prop(images, level).sum((1, 2, 3)) / (area * images.sum((1, 2, 3)))


def test_label_preserving_geometry_keeps_every_digit_in_the_frame_and_deeptest_s_table_does_not(digits) -> None:
    for prop in label_preserving_properties()[:4]:  # translation, scale, shear, rotation
        for level in prop.levels:
            assert float(ink_kept(prop, digits, level).min()) > 0.88, (prop.name, level)
    # planted: DeepTest's road-frame limits on a 28-pixel digit zoom 90 % of it out of the frame and shear 40 % away
    table = by_name(deeptest_properties())
    assert float(ink_kept(table["scale"], digits, table["scale"].levels[-1]).median()) < 0.15
    assert float(ink_kept(table["shear"], digits, table["shear"].levels[-1]).median()) < 0.6


@pytest.mark.parametrize(
    ("preset", "name"),
    [(label_preserving_properties, "translation"), (label_preserving_properties, "gaussian_blur"),
     (capture_properties, "defocus")],
)  # fmt: skip
def test_limits_are_relative_to_the_image(preset: Callable[[], list], name: str) -> None:
    """The same level moves (blurs) a point by the same share of the side on a 32- and a 64-pixel image."""
    prop = by_name(preset())[name]
    level = prop.levels[-1]
    shares = []
    for side in (32, 64):
        point = torch.zeros(1, 1, side, side)
        point[0, 0, side // 2, side // 2] = 1.0
        out = prop(point, level)[0, 0].double()
        coords = torch.arange(side, dtype=torch.float64)
        mass = out.sum()
        centre = (out.sum(0) * coords).sum() / mass
        if name == "translation":
            shares.append(float(centre - side // 2) / side)
        else:
            spread = ((out.sum(0) * (coords - centre) ** 2).sum() / mass).sqrt()
            shares.append(float(spread) / side)
    assert shares[0] == pytest.approx(level, rel=0.15) and shares[1] == pytest.approx(level, rel=0.15)
    assert shares[0] == pytest.approx(shares[1], rel=0.1)


def test_presets_are_named_and_an_unknown_name_lists_them() -> None:
    assert [p.name for p in property_preset("deeptest_roads")] == [p.name for p in deeptest_properties()]
    assert sum(len(p.levels) for p in property_preset("label_preserving")) == 36
    assert list(PROPERTY_PRESETS) == ["label_preserving", "deeptest_roads", "framework", "capture", "exposure"]
    assert [p.name for p in property_preset("capture")] == ["reduced_contrast", "defocus", "low_resolution"]
    assert [p.name for p in property_preset("exposure")] == ["underexposure"]
    with pytest.raises(ValueError, match=r"transformations: no preset named 'roads'; choose from \['label_preserving'"):
        property_preset("roads", argument="transformations")
    with pytest.raises(ValueError, match="properties: no preset named 3"):
        property_preset(3)


def test_weather_is_keyed_and_mild() -> None:
    weather = {p.name: p for p in label_preserving_properties() if p.name in ("fog", "rain")}
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    keys = torch.arange(4)
    for prop in weather.values():
        assert prop.keyed and prop.levels == (1.0, 2.0)
        assert torch.equal(prop(images, 2.0, keys)[1:], prop(images[1:], 2.0, keys[1:]))  # each input by its key


def test_reduced_contrast_pulls_each_image_towards_its_own_mean_grey_level() -> None:
    images = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    images[2] *= 0.2  # a dark image: its mean grey level, not 0.5, is the fixed point
    reduction = torch.tensor([0.2, 0.7, 0.7])
    grey = (0.299 * images[:, 0] + 0.587 * images[:, 1] + 0.114 * images[:, 2]).mean((1, 2)).view(3, 1, 1, 1)
    expected = grey + (1 - reduction).view(3, 1, 1, 1) * (images - grey)  # no clamp needed: it only shrinks
    prop = by_name(capture_properties())["reduced_contrast"]
    assert torch.allclose(prop(images, reduction), expected, atol=1e-6)
    assert float(prop(images, 0.7)[2].max()) < 0.2  # the dark image stays dark


def test_underexposure_scales_every_pixel_down_and_keeps_black_black(digits) -> None:
    images = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    (prop,) = exposure_properties()
    reduction = torch.tensor([0.2, 0.6, 0.7])
    expected = torch.stack([images[0] * 0.8, images[1] * 0.4, images[2] * 0.3])  # by hand: (1 - r)·x
    assert torch.allclose(prop(images, reduction), expected, atol=1e-6)
    assert torch.equal(prop(torch.zeros(1, 1, 4, 4), 0.7), torch.zeros(1, 1, 4, 4))
    means = [float(prop(digits, level).mean()) for level in prop.levels]  # darker with every level, never below 0
    assert all(b < a for a, b in pairwise([float(digits.mean()), *means]))
    assert float(prop(digits, prop.levels[-1]).min()) >= 0.0
    with pytest.raises(ValueError, match="images: expected values in"):
        prop(images * 3, 0.5)
    with pytest.raises(ValueError, match="images: expected floating-point values"):
        prop((images * 255).to(torch.uint8), 0.5)
    with pytest.raises(ValueError, match="images: contains NaN"):
        prop(images.clone().index_fill_(0, torch.tensor([1]), float("nan")), 0.5)
    with pytest.raises(ValueError, match=r"images: property 'underexposure' needs images \(B, C, H, W\)"):
        prop(torch.rand(3, 8), 0.5)


def test_low_resolution_is_block_averaging_shown_at_full_size() -> None:
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    prop = by_name(capture_properties())["low_resolution"]
    blocks = images.reshape(2, 3, 16, 2, 16, 2).mean((3, 5))  # loss 0.5: 2x2 blocks
    expected = blocks.repeat_interleave(2, -2).repeat_interleave(2, -1)
    assert torch.allclose(prop(images, 0.5), expected, atol=1e-6)
    mixed = prop(images, torch.tensor([0.5, 0.25]))  # one level per input, as a sweep calls it
    assert torch.equal(mixed[:1], prop(images[:1], 0.5)) and torch.equal(mixed[1:], prop(images[1:], 0.25))
    for level, rows in zip(prop.levels, (24, 16, 13), strict=True):  # distinct rows left of a 32-row image
        assert len(prop(images, level)[0, 0].unique(dim=0)) == rows
    large = torch.rand(1, 1, 64, 64, generator=torch.Generator().manual_seed(3))  # the same share of any side
    assert len(prop(large, 0.5)[0, 0].unique(dim=0)) == 32 and prop(large, 0.5)[0, 0].unique(dim=1).shape[1] == 32


def test_capture_degradations_grow_with_their_level_and_keep_the_range(digits) -> None:
    for prop in capture_properties():
        if prop.name != "low_resolution":  # its rows lost grow instead (above); misaligned blocks change pixels more
            change = [float((prop(digits, level) - digits).abs().mean()) for level in prop.levels]
            assert all(b > a for a, b in pairwise(change)), (prop.name, change)
        out = prop(digits, prop.levels[-1])
        assert out.shape == digits.shape and out.dtype == digits.dtype
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0


@pytest.mark.parametrize("name", ["reduced_contrast", "low_resolution"])
def test_capture_degradations_refuse_what_is_not_an_image_batch_in_range(name: str) -> None:
    prop = by_name(capture_properties())[name]
    images = torch.rand(2, 3, 8, 8)
    with pytest.raises(ValueError, match="images: contains NaN"):
        prop(images.clone().index_fill_(0, torch.tensor([1]), float("nan")), 0.5)
    with pytest.raises(ValueError, match="images: expected values in"):
        prop(images * 3, 0.5)
    with pytest.raises(ValueError, match="images: expected floating-point values"):
        prop((images * 255).to(torch.uint8), 0.5)
    # a level given as float64 for float32 images (as a user's table may be) is the same level
    assert torch.equal(prop(images, torch.tensor([0.5, 0.5], dtype=torch.float64)), prop(images, 0.5))


def test_pixelate_refuses_a_loss_outside_its_range() -> None:
    from dlguard.augment.functional import pixelate

    with pytest.raises(ValueError, match=r"loss: expected values in \[0, 1\), got 1.0"):
        pixelate(torch.rand(2, 1, 8, 8), torch.tensor([0.5, 1.0]))


@pytest.mark.parametrize("reduction", [-0.1, 1.5])
def test_reduced_contrast_refuses_a_reduction_outside_its_range(reduction: float) -> None:
    from dlguard.augment.functional import reduced_contrast
    from dlguard.augment.functional._inputs import values_trusted

    images = torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match=rf"reduction: expected values in \[0, 1\], got \[{reduction}\]"):
        reduced_contrast(images, torch.tensor([0.5, reduction]))
    with values_trusted():  # a guide's path reads no value back, as the image checks do not
        assert reduced_contrast(images, torch.tensor([0.5, reduction])).shape == images.shape
    assert torch.allclose(reduced_contrast(images, 1.0), images.mean((1, 2, 3), keepdim=True).expand_as(images))
