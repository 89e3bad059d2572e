from __future__ import annotations

import pytest
import torch
from torch import nn

from dlguard.probes import deletion_mutant_logits, region_keep_masks
from dlguard.zoo import mnist_b
from tests.probes.fingerprint import assert_unchanged, fingerprint


def test_region_boundaries_follow_round_j_h_over_n() -> None:
    masks = region_keep_masks(10, 7, 3)  # rows 0|3|7|10, cols 0|2|5|7
    assert masks.shape == (9, 10, 7)
    deleted = (masks == 0).int()
    assert deleted.sum(dim=0).eq(1).all()  # the regions tile the map
    assert deleted[0, :3, :2].all() and deleted[0].sum() == 3 * 2
    assert deleted[4, 3:7, 2:5].all() and deleted[4].sum() == 4 * 3
    assert deleted[8, 7:, 5:].all() and deleted[8].sum() == 3 * 2


def one_mutant_at_a_time(model: nn.Module, images: torch.Tensor, n: int) -> torch.Tensor:
    """Reference: a copy of the model per mutant whose convs zero one region via explicit slicing."""
    results = []
    for region in range(n * n):
        r, c = divmod(region, n)
        handles = []
        for module in model.modules():
            if isinstance(module, nn.Conv2d):

                def hook(_m, _i, out, r=r, c=c):
                    h, w = out.shape[-2:]
                    out = out.clone()
                    out[..., round(r * h / n) : round((r + 1) * h / n), round(c * w / n) : round((c + 1) * w / n)] = 0
                    return out

                handles.append(module.register_forward_hook(hook))
        with torch.no_grad():
            results.append(model(images))
        for handle in handles:
            handle.remove()
    return torch.stack(results)


@pytest.mark.parametrize(("n", "max_batch"), [(2, 4096), (3, 4096), (3, 25), (4, 7), (3, 1)])
def test_batched_mutants_equal_one_at_a_time(n: int, max_batch: int) -> None:
    torch.manual_seed(0)
    model = mnist_b().eval()
    images = torch.rand(10, 1, 28, 28)
    expected = one_mutant_at_a_time(model, images, n)
    got = deletion_mutant_logits(model, images, n, max_batch=max_batch)
    assert got.shape == (n * n, 10, 10)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got[0], got[n * n // 2])  # different regions, different mutants


def test_selected_layers_only() -> None:
    torch.manual_seed(0)
    model = mnist_b().eval()
    images = torch.rand(4, 1, 28, 28)
    only_first = deletion_mutant_logits(model, images, 2, layers=["conv1"])
    every = deletion_mutant_logits(model, images, 2)
    assert not torch.allclose(only_first, every)


def test_model_left_exactly_as_found_also_after_failure() -> None:
    model = mnist_b().train()
    model.fc1.weight.requires_grad_(False)
    before = fingerprint(model)
    deletion_mutant_logits(model, torch.rand(3, 1, 28, 28), 3)
    assert_unchanged(model, before)
    with pytest.raises(RuntimeError):
        deletion_mutant_logits(model, torch.rand(3, 2, 28, 28), 3)  # wrong channel count fails inside
    assert_unchanged(model, before)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="no layer of type Conv2d"):
        deletion_mutant_logits(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), torch.rand(2, 1, 2, 2), 2)
    with pytest.raises(ValueError, match="n: expected an integer grid size"):
        deletion_mutant_logits(mnist_b(), torch.rand(2, 1, 28, 28), 1)
    with pytest.raises(ValueError, match="images: expected \\(B, C, H, W\\)"):
        deletion_mutant_logits(mnist_b(), torch.rand(1, 28, 28), 2)


def test_default_pass_size_keeps_the_largest_conv_output_within_budget() -> None:
    from dlguard.probes import default_max_batch
    from dlguard.zoo import mnist_a

    images = torch.rand(3, 1, 28, 28)
    model = mnist_b()
    # the largest conv output of mnist_b is conv1's 32x26x26 float32 map per image
    assert default_max_batch(model, images, {"conv1": model.conv1, "conv4": model.conv4}) == (8 << 20) // (
        32 * 26 * 26 * 4
    )
    net = mnist_a()
    assert default_max_batch(net, images, {"conv1": net.conv1}) == (8 << 20) // (6 * 24 * 24 * 4)
    assert not model.conv1._forward_hooks
