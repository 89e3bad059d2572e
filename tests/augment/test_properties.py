from __future__ import annotations

import math
import pickle

import pytest
import torch

from dlguard._random import keyed_normal
from dlguard.augment import Property, deeptest_properties, default_properties
from dlguard.augment.functional import brightness_scale, gaussian_noise, plasma_field, rain_streaks


def _by_name(properties: list[Property]) -> dict[str, Property]:
    return {p.name: p for p in properties}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_levels_are_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="levels: expected finite severities for 'x'"):
        Property("x", brightness_scale, (1.0, bad))
    with pytest.raises(ValueError, match="levels: expected finite severities for 'x'"):
        Property("x", brightness_scale, (bad,))


def test_fields_are_validated_and_levels_kept_as_floats() -> None:
    prop = Property("x", brightness_scale, [1, 2])
    assert prop.levels == (1.0, 2.0) and all(isinstance(v, float) for v in prop.levels)
    assert (prop.keyed, prop.needs_images, prop.value_range) == (False, True, (0.0, 1.0))
    with pytest.raises(ValueError, match="keyed: expected True or False for 'x'"):
        Property("x", brightness_scale, (1.0,), keyed=1)
    with pytest.raises(ValueError, match="value_range: expected low < high"):
        Property("x", brightness_scale, (1.0,), value_range=(1.0, 1.0))
    with pytest.raises(ValueError, match="apply: expected a callable"):
        Property("x", None, (1.0,))
    with pytest.raises(ValueError, match=r"level: expected one value or shape \(2,\)"):
        prop(torch.rand(2, 1, 4, 4), torch.ones(3))


def test_image_properties_explain_what_takes_a_signal() -> None:
    signals = torch.rand(4, 2, 50)  # (B, C, T)
    rotation = _by_name(default_properties())["rotation"]
    with pytest.raises(
        ValueError, match=r"images: property 'rotation' needs images \(B, C, H, W\), got shape \(4, 2, 50\)"
    ):
        rotation(signals, 10.0)
    with pytest.raises(ValueError, match="needs_images=False take any tensor"):
        _by_name(deeptest_properties())["fog"](signals, 1.0, keys=torch.arange(4))
    assert all(p.needs_images for p in deeptest_properties())


def test_noise_and_brightness_take_any_tensor() -> None:
    props = _by_name(default_properties(value_range=None))
    assert not props["noise"].needs_images and not props["brightness"].needs_images
    assert props["noise"].value_range is None and props["rotation"].value_range == (0.0, 1.0)
    signals = torch.tensor([[[-2.0, 0.5, 3.0]], [[1.0, 1.0, 1.0]]])  # (B, C, T), not pixels
    torch.testing.assert_close(
        props["brightness"](signals, torch.tensor([2.0, 1.5])), signals * torch.tensor([2.0, 1.5]).view(2, 1, 1)
    )
    keys = torch.tensor([11, 12])
    noisy = props["noise"](signals, 0.5, keys=keys)
    assert noisy.shape == signals.shape and float(noisy.min()) < 0.0  # not clamped to [0, 1]
    # a longer signal, and a 2-D batch (B, D)
    long_signals = torch.zeros(3, 1, 4000)
    assert float(props["noise"](long_signals, 0.2, keys=torch.arange(3)).std()) == pytest.approx(0.2, rel=0.05)
    assert props["noise"](torch.zeros(5, 7), 0.1).shape == (5, 7)


def test_value_range_checks_and_clamps() -> None:
    props = _by_name(default_properties(value_range=(-1.0, 1.0)))
    x = torch.tensor([[-0.8, 0.2, 0.9]])
    torch.testing.assert_close(props["brightness"](x, 2.0), torch.tensor([[-1.0, 0.4, 1.0]]))
    assert float(props["noise"](x, 0.3).abs().max()) <= 1.0
    with pytest.raises(ValueError, match=r"images: expected values in \[-1, 1\]"):
        props["brightness"](x * 3, 2.0)
    pixels = _by_name(default_properties())  # [0, 1] by default
    with pytest.raises(ValueError, match=r"images: expected values in \[0, 1\]"):
        pixels["noise"](x, 0.1)
    with pytest.raises(ValueError, match="value_range: expected"):
        default_properties(value_range=(0.0, float("nan")))


def test_keyed_noise_is_fixed_by_the_input_not_its_batch() -> None:
    noise = _by_name(default_properties())["noise"]
    assert noise.keyed
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(6, 3, 8, 8, generator=gen) * 0.5 + 0.25  # no clamping: the noise is visible as is
    keys = torch.randint(0, 2**31, (6,), generator=gen)
    together = noise(images, 0.1, keys=keys)
    order = torch.tensor([4, 0, 5, 2])  # other neighbours, another order, a smaller batch
    apart = noise(images[order], 0.1, keys=keys[order])
    torch.testing.assert_close(apart, together[order], rtol=0, atol=0)
    torch.testing.assert_close(noise(images, 0.1, keys=keys), together, rtol=0, atol=0)  # every epoch alike
    torch.manual_seed(1)
    unkeyed_a = noise(images, 0.1)
    torch.manual_seed(1)
    unkeyed_b = noise(images, 0.1)
    torch.testing.assert_close(unkeyed_a, unkeyed_b, rtol=0, atol=0)  # without keys: the global RNG
    assert not torch.allclose(unkeyed_a, together)
    # per-input severities: each input gets the noise it would get at its severity alone
    mixed = noise(images, torch.tensor([0.02, 0.1, 0.02, 0.1, 0.1, 0.02]), keys=keys)
    torch.testing.assert_close(mixed[1], together[1], rtol=0, atol=0)
    torch.testing.assert_close(mixed[0], noise(images[:1], 0.02, keys=keys[:1])[0], rtol=0, atol=0)


