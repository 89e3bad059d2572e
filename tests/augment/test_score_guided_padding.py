from __future__ import annotations

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
    with pytest.raises(ValueError, match="p: expected a probability in \\[0, 1\\]"):
        ScoreGuidedPadding(p=1.5)
