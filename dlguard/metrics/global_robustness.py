"""HDA's empirical global robustness ``R̂_g`` as a torchmetrics metric (SPEC §4, the paper's Definition 5).

States stay in log space: the densities ``p_g`` of seeds in a 32-d latent space can lie far outside
what ``exp`` represents (``exp(−300)`` is 0 in float32, ``exp(−746)`` is 0 in float64), so the
metric keeps ``log Σ_{correct} p_i`` and ``log Σ p_i`` and reduces them across batches and
processes by log-sum-exp. torchmetrics (checked on 1.3.0, 1.4.0 and 1.9.0, ``Metric._sync_dist``
and ``Metric._reduce_states``) accepts a callable ``dist_reduce_fx`` and applies it to the states
stacked along a new first dimension: the gathered per-process states ``(world,)`` under DDP, and
``(2,)`` = (accumulated, batch) in ``forward`` and ``merge_state``. A module-level function (not
a lambda) keeps the metric picklable for ``ddp_spawn``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from dlguard.metrics.functional.hda import _empirical_global_robustness_compute, _empirical_global_robustness_update

__all__ = ["EmpiricalGlobalRobustness"]


def _log_sum_exp(states: Tensor) -> Tensor:
    """``dist_reduce_fx`` of a log-space sum: log-sum-exp over the stacked states (first dimension)."""
    return torch.logsumexp(states, dim=0)


class EmpiricalGlobalRobustness(Metric):
    r"""``R̂_g = Σ_i 1[f(x'_i) = y_i]·p_i / Σ_i p_i``: robustness of test cases weighted by their seeds' density.

    Each seed ``x_i`` (label ``y_i``, global density ``p_i = p_g(x_i)``) contributes the test case
    ``x'_i`` found around it (HDA: the seed's AE). The densities are normalised over all seeds of
    all batches and processes, so ``R̂_g ∈ [0, 1]`` is the density-weighted share of test cases
    still classified as their seeds.

    ``update(preds, target, log_density)`` takes

    - ``preds``: ``(B,)`` predicted labels of the test cases, or their logits ``(B, K)``;
    - ``target``: ``(B,)`` the seeds' labels;
    - ``log_density``: ``(B,)`` ``log p_g`` of the seeds (any scale: only ratios matter; ``-inf`` is
      weight 0, NaN is refused).

    ``compute()`` returns a float64 scalar; NaN when every weight is 0. States: ``log_correct`` and
    ``log_total`` (float64 log-sums, reduced by log-sum-exp) and ``count`` (seeds, reduced by sum),
    so N processes report what one process reports for the same seeds (up to float64 rounding).

    Args:
        validate_args: check the values of every update (label range, NaN densities: a host sync each);
            a caller feeding its own checked outputs (the HDA callback) passes ``False``.

    Example:
        >>> import torch
        >>> metric = EmpiricalGlobalRobustness()
        >>> log_p = torch.tensor([0.5, 0.3, 0.2]).log() - 300.0  # exp() of these underflows float32
        >>> metric.update(torch.tensor([1, 2]), torch.tensor([1, 0]), log_p[:2])  # the second is misclassified
        >>> metric.update(torch.tensor([[0.1, 2.0]]), torch.tensor([1]), log_p[2:])  # logits are fine too
        >>> round(float(metric.compute()), 4)
        0.7
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    log_correct: Tensor
    log_total: Tensor
    count: Tensor

    def __init__(self, validate_args: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validate_args = validate_args
        empty = torch.tensor(float("-inf"), dtype=torch.float64)
        self.add_state("log_correct", empty.clone(), dist_reduce_fx=_log_sum_exp)
        self.add_state("log_total", empty.clone(), dist_reduce_fx=_log_sum_exp)
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, log_density: Tensor) -> None:
        """Add the test cases of ``B`` seeds: predictions ``(B,)``/``(B, K)``, labels ``(B,)``, ``log p_g`` ``(B,)``."""
        log_correct, log_total, count = _empirical_global_robustness_update(
            preds, target, log_density, self.validate_args
        )
        device = self.log_total.device
        self.log_correct = torch.logaddexp(self.log_correct, log_correct.to(device, self.log_correct.dtype))
        self.log_total = torch.logaddexp(self.log_total, log_total.to(device, self.log_total.dtype))
        self.count += count.to(device)

    def compute(self) -> Tensor:
        """``R̂_g`` over every seed added (float64 scalar; NaN when every weight is 0)."""
        if int(self.count) == 0:
            raise ValueError("EmpiricalGlobalRobustness: no seeds were added")
        return _empirical_global_robustness_compute(self.log_correct, self.log_total)
