from __future__ import annotations

import pickle

import pytest
import torch
from torch.nn import functional as F

from dlguard.augment import ScoreGuidedPadding
from dlguard.augment.functional import pad_resize


def test_integer_padding_equals_pad_then_resize() -> None:
    images = torch.rand(2, 3, 20, 20, generator=torch.Generator().manual_seed(0))
    ratio = torch.tensor([0.5, 0.5])
    out = pad_resize(images, ratio, left=torch.tensor([3.0, 10.0]), top=torch.tensor([7.0, 0.0]))
    for i, (left, top) in enumerate([(3, 7), (10, 0)]):
        padded = F.pad(images[i : i + 1], (left, 10 - left, top, 10 - top))
        reference = F.interpolate(padded, size=(20, 20), mode="bilinear", align_corners=False)
        torch.testing.assert_close(out[i : i + 1], reference, atol=1e-5, rtol=0)


def _symmetric(image: torch.Tensor, left: int, right: int, top: int, bottom: int) -> torch.Tensor:
    """Mirror ``image`` at its edges, the edge pixel repeated (``a b c | c b a``), by concatenation."""
    image = torch.cat([image[..., :left].flip(-1), image, image[..., image.shape[-1] - right :].flip(-1)], dim=-1)
    return torch.cat([image[..., :top, :].flip(-2), image, image[..., image.shape[-2] - bottom :, :].flip(-2)], dim=-2)


@pytest.mark.parametrize("padding_mode", ["border", "reflection"])
def test_border_and_reflection_fill_the_padding_from_the_image_s_edge(padding_mode: str) -> None:
    images = torch.rand(2, 3, 20, 20, generator=torch.Generator().manual_seed(0))
    ratio = torch.tensor([0.5, 0.5])
    out = pad_resize(images, ratio, torch.tensor([3.0, 10.0]), torch.tensor([7.0, 0.0]), padding_mode=padding_mode)
    for i, (left, top) in enumerate([(3, 7), (10, 0)]):
        sides = (left, 10 - left, top, 10 - top)
        image = images[i : i + 1]
        padded = F.pad(image, sides, mode="replicate") if padding_mode == "border" else _symmetric(image, *sides)
        reference = F.interpolate(padded, size=(20, 20), mode="bilinear", align_corners=False)
        torch.testing.assert_close(out[i : i + 1], reference, atol=1e-5, rtol=0)


def test_the_module_fills_as_the_functional_does_and_names_a_bad_padding_mode() -> None:
    images = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    for padding_mode in ("zeros", "border", "reflection"):
        aug = ScoreGuidedPadding(p=1.0, padding_mode=padding_mode)
        out = aug(images)
        params = aug._params
        expected = pad_resize(images, params["ratio"], params["left"], params["top"], padding_mode=padding_mode)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
        assert torch.equal(aug(images, params=params), out)
    # a constant image stays constant unless the padding is black
    assert ScoreGuidedPadding(p=1.0, padding_mode="border")(torch.ones(4, 1, 8, 8)).min() == pytest.approx(1.0)
    assert ScoreGuidedPadding(p=1.0)(torch.ones(4, 1, 8, 8)).min() == 0.0
    with pytest.raises(ValueError, match=r"padding_mode: expected one of \('zeros', 'border', 'reflection'\)"):
        ScoreGuidedPadding(padding_mode="reflect")
    with pytest.raises(ValueError, match="padding_mode: expected one of"):
        pad_resize(images, torch.zeros(8), torch.zeros(8), torch.zeros(8), padding_mode="edge")


def test_padding_split_is_random_per_sample_and_within_bounds() -> None:
    torch.manual_seed(0)
    aug = ScoreGuidedPadding(p=1.0)
    aug(torch.rand(64, 1, 28, 28))
    left, top, ratio = aug._params["left"], aug._params["top"], aug._params["ratio"]
    assert torch.all(ratio == 1.0)
    assert left.min() >= 0 and left.max() <= 28 and top.min() >= 0 and top.max() <= 28
    assert len(left.unique()) == 64 and left.std() > 5  # spread over U(0, p·d̂)
    aug_same = ScoreGuidedPadding(p=1.0, same_on_batch=True)
    aug_same(torch.rand(8, 1, 28, 28))
    assert len(aug_same._params["left"].unique()) == 1


