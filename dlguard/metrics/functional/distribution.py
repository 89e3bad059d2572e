"""HDA's global distribution (SPEC §4): a mixture of per-point diagonal Gaussians, in log space.

Each fitted point ``i`` (a training input's VAE posterior) contributes ``N(μ_i, diag σ_i²)``:

``log p_g(z) = logsumexp_i Σ_d log N(z_d; μ_id, σ_id) − log n``

Queries are scored against every point in chunks sized by a memory budget, with a running
``logsumexp`` over point chunks, so no density ever leaves log space (HDA's reference code takes
``exp`` and underflows to 0 in 32 dimensions).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dlguard._validation import check_tensor, check_values, positive_int

__all__ = ["kde_log_density", "kde_sample"]

_LOG_2PI = math.log(2 * math.pi)


def _check_mixture(mu: Tensor, sigma: Tensor, values: bool = True) -> None:
    check_tensor("mu", mu, floating=True)
    check_tensor("sigma", sigma, floating=True)
    if mu.ndim != 2 or mu.shape[0] == 0:
        raise ValueError(f"mu: expected shape (n, D) with n >= 1, got {tuple(mu.shape)}")
    if sigma.shape != mu.shape:
        raise ValueError(f"sigma: expected the shape of mu {tuple(mu.shape)}, got {tuple(sigma.shape)}")
    if values:
        check_values("mu", mu, None)
        check_values("sigma", sigma, None)
        if bool((sigma <= 0).any()):
            raise ValueError("sigma: expected every bandwidth > 0")


def kde_log_density(
    query: Tensor,
    mu: Tensor,
    sigma: Tensor,
    leave_one_out: bool = False,
    max_elements: int = 2**24,
    exclude: Tensor | None = None,
    validate_args: bool = True,
) -> Tensor:
    """``log p_g(query_j)`` under the mixture of ``N(μ_i, diag σ_i²)`` (SPEC §4), ``(Q,)``.

    Args:
        query: ``(Q, D)`` latent points to score.
        mu: ``(n, D)`` mixture means (the fitted points).
        sigma: ``(n, D)`` per-point, per-dimension bandwidths (posterior σ), all ``> 0``.
        leave_one_out: the queries are the fitted points themselves (``Q = n``, query ``j`` is point
            ``j``): leave each one's own kernel out, so a point is not scored against itself.
        max_elements: memory budget, in elements of the ``(queries, points, D)`` block evaluated at
            once; results do not depend on it.
        exclude: ``(Q,)`` integer index of a fitted point to leave out of query ``j``'s mixture (the
            query *is* that point), ``-1`` to keep every point; the mixture left is normalised by
            its own size ``n − 1``. Generalises ``leave_one_out`` (``exclude = arange(n)``) to
            queries of which only some are fitted points; not combined with it.
        validate_args: check the values (NaN, ``σ > 0``); a caller whose mixture and queries are its own
            (a fitted :class:`~dlguard.generate.GlobalDistribution`) passes ``False``.

    Returns:
        ``(Q,)`` log densities, in the dtype of ``mu`` and on its device.

    Example:
        >>> mu = torch.tensor([[0.0], [2.0]])
        >>> sigma = torch.ones(2, 1)
        >>> kde_log_density(torch.tensor([[0.0]]), mu, sigma).exp().round(decimals=4)
        tensor([0.2265])
        >>> kde_log_density(mu, mu, sigma, leave_one_out=True).exp().round(decimals=4)  # N(0; 2, 1) each
        tensor([0.0540, 0.0540])
        >>> kde_log_density(mu, mu, sigma, exclude=torch.tensor([-1, 0])).exp().round(decimals=4)  # second alone
        tensor([0.2265, 0.3989])
    """
    _check_mixture(mu, sigma, values=validate_args)
    check_tensor("query", query, floating=True)
    if query.ndim != 2 or query.shape[1] != mu.shape[1]:
        raise ValueError(f"query: expected shape (Q, {mu.shape[1]}), got {tuple(query.shape)}")
    if validate_args:
        check_values("query", query, None)
    positive_int("max_elements", max_elements)
    n, dims = mu.shape
    if leave_one_out and (query.shape[0] != n or n < 2):
        raise ValueError(
            f"leave_one_out: expected the fitted points as queries (Q = n >= 2), got Q={query.shape[0]}, n={n}"
        )
    if exclude is not None:
        if leave_one_out:
            raise ValueError("exclude: give either leave_one_out=True or exclude, not both")
        exclude = _check_exclude(exclude, query.shape[0], n).to(mu.device)
    elif leave_one_out:
        exclude = torch.arange(n, device=mu.device)
    query = query.to(device=mu.device, dtype=mu.dtype)
    # Σ_d log N(z_d; μ_d, σ_d) = −½ Σ_d ((z_d − μ_d)/σ_d)² − Σ_d log σ_d − D/2 · log 2π
    inv_sigma = sigma.reciprocal()
    log_norm = -sigma.log().sum(dim=1) - 0.5 * dims * _LOG_2PI  # (n,)
    points_per_chunk = max(1, min(n, max_elements // max(1, dims)))
    queries_per_chunk = max(1, max_elements // (points_per_chunk * max(1, dims)))
    out = torch.empty(query.shape[0], dtype=mu.dtype, device=mu.device)
    for q0 in range(0, query.shape[0], queries_per_chunk):
        z = query[q0 : q0 + queries_per_chunk, None, :]  # (q, 1, D)
        running = torch.full((z.shape[0],), -math.inf, dtype=mu.dtype, device=mu.device)
        for p0 in range(0, n, points_per_chunk):
            p1 = min(n, p0 + points_per_chunk)
            scaled = (z - mu[None, p0:p1]) * inv_sigma[None, p0:p1]  # (q, p, D)
            log_kernel = log_norm[p0:p1] - 0.5 * scaled.square().sum(dim=2)  # (q, p)
            if exclude is not None:
                cols = torch.arange(p0, p1, device=mu.device)[None, :]
                log_kernel = log_kernel.masked_fill(exclude[q0 : q0 + z.shape[0], None] == cols, -math.inf)
            running = torch.logaddexp(running, torch.logsumexp(log_kernel, dim=1))
        out[q0 : q0 + z.shape[0]] = running
    if exclude is None:
        return out - math.log(n)
    return out - torch.log(n - (exclude >= 0).to(out.dtype))


def _check_exclude(exclude: object, queries: int, n: int) -> Tensor:
    if not isinstance(exclude, Tensor) or exclude.is_floating_point() or exclude.dtype == torch.bool:
        raise ValueError(f"exclude: expected an integer tensor of point indices, got {exclude!r:.60}")
    if exclude.shape != (queries,):
        raise ValueError(f"exclude: expected shape ({queries},), one index per query, got {tuple(exclude.shape)}")
    if exclude.numel():
        low, high = int(exclude.min()), int(exclude.max())
        if low < -1 or high >= n:
            raise ValueError(f"exclude: expected indices in [-1, {n}) (-1 keeps every point), got [{low}, {high}]")
        if n == 1 and high == 0:
            raise ValueError("exclude: cannot leave out the only fitted point (the mixture left would be empty)")
    return exclude.long()


def kde_sample(mu: Tensor, sigma: Tensor, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
    """``(num_samples, D)`` draws from the mixture: a point uniformly, then ``μ_i + σ_i·ε``.

    ``generator`` lives on the device of ``mu`` (a CPU generator for CPU tensors).

    Example:
        >>> mu, sigma = torch.tensor([[0.0, 0.0], [10.0, 10.0]]), torch.full((2, 2), 0.1)
        >>> z = kde_sample(mu, sigma, 1000, torch.Generator().manual_seed(0))
        >>> z.shape, bool(((z - 5).abs() > 4).all())  # every draw sits near one of the two means
        (torch.Size([1000, 2]), True)
    """
    _check_mixture(mu, sigma)
    positive_int("num_samples", num_samples)
    index = torch.randint(mu.shape[0], (num_samples,), generator=generator, device=mu.device)
    noise = torch.randn(num_samples, mu.shape[1], generator=generator, device=mu.device, dtype=mu.dtype)
    return mu[index] + sigma[index] * noise
