"""HDA's gradient baselines (SPEC §4, adversarial fine-tuning): untargeted L∞ FGSM and PGD on cross-entropy.

Both maximise ``CE(f(x'), y)`` over the ``eps``-ball of each input intersected with ``[0, 1]``
(pixel space, SPEC §0), calling the model through a :class:`~dlguard.probes.ModelAdapter` so that
``preprocess`` applies after the perturbation and gradients are taken with respect to pixels:

- FGSM: ``x' = clip(x + eps·sign(∇_x CE))``.
- PGD: ``x_0 = x`` (or ``x + U(−eps, eps)`` with ``random_start``), then ``steps`` times
  ``x_{t+1} = clip(x_t + step·sign(∇_x CE(f(x_t), y)))``, ``clip`` the projection into
  ``[max(x − eps, 0), min(x + eps, 1)]``.

The gradient of the *summed* cross-entropy is taken per batch: each row's gradient is that of its
own loss (the model runs in eval mode, where no layer mixes rows).
"""

from __future__ import annotations

import warnings
from numbers import Real

import torch
from torch import Tensor, nn

from dlguard._validation import check_labels, check_tensor, check_values, optional_positive_int, positive_int
from dlguard.generate.gradients import input_gradients, loss_gradient
from dlguard.probes.adapter import ModelAdapter

__all__ = ["fgsm", "pgd"]


def _check_inputs(inputs: Tensor, target: Tensor) -> None:
    check_tensor("inputs", inputs, floating=True)
    check_values("inputs", inputs, (0.0, 1.0))
    check_labels("target", target, batch=len(inputs))


def _radius(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"{name}: expected a radius in (0, 1] (pixel space), got {value!r}")
    return float(value)


def _step(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < float(value) < float("inf"):
        raise ValueError(f"step: expected a positive finite step size, got {value!r}")
    return float(value)


def _attack(
    adapter: ModelAdapter,
    inputs: Tensor,
    target: Tensor,
    eps: float,
    step: float,
    steps: int,
    start: Tensor | None,
    max_batch: int | None,
) -> Tensor:
    """Signed-gradient ascent with projection, ``max_batch`` rows at a time; ``start`` is the random offset."""
    device = adapter.device
    results = []
    with input_gradients(adapter.model):
        max_batch = adapter.rows_per_pass(inputs, max_batch) if len(inputs) else 1
        for begin in range(0, len(inputs), max_batch):
            origin = inputs[begin : begin + max_batch].to(device).clone()
            labels = target[begin : begin + max_batch].to(device).clone().long()
            lower, upper = (origin - eps).clamp_min(0.0), (origin + eps).clamp_max(1.0)
            adversarial = origin
            if start is not None:
                adversarial = torch.clamp(origin + start[begin : begin + max_batch].to(device), lower, upper)
            for _ in range(steps):
                gradient = loss_gradient(adapter, adversarial, labels)
                adversarial = torch.clamp(adversarial + step * gradient.sign(), lower, upper)
            results.append(adversarial.detach().to(inputs.device))
    return torch.cat(results) if results else inputs.detach().clone()


def fgsm(
    model: nn.Module | ModelAdapter, inputs: Tensor, target: Tensor, eps: float, max_batch: int | None = None
) -> Tensor:
    """Fast gradient sign method: ``x' = clip_{[0,1]}(x + eps·sign(∇_x CE(f(x), y)))``, untargeted.

    The model runs in eval mode and is left exactly as found (also after an exception); works inside
    ``torch.no_grad()`` and ``torch.inference_mode()``.

    Args:
        model: the network, or a :class:`~dlguard.probes.ModelAdapter` (``preprocess`` after perturbing).
        inputs: ``(B, ...)`` floating inputs in ``[0, 1]``.
        target: ``(B,)`` true labels.
        eps: L∞ radius in ``(0, 1]``.
        max_batch: rows per forward and backward pass (``None``: a memory budget,
            :func:`~dlguard.probes.default_max_batch`).

    Returns:
        ``(B, ...)`` adversarial inputs, detached, on ``inputs``' device and in their dtype.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
        >>> x, y = torch.rand(5, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1])
        >>> adversarial = fgsm(net, x, y, eps=0.1)
        >>> adversarial.shape, bool((adversarial - x).abs().max() <= 0.1 + 1e-6)
        (torch.Size([5, 1, 4, 4]), True)
    """
    eps = _radius("eps", eps)
    optional_positive_int("max_batch", max_batch)
    _check_inputs(inputs, target)
    return _attack(ModelAdapter.wrap(model), inputs, target, eps, eps, 1, None, max_batch)


def pgd(
    model: nn.Module | ModelAdapter,
    inputs: Tensor,
    target: Tensor,
    eps: float,
    step: float = 2 / 255,
    steps: int = 20,
    random_start: bool = False,
    generator: torch.Generator | None = None,
    max_batch: int | None = None,
) -> Tensor:
    """Projected gradient descent (Madry et al.) on cross-entropy, untargeted, L∞ (HDA's baseline, SPEC §4).

    Each of ``steps`` iterations moves ``step·sign(∇_x CE)`` and projects back into the
    ``eps``-ball of the input and ``[0, 1]``. The model runs in eval mode and is left exactly as
    found (also after an exception); works inside ``torch.no_grad()`` and ``torch.inference_mode()``.
    The random start is drawn once for the whole batch (on ``generator``'s device, CPU by default),
    so results do not depend on ``max_batch``.

    Args:
        model: the network, or a :class:`~dlguard.probes.ModelAdapter` (``preprocess`` after perturbing).
        inputs: ``(B, ...)`` floating inputs in ``[0, 1]``.
        target: ``(B,)`` true labels.
        eps: L∞ radius in ``(0, 1]`` (HDA: ``r``, 0.1 on MNIST).
        step: step size (default ``2/255``).
        steps: number of iterations.
        random_start: start from a uniform draw in the ``eps``-ball instead of the input.
        generator: random generator of the start (default: the global one).
        max_batch: rows per forward and backward pass (``None``: a memory budget,
            :func:`~dlguard.probes.default_max_batch`).

    Returns:
        ``(B, ...)`` adversarial inputs, detached, on ``inputs``' device and in their dtype.

    Warns:
        UserWarning: when ``step * steps < eps``: the iterates cannot reach the ball's boundary.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
        >>> x, y = torch.rand(5, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1])
        >>> adversarial = pgd(net, x, y, eps=0.1, step=0.02, steps=10, random_start=True)
        >>> adversarial.shape, bool((adversarial - x).abs().max() <= 0.1 + 1e-6)
        (torch.Size([5, 1, 4, 4]), True)
    """
    eps, step = _radius("eps", eps), _step(step)
    steps = positive_int("steps", steps)
    optional_positive_int("max_batch", max_batch)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    _check_inputs(inputs, target)
    if step * steps < eps * (1 - 1e-9):
        warnings.warn(
            f"pgd: step * steps = {step:g} * {steps} = {step * steps:.4g} < eps = {eps:g}: the attack cannot reach "
            "the boundary of the eps-ball; raise step or steps",
            stacklevel=2,
        )
    start = None
    if random_start:
        device = generator.device if generator is not None else torch.device("cpu")
        uniform = torch.rand(inputs.shape, generator=generator, device=device, dtype=inputs.dtype)
        start = (2 * uniform - 1) * eps
    return _attack(ModelAdapter.wrap(model), inputs, target, eps, step, steps, start, max_batch)
