"""The evaluation loop's own forward passes, kept for one batch so a probe draw need not run the model again."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from dlguard.probes.adapter import ModelAdapter

__all__ = ["LoopOutputs"]


class LoopOutputs:
    """Records ``(first tensor argument, output)`` of every call of a model between :meth:`start` and :meth:`stop`.

    A callback starts it when a validation batch starts and asks :meth:`logits` when the batch ends:
    when the loop called the model on exactly the adapter's prepared inputs (``preprocess`` applied,
    the same values, shape and dtype), the loop's own output, through ``output_transform``, is the
    adapter's output, and no forward pass is spent. Otherwise it answers ``None`` and the caller runs
    the model. Outputs computed under autocast (``"bf16-mixed"``) are the loop's own predictions.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net, x = nn.Linear(3, 2), torch.rand(4, 3)
        >>> adapter, loop = ModelAdapter(net, preprocess=lambda t: 2 * t - 1), LoopOutputs()
        >>> loop.start(net)
        >>> _ = net(2 * x - 1)  # what the validation step runs
        >>> loop.stop()
        >>> torch.equal(loop.logits(adapter, x), net(2 * x - 1)), loop.logits(adapter, x + 1) is None
        (True, True)
    """

    def __init__(self) -> None:
        self._handle: RemovableHandle | None = None
        self._calls: list[tuple[Tensor, int | None, Any]] = []  # argument, its version at the call, output

    def start(self, model: nn.Module) -> None:
        """Forget earlier calls and record the calls of ``model`` from now on."""
        self.stop()
        self._calls = []
        self._handle = model.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        if len(tensors) == 1 and not kwargs:  # model(x): a call with options may return something else
            self._calls.append((tensors[0], _version(tensors[0]), output))

    def stop(self) -> None:
        """Stop recording (the hook is removed; what was recorded stays until the next :meth:`start`)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def clear(self) -> None:
        """Stop and forget every recorded call."""
        self.stop()
        self._calls = []

    def logits(self, adapter: ModelAdapter, inputs: Tensor, width: int | None = None) -> Tensor | None:
        """The loop's ``(B, K)`` output on ``inputs`` through ``adapter``; ``None`` when the loop did not run them.

        Only calls with one tensor argument and no keyword count, whose argument was not changed in
        place after the call, and whose output reads as ``(B, width)`` logits through ``output_transform``.
        """
        if not self._calls:
            return None
        with torch.no_grad():
            prepared = adapter.prepare(inputs)
            for argument, version, output in self._calls:
                if _version(argument) != version or argument.shape != prepared.shape:
                    continue
                if argument.dtype != prepared.dtype or argument.device != prepared.device:
                    continue
                if not torch.equal(argument, prepared):
                    continue
                try:
                    logits = adapter.finish(output)
                except Exception:  # an output_transform written for another call's output
                    continue
                if not isinstance(logits, Tensor) or logits.ndim != 2 or len(logits) != len(inputs):
                    continue
                if width is None or logits.shape[1] == width:
                    return logits
        return None


def _version(tensor: Tensor) -> int | None:
    """How often ``tensor`` was changed in place (``None`` for an inference tensor, which keeps no count)."""
    return None if tensor.is_inference() else tensor._version
