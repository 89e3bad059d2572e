from __future__ import annotations

import math

import pytest
import torch

from dlguard._random import _mix32, _mul32, content_keys, keyed_normal, keyed_uniform

N = 4000


def images(n: int = N, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 1, 6, 6, generator=torch.Generator().manual_seed(seed))


def ks_uniform(samples: torch.Tensor) -> float:
    """Kolmogorov-Smirnov distance of ``samples`` (values in [0, 1]) from U(0, 1)."""
    x = samples.double().sort().values
    n = len(x)
    upper = torch.arange(1, n + 1, dtype=torch.float64) / n - x
    lower = x - torch.arange(0, n, dtype=torch.float64) / n
    return float(torch.maximum(upper, lower).max())


# at n = 4000 the 0.1% critical value of the KS statistic is 1.95 / sqrt(n) ~ 0.031
KS_LIMIT = 1.95 / math.sqrt(N)


def lowbias32(x: int) -> int:
    """Wellons' lowbias32 on Python integers (reference for the tensor version)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mix32_and_mul32_match_python_integers() -> None:
    values = [0, 1, 2, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 123456789, 0xDEADBEEF]
    tensor = torch.tensor(values, dtype=torch.int64)
    assert _mix32(tensor).tolist() == [lowbias32(v) for v in values]
    for constant in (0x9E3779B9, 0x846CA68B, 0xFFFFFFFF, 3):
        assert _mul32(tensor, constant).tolist() == [(v * constant) & 0xFFFFFFFF for v in values]


def test_keys_depend_on_content_not_on_batch_order_or_composition() -> None:
    x = images(64)
    keys = content_keys(x)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(content_keys(x[perm]), keys[perm])
    pieces = [content_keys(part) for part in x[perm].split([1, 10, 20, 33])]
    assert torch.equal(torch.cat(pieces), keys[perm])
    other = torch.cat([x[:5], images(7, seed=9)])  # same inputs among different company
    assert torch.equal(content_keys(other)[:5], keys[:5])


def test_keys_are_the_same_for_float32_and_float64() -> None:
    x = images(50)
    assert torch.equal(content_keys(x.double()), content_keys(x))
    assert torch.equal(content_keys(x.double(), seed=3), content_keys(x, seed=3))
    half = x.half()  # keyed by the value in float32
    assert torch.equal(content_keys(half), content_keys(half.float()))


def test_keys_follow_the_logical_layout_not_the_memory_layout() -> None:
    x = torch.rand(10, 3, 4, 5, generator=torch.Generator().manual_seed(4))
    assert torch.equal(content_keys(x.to(memory_format=torch.channels_last)), content_keys(x))
    assert torch.equal(content_keys(x.transpose(2, 3).contiguous().transpose(2, 3)), content_keys(x))


def test_keys_are_in_range_and_distinct() -> None:
    keys = content_keys(images())
    assert keys.dtype == torch.int64
    assert int(keys.min()) >= 0 and int(keys.max()) < 2**62
    assert len(keys.unique()) == N


def test_single_element_changes_change_the_key() -> None:
    x = images(1)
    base = int(content_keys(x))
    flat = x.reshape(-1)
    changed = []
    for j in range(flat.numel()):
        y = flat.clone()
        y[j] = torch.nextafter(y[j], torch.tensor(2.0))  # one ulp
        changed.append(int(content_keys(y.reshape(x.shape))))
    swapped = flat.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    changed.append(int(content_keys(swapped.reshape(x.shape))))
    assert base not in changed and len(set(changed)) == len(changed)


def test_seeds_give_unrelated_keys() -> None:
    x = images()
    a, b = content_keys(x, seed=0), content_keys(x, seed=1)
    assert int((a == b).sum()) == 0
    # the ranks under two seeds are uncorrelated (Spearman ~ N(0, 1/sqrt(N)))
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    spearman = float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])
    assert abs(spearman) < 4 / math.sqrt(N)
    assert torch.equal(content_keys(x, seed=1), b)  # and each is reproducible


@pytest.mark.parametrize(
    "inputs",
    [
        images(),  # random images
        torch.arange(N, dtype=torch.float32).reshape(N, 1) / N,  # evenly spaced scalars
        torch.eye(N)[:, : N // 2].reshape(N, 1, 40, 50),  # one-hot images (and N // 2 all-zero ones, one key)
        torch.arange(N).reshape(N, 1) * torch.ones(1, 8, dtype=torch.long),  # integer rows
    ],
    ids=["random", "spaced", "onehot", "integers"],
)
def test_keys_are_roughly_uniform(inputs: torch.Tensor) -> None:
    keys = content_keys(inputs).unique()
    assert len(keys) > N // 3
    u = keys.double() / 2**62
    assert ks_uniform(u) < 1.95 / math.sqrt(len(keys))
    # the low bits are uniform too (keys mod 16 in 16 equal bins, chi-square with 15 dof, 0.1% ~ 37.7)
    counts = torch.bincount(keys % 16, minlength=16).double()
    expected = len(keys) / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 37.7


def test_content_keys_needs_a_batch() -> None:
    with pytest.raises(ValueError, match="inputs"):
        content_keys(torch.tensor(1.0))


def test_keyed_draws_do_not_depend_on_batch_composition() -> None:
    keys = content_keys(images(40))
    u = keyed_uniform(keys, (3, 5), salt=7)
    z = keyed_normal(keys, (3, 5), salt=7)
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(2))
    assert torch.equal(keyed_uniform(keys[perm], (3, 5), salt=7), u[perm])
    assert torch.equal(keyed_normal(keys[perm], (3, 5), salt=7), z[perm])
    parts = [keyed_uniform(part, (3, 5), salt=7) for part in keys.split([1, 13, 26])]
    assert torch.equal(torch.cat(parts), u)
    assert torch.equal(keyed_uniform(keys[:1], (3, 5), salt=7)[0], u[0])
    # the flat element index is what counts: another shape with the same size is a reshape of the same draw
    assert torch.equal(keyed_uniform(keys, (15,), salt=7), u.reshape(40, 15))


def test_sparse_and_binary_inputs_get_distinct_keys() -> None:
    # an ideal 31-bit key collides among n inputs with probability ~ n**2 / 2**32: 0.4% for 4096, 1.5% for 8000
    one_hot = torch.eye(4096).reshape(4096, 1, 64, 64)
    assert len(content_keys(one_hot).unique()) == 4096
    binary = (torch.rand(8000, 1, 28, 28, generator=torch.Generator().manual_seed(0)) < 0.02).float()
    assert len(binary.reshape(8000, -1).unique(dim=0)) == 8000
    assert len(content_keys(binary).unique()) == 8000


def test_keyed_draws_differ_by_salt_and_key() -> None:
    keys = content_keys(images(200))
    a = keyed_uniform(keys, (50,), salt=0, dtype=torch.float64)
    b = keyed_uniform(keys, (50,), salt=1, dtype=torch.float64)
    assert int((a == b).sum()) == 0
    assert len(a.unique()) >= a.numel() - 1  # 32-bit draws: a birthday pair among 10,000 has probability 1 %
    corr = float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])
    assert abs(corr) < 4 / math.sqrt(a.numel())


def test_keyed_uniform_is_uniform_and_independent() -> None:
    u = keyed_uniform(torch.arange(N), (10,), salt=3, dtype=torch.float64)
    assert float(u.min()) > 0 and float(u.max()) <= 1
    assert ks_uniform(u.flatten()) < 1.95 / math.sqrt(u.numel())
    # neighbouring elements of one row and the same element of neighbouring keys are uncorrelated
    limit = 4 / math.sqrt(u.numel())
    assert abs(float(torch.corrcoef(torch.stack([u[:, :-1].flatten(), u[:, 1:].flatten()]))[0, 1])) < limit
    assert abs(float(torch.corrcoef(torch.stack([u[:-1].flatten(), u[1:].flatten()]))[0, 1])) < limit


def test_keyed_normal_moments_and_tail() -> None:
    z = keyed_normal(torch.arange(N), (25,), salt=5, dtype=torch.float64)
    n = z.numel()
    assert abs(float(z.mean())) < 4 / math.sqrt(n)
    assert abs(float(z.var()) - 1) < 4 * math.sqrt(2 / n)
    assert abs(float((z.abs() > 1.96).double().mean()) - 0.05) < 0.004
    # normal CDF of the draws is uniform
    cdf = 0.5 * (1 + torch.erf(z.flatten() / math.sqrt(2)))
    assert ks_uniform(cdf) < 1.95 / math.sqrt(n)
    assert keyed_normal(torch.arange(3), (2,)).dtype == torch.float32
    assert torch.isfinite(keyed_normal(torch.arange(N), (25,))).all()


def test_small_integer_keys_give_unrelated_rows() -> None:
    u = keyed_uniform(torch.arange(50), (50,), salt=0)
    assert not torch.equal(u, u.T)
    assert len(u.diagonal().unique()) == 50
