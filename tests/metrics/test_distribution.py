from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Categorical, Independent, MixtureSameFamily, Normal

from dlguard.metrics.functional import kde_log_density, kde_sample


def mixture(mu: torch.Tensor, sigma: torch.Tensor) -> MixtureSameFamily:
    """An independent reference: torch.distributions' mixture of diagonal Gaussians, equal weights."""
    weights = Categorical(logits=torch.zeros(mu.shape[0], dtype=mu.dtype))
    return MixtureSameFamily(weights, Independent(Normal(mu, sigma), 1))


@pytest.fixture
def points() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    mu = torch.randn(37, 5, generator=gen, dtype=torch.float64)
    sigma = 0.2 + torch.rand(37, 5, generator=gen, dtype=torch.float64)
    query = 1.5 * torch.randn(11, 5, generator=gen, dtype=torch.float64)
    return mu, sigma, query


def test_log_density_is_the_mixture_of_posteriors(points) -> None:
    mu, sigma, query = points
    torch.testing.assert_close(kde_log_density(query, mu, sigma), mixture(mu, sigma).log_prob(query))


def test_the_memory_budget_does_not_change_a_number(points) -> None:
    mu, sigma, query = points
    whole = kde_log_density(query, mu, sigma)
    for budget in (1, 7, 5 * 37, 5 * 37 * 3 + 1):
        torch.testing.assert_close(kde_log_density(query, mu, sigma, max_elements=budget), whole)
        torch.testing.assert_close(
            kde_log_density(mu, mu, sigma, leave_one_out=True, max_elements=budget),
            kde_log_density(mu, mu, sigma, leave_one_out=True),
        )


def test_leave_one_out_scores_each_point_against_the_others(points) -> None:
    mu, sigma, _ = points
    got = kde_log_density(mu, mu, sigma, leave_one_out=True)
    for j in (0, 17, 36):
        keep = torch.arange(37) != j
        expected = mixture(mu[keep], sigma[keep]).log_prob(mu[j])
        torch.testing.assert_close(got[j], expected)
    # a point scored against a KDE that contains it is denser: the defect leave-one-out removes
    assert bool((kde_log_density(mu, mu, sigma) > got).all())


def test_stays_in_log_space_where_exp_underflows() -> None:
    mu, sigma = torch.zeros(1, 32), torch.full((1, 32), 0.05)
    query = torch.full((1, 32), 1.0)  # 20 σ away in each of 32 dimensions
    naive = Normal(mu, sigma).log_prob(query).sum().exp()  # HDA's reference: exp, then a product
    assert float(naive) == 0.0
    expected = 32 * (-math.log(0.05) - 0.5 * math.log(2 * math.pi) - 0.5 * 20**2)
    assert float(kde_log_density(query, mu, sigma)) == pytest.approx(expected, rel=1e-6)


def test_samples_follow_the_mixture() -> None:
    mu = torch.tensor([[0.0, 0.0], [6.0, -6.0]])
    sigma = torch.tensor([[0.5, 1.0], [0.2, 0.3]])
    z = kde_sample(mu, sigma, 20000, torch.Generator().manual_seed(0))
    first = z[:, 0] < 3
    assert float(first.float().mean()) == pytest.approx(0.5, abs=0.02)
    torch.testing.assert_close(z[first].mean(0), mu[0], atol=0.05, rtol=0)
    torch.testing.assert_close(z[first].std(0), sigma[0], atol=0.05, rtol=0)
    torch.testing.assert_close(z[~first].std(0), sigma[1], atol=0.02, rtol=0)
    again = kde_sample(mu, sigma, 20000, torch.Generator().manual_seed(0))
    assert torch.equal(z, again)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sigma": torch.zeros(4, 3)}, r"sigma: expected every bandwidth > 0"),
        ({"sigma": torch.ones(4, 2)}, r"sigma: expected the shape of mu \(4, 3\)"),
        ({"mu": torch.zeros(0, 3), "sigma": torch.ones(0, 3)}, r"mu: expected shape \(n, D\) with n >= 1"),
        ({"query": torch.zeros(2, 4)}, r"query: expected shape \(Q, 3\)"),
        ({"query": torch.full((2, 3), math.nan)}, r"query: contains NaN"),
        ({"leave_one_out": True}, r"leave_one_out: expected the fitted points as queries"),
        ({"max_elements": 0}, r"max_elements: expected an integer of at least 1"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(kwargs: dict, message: str) -> None:
    args = {"query": torch.zeros(2, 3), "mu": torch.zeros(4, 3), "sigma": torch.ones(4, 3)} | kwargs
    with pytest.raises(ValueError, match=message):
        kde_log_density(**args)
    with pytest.raises(ValueError, match="num_samples"):
        kde_sample(torch.zeros(4, 3), torch.ones(4, 3), 0)


def test_exclude_leaves_out_one_given_point_per_query(points) -> None:
    mu, sigma, query = points
    exclude = torch.tensor([-1, 0, 36, -1, 17, 5, 5, -1, 36, 1, 2])
    got = kde_log_density(query, mu, sigma, exclude=exclude)
    for j, point in enumerate(exclude.tolist()):
        keep = torch.arange(37) != point  # all True for -1
        torch.testing.assert_close(got[j], mixture(mu[keep], sigma[keep]).log_prob(query[j]))
    for budget in (1, 7, 5 * 37 + 3):
        torch.testing.assert_close(kde_log_density(query, mu, sigma, exclude=exclude, max_elements=budget), got)
    # leave_one_out is exclude = arange(n)
    torch.testing.assert_close(
        kde_log_density(mu, mu, sigma, exclude=torch.arange(37)), kde_log_density(mu, mu, sigma, leave_one_out=True)
    )


@pytest.mark.parametrize(
    ("exclude", "message"),
    [
        (torch.tensor([0.0, 1.0]), r"exclude: expected an integer tensor"),
        (torch.tensor([0, 1, 2]), r"exclude: expected shape \(2,\)"),
        (torch.tensor([0, 4]), r"exclude: expected indices in \[-1, 4\)"),
        (torch.tensor([-2, 0]), r"exclude: expected indices in \[-1, 4\)"),
    ],
)
def test_bad_exclude_is_refused(exclude: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kde_log_density(torch.zeros(2, 3), torch.zeros(4, 3), torch.ones(4, 3), exclude=exclude)
    with pytest.raises(ValueError, match="only fitted point"):
        kde_log_density(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), exclude=torch.tensor([0]))
    with pytest.raises(ValueError, match="not both"):
        kde_log_density(torch.zeros(4, 3), torch.zeros(4, 3), torch.ones(4, 3), True, exclude=torch.arange(4))
