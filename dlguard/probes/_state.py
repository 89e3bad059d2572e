"""Snapshot and exact restoration of what a probe may change on a model (SPEC §0)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


class _ModelState:
    """Remembers a model's train/eval flags, ``requires_grad`` flags and buffers.

    Buffers (BatchNorm statistics, counters) are cloned so that forward passes a probe alters can
    never leave statistics behind; parameters are not copied because no probe writes them.
    """

    def __init__(self, model: nn.Module, *, buffers: bool = True) -> None:
        self._training = [(module, module.training) for module in model.modules()]
        self._requires_grad = [(param, param.requires_grad) for param in model.parameters()]
        self._buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()] if buffers else []

    def restore(self) -> None:
        for module, training in self._training:
            module.training = training
        for param, requires_grad in self._requires_grad:
            param.requires_grad_(requires_grad)
        with torch.no_grad():
            for buffer, saved in self._buffers:
                if not torch.equal(buffer, saved):
                    buffer.copy_(saved)


def _remove_all(handles: list[RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()