def test_each_severity_has_its_own_standard_normal_noise() -> None:
    noise = _by_name(default_properties(value_range=None))[  # unclamped: (x' − x)/σ is the draw itself
        "noise"
    ]
    images, keys = torch.zeros(40, 3, 32, 32), torch.arange(40) * 7919 + 13
    draws = torch.stack([(noise(images, level, keys=keys) / level).flatten() for level in noise.levels])
    assert torch.allclose(draws.mean(1), torch.zeros(5), atol=0.02)
    assert torch.allclose(draws.std(1), torch.ones(5), atol=0.02)
    correlation = torch.corrcoef(draws) - torch.eye(5)
    assert float(correlation.abs().max()) < 4 / draws.shape[1] ** 0.5  # five independent draws
    assert not torch.allclose(draws[0], keyed_normal(keys, (3, 32, 32), salt=0).flatten(), atol=0.5)


def test_keyed_noise_matches_the_functional_op() -> None:
    noise = _by_name(default_properties())["noise"]
    images, keys = torch.full((2, 1, 4, 4), 0.5), torch.tensor([3, 4])
    out = noise(images, 0.1, keys=keys)
    implied = (out - images) / 0.1
    torch.testing.assert_close(gaussian_noise(images, 0.1, noise=implied), out)


def _neighbourhoods(
    images: torch.Tensor, keys: torch.Tensor, index: int
) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Batches holding input ``index`` among other neighbours, in other orders: (images, keys, its row)."""
    others = [i for i in range(len(images)) if i != index]
    return [
        (images[[index]], keys[[index]], 0),
        (images[[*others[:2], index]], keys[[*others[:2], index]], 2),
        (images[[others[-1], index, *others[:-1]]], keys[[others[-1], index, *others[:-1]]], 1),
    ]


@pytest.mark.parametrize("name", ["fog", "rain"])
def test_keyed_weather_is_independent_of_the_batch(name: str) -> None:
    prop = _by_name(deeptest_properties())[name]
    assert prop.keyed and prop.needs_images
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(5, 3, 40, 40, generator=gen)
    keys = torch.randint(0, 2**31, (5,), generator=gen)
    levels = torch.tensor([1.0, 5.0, 3.0, 2.0, 4.0])  # neighbours at other severities: more drops, longer streaks
    together = prop(images, levels, keys=keys)
    for index in (0, 2):
        for batch, batch_keys, row in _neighbourhoods(images, keys, index):
            order = [int(torch.nonzero(keys == k).flatten()) for k in batch_keys]
            out = prop(batch, levels[order], keys=batch_keys)
            torch.testing.assert_close(out[row], together[index], rtol=0, atol=1e-6)
    torch.manual_seed(0)
    first = prop(images, levels)
    torch.manual_seed(1)
    assert not torch.allclose(prop(images, levels), first)  # unkeyed: fresh draws


def test_keyed_layers_are_fixed_by_the_key() -> None:
    keys = torch.tensor([7, 123456, 2**31 - 1])
    fields = plasma_field(3, 24, 32, keys=keys)
    torch.testing.assert_close(plasma_field(1, 24, 32, keys=keys[2:]), fields[2:], rtol=0, atol=1e-6)
    assert not torch.allclose(fields[0], fields[1])
    assert float(fields.amin()) >= 0 and float(fields.amax()) <= 1
    density, length, angle = torch.tensor([0.01, 0.03, 0.02]), torch.tensor([5.0, 12.0, 8.0]), torch.full((3,), 10.0)
    streaks = rain_streaks(3, 32, 32, density, length, angle, keys=keys)
    alone = rain_streaks(1, 32, 32, density[:1], length[:1], angle[:1], keys=keys[:1])
    torch.testing.assert_close(alone[0], streaks[0], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="keys: pass keys or a generator, not both"):
        plasma_field(3, 8, 8, generator=torch.Generator(), keys=keys)
    with pytest.raises(ValueError, match=r"keys: expected integer keys of shape \(2,\)"):
        rain_streaks(2, 8, 8, density[:2], length[:2], angle[:2], keys=keys)
    with pytest.raises(ValueError, match=r"keys: expected integer keys of shape \(3,\)"):
        plasma_field(3, 8, 8, keys=keys.float())


@pytest.mark.parametrize("factory", [default_properties, deeptest_properties])
def test_built_in_properties_pickle_and_still_work(factory) -> None:
    properties = factory()
    copies = pickle.loads(pickle.dumps(properties))
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    keys = torch.tensor([5, 6, 7])
    for original, copy in zip(properties, copies, strict=True):
        assert (copy.name, copy.levels, copy.keyed, copy.needs_images) == (
            original.name,
            original.levels,
            original.keyed,
            original.needs_images,
        )
        level = original.levels[len(original.levels) // 2]
        torch.manual_seed(0)
        expected = original(images, level, keys=keys)
        torch.manual_seed(0)
        torch.testing.assert_close(copy(images, level, keys=keys), expected, msg=original.name)
        assert not torch.equal(expected, images), original.name


def test_level_salts_differ_for_every_default_severity() -> None:
    from dlguard.augment.properties import _NOISE_SALT, _level_salt

    levels = default_properties()[0].levels
    salts = {_level_salt(_NOISE_SALT, v) for v in levels}
    assert len(salts) == len(levels) and all(0 <= s < 2**31 for s in salts)
    # a float64 level and its float32 copy share a salt (the level is read as float32)
    assert _level_salt(_NOISE_SALT, 0.1) == _level_salt(_NOISE_SALT, float(torch.tensor(0.1)))
    assert not math.isnan(float(levels[0]))
