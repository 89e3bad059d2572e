"""A model's outputs on a batch, checked for what the caller reads from them: logits or regression predictions."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from dlguard import _distributed
from dlguard.metrics.functional.metamorphic import check_outputs
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.evaluation import evaluation

__all__ = ["Task", "check_num_classes", "correct_predictions", "logit_width", "model_outputs", "pass_outputs"]

Task = Literal["classification", "regression"]
"""What a model's output is read as: logits ``(B, K)``, or one prediction per input ``(B,)``/``(B, 1)``."""

_NAME = "model output (after output_transform)"


def model_outputs(
    model: nn.Module | ModelAdapter, inputs: Tensor, task: Task = "classification", max_batch: int | None = None
) -> Tensor:
    """The model's outputs on ``inputs``: logits ``(B, K)``, or predictions ``(B,)`` for ``task="regression"``.

    Runs the model through its adapter (``preprocess``, ``output_transform``) in eval mode without
    gradients, in passes of at most ``max_batch`` inputs (``None``: a memory budget), and leaves it
    as found. An output that is not a tensor raises ``ValueError`` naming ``output_transform``; one
    of the other task's shape names the task (:func:`~dlguard.metrics.functional.check_outputs`).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Linear(3, 1)
        >>> model_outputs(net, torch.zeros(5, 3), "regression").shape
        torch.Size([5])
        >>> returns_dict = ModelAdapter(net, output_transform=lambda out: {"y": out})
        >>> model_outputs(returns_dict, torch.zeros(2, 3))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: output_transform: the model returned dict, expected a tensor of logits (B, K) or ...
    """
    adapter = ModelAdapter.wrap(model)
    if not len(inputs):
        width = () if task == "regression" else (0,)
        return torch.zeros((0, *width), device=adapter.device)
    with evaluation(adapter.model), torch.no_grad():
        rows = adapter.rows_per_pass(inputs, max_batch)
        return torch.cat([pass_outputs(adapter, part, task) for part in inputs.split(rows)])


def pass_outputs(adapter: ModelAdapter, inputs: Tensor, task: Task = "classification") -> Tensor:
    """One pass of the model on ``inputs``, checked as :func:`model_outputs` checks it (the caller holds eval mode)."""
    output = adapter(inputs)
    if not isinstance(output, Tensor):
        raise ValueError(
            f"output_transform: the model returned {type(output).__name__}, expected a tensor of logits (B, K) or "
            "predictions (B,); pass output_transform= to map the model's output to one"
        )
    if output.ndim == 0 or len(output) != len(inputs):
        raise ValueError(
            f"output_transform: the model's output has shape {tuple(output.shape)} for {len(inputs)} inputs, "
            "expected one row per input"
        )
    return check_outputs(task, output.float(), _NAME)


def correct_predictions(model: nn.Module | ModelAdapter, inputs: Tensor, target: Tensor) -> Tensor:
    """``(B,)`` whether the model's top-1 class of each input is its label (eval mode, no gradients).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Linear(2, 2, bias=False)
        >>> _ = net.weight.data.copy_(torch.eye(2))
        >>> correct_predictions(net, torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([0, 1])).tolist()
        [True, False]
    """
    adapter = ModelAdapter.wrap(model)
    with evaluation(adapter.model), torch.no_grad():
        return adapter.logits(inputs).argmax(dim=1) == target.to(adapter.device)


def logit_width(adapter: ModelAdapter, inputs: Tensor) -> int:
    """``K``, the width of the model's logits, agreed by every process (0 when no process has an input).

    Runs the model on one input; a collective under DDP.
    """
    width = 0
    if len(inputs):
        with evaluation(adapter.model), torch.no_grad():
            width = adapter.logits(inputs[:1]).shape[1]
    return int(_distributed.gather_cat(torch.tensor([width], device=inputs.device)).max())


def check_num_classes(num_classes: int | None, width: int, what: str = "probe inputs") -> int:
    """``K``: the logits' ``width``; ``num_classes`` must be it when given, and some process must hold inputs."""
    if width == 0:
        raise ValueError(f"{what}: none on any process; the test needs at least one")
    if num_classes is not None and num_classes != width:
        raise ValueError(
            f"num_classes: is {num_classes} but the model's outputs have {width} classes; pass the width of the "
            "logits (or leave num_classes unset)"
        )
    return width