def test_probability_zero_is_identity_and_replay_reproduces() -> None:
    images = torch.rand(4, 1, 16, 16)
    assert torch.equal(ScoreGuidedPadding(p=0.0)(images), images)
    torch.manual_seed(1)
    aug = ScoreGuidedPadding(p=0.4)
    first = aug(images)
    assert torch.equal(aug(images, params=aug._params), first)


def test_p_controls_how_often_and_how_much() -> None:
    torch.manual_seed(0)
    images = torch.ones(400, 1, 16, 16)
    aug = ScoreGuidedPadding(p=0.3)
    out = aug(images)
    changed = (out != images).flatten(1).any(dim=1).float().mean()
    assert changed == pytest.approx(0.3, abs=0.07)
    # a padded image keeps 1/(1+p)² of its area: mean brightness ≈ 1/1.69 where applied
    applied = out[aug._params["batch_prob"] > 0.5]
    assert applied.mean() == pytest.approx(1 / 1.3**2, abs=0.03)


def test_gradients_flow_to_the_image() -> None:
    images = torch.rand(2, 1, 8, 8, dtype=torch.float64, requires_grad=True)
    ratio, left, top = (
        torch.tensor([0.3, 0.6], dtype=torch.float64),
        torch.tensor([1.0, 2.0]).double(),
        torch.tensor([0.5, 4.0]).double(),
    )
    assert torch.autograd.gradcheck(lambda x: pad_resize(x, ratio, left, top), (images * 0.8 + 0.1,))


def test_bad_p() -> None:
    with pytest.raises(ValueError, match=r"p: expected a value in \[0, 1\], got 1.5"):
        ScoreGuidedPadding(p=1.5)
    aug = ScoreGuidedPadding(p=0.5)
    for bad in (-0.1, float("nan"), True):
        with pytest.raises(ValueError, match=r"p: expected a value in \[0, 1\]"):
            aug.p = bad
    assert aug.p == 0.5


def test_setting_p_after_construction_changes_the_probability() -> None:
    images = torch.ones(400, 1, 16, 16)
    aug = ScoreGuidedPadding(p=0.0)
    assert torch.equal(aug(images), images)
    aug.p = 1.0  # as DScoreCallback does after a measurement
    changed = (aug(images) != images).flatten(1).any(dim=1)
    assert bool(changed.all())
    torch.manual_seed(0)
    aug.p = 0.5
    out = aug(images)
    changed = (out != images).flatten(1).any(dim=1).float().mean()
    assert changed == pytest.approx(0.5, abs=0.08)
    assert out[aug._params["batch_prob"] > 0.5].mean() == pytest.approx(1 / 1.5**2, abs=0.03)  # ratio follows p
    aug.p = 0.0
    assert torch.equal(aug(images), images)


def test_range_is_checked_on_the_first_call_after_p_is_set(host_syncs) -> None:
    aug = ScoreGuidedPadding(p=0.5)
    with pytest.raises(ValueError, match=r"images: expected values in \[0, 1\], got values in \[\d"):
        aug(torch.rand(2, 1, 8, 8) * 255)
    with pytest.raises(ValueError, match="images: contains NaN"):
        aug(torch.full((2, 1, 8, 8), float("nan")))
    with pytest.raises(ValueError, match="images: expected float"):
        aug(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    aug(torch.rand(2, 1, 8, 8))
    with host_syncs() as syncs:  # later training batches: no value read
        for _ in range(3):
            aug(torch.rand(2, 1, 8, 8))
    assert syncs.calls == []
    aug.p = 0.7  # a new measurement: checked again
    with pytest.raises(ValueError, match=r"images: expected values in \[0, 1\]"):
        aug(torch.rand(2, 1, 8, 8) * 255)


def test_pickles_and_still_works() -> None:
    aug = ScoreGuidedPadding(p=0.3)
    aug.p = 0.6
    copy = pickle.loads(pickle.dumps(aug))
    assert copy.p == 0.6
    images = torch.rand(16, 1, 12, 12)
    torch.manual_seed(2)
    expected = aug(images)
    torch.manual_seed(2)
    torch.testing.assert_close(copy(images), expected)
    assert not torch.equal(expected, images)
