from __future__ import annotations

import pytest
import torch

from dlguard.augment import PROPERTY_PRESETS, deeptest_properties, label_preserving_properties, property_preset
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


@pytest.mark.parametrize("name", ["translation", "gaussian_blur"])
def test_limits_are_relative_to_the_image(name: str) -> None:
    """The same level moves (blurs) a point by the same share of the side on a 32- and a 64-pixel image."""
    prop = by_name(label_preserving_properties())[name]
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
    assert list(PROPERTY_PRESETS) == ["label_preserving", "deeptest_roads", "framework"]
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
