"""Pixel-space gradients of a model's loss: what the gradient attacks and the ``S_grad`` indicator take."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

__all__ = ["input_gradients", "loss_gradient"]


@contextmanager
def input_gradients(model: nn.Module) -> Iterator[None]:
    """Eval mode, parameters frozen, gradients on -- also inside ``no_grad`` or ``inference_mode`` (SPEC §0).

    The model is left exactly as found on exit, also after an exception.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Linear(2, 2)
        >>> with torch.no_grad(), input_gradients(net):
        ...     torch.is_grad_enabled(), net.training, net.weight.requires_grad
        (True, False, False)
    """
    with evaluation(model), torch.inference_mode(False), torch.enable_grad():
        yield


def loss_gradient(adapter: ModelAdapter, inputs: Tensor, target: Tensor) -> Tensor:
    """``∇_x CE(f(x), y)`` per row, in ``inputs``' dtype; call inside :func:`input_gradients`.

    The gradient of the *summed* cross-entropy: each row gets its own loss's gradient (in eval mode
    no layer mixes rows). ``inputs`` (on the model's device) is detached and cloned, so an inference
    tensor is fine.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Linear(2, 2)
        >>> with torch.no_grad():
        ...     _ = net.weight.copy_(torch.tensor([[1.0, -3.0], [-1.0, 3.0]])), net.bias.zero_()
        >>> with input_gradients(net):  # softmax (1/2, 1/2): ∇ = Wᵀ(p − e_0) = (−1, 3)
        ...     loss_gradient(ModelAdapter(net), torch.zeros(1, 2), torch.tensor([0]))
        tensor([[-1.,  3.]])
    """
    x = inputs.detach().clone().requires_grad_(True)
    loss = F.cross_entropy(adapter.logits(x), target, reduction="sum")
    (gradient,) = torch.autograd.grad(loss, x)
    return gradient
