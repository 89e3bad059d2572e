"""LoopOutputs reuses the validation step's own logits only when they are exactly the adapter's."""

from __future__ import annotations

import torch
from torch import nn

from dlguard.probes import LoopOutputs, ModelAdapter


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, features: bool = False) -> torch.Tensor:
        return x if features else self.linear(x)


def _recorded(calls) -> tuple[LoopOutputs, Net]:
    net, loop = Net(), LoopOutputs()
    loop.start(net)
    calls(net)
    loop.stop()
    return loop, net


def test_the_loops_call_on_the_prepared_inputs_is_reused() -> None:
    x = torch.rand(5, 4)
    loop, net = _recorded(lambda net: net(2 * x))
    adapter = ModelAdapter(net, preprocess=lambda t: 2 * t)
    assert torch.equal(loop.logits(adapter, x, width=3), net(2 * x))
    assert loop.logits(adapter, x, width=4) is None  # not the logits' width
    assert loop.logits(adapter, x + 1) is None  # other inputs
    assert len(net._forward_hooks) == 0


def test_calls_with_options_or_inputs_changed_in_place_are_not_reused() -> None:
    x = torch.rand(5, 3)
    loop, net = _recorded(lambda net: net(x, features=True))  # (5, 3) features, shaped like logits
    assert loop.logits(ModelAdapter(net), x, width=3) is None
    y = torch.rand(5, 4)
    loop, net = _recorded(lambda net: (net(y), y.mul_(0.5)))
    assert loop.logits(ModelAdapter(net), y, width=3) is None  # y now holds other values than at the call


def test_an_output_transform_that_does_not_fit_the_recorded_output_is_skipped() -> None:
    x = torch.rand(5, 4)
    loop, net = _recorded(lambda net: net(x))
    adapter = ModelAdapter(net, output_transform=lambda out: out["logits"])  # the loop's call returned a tensor
    assert loop.logits(adapter, x) is None
    loop.clear()
    assert loop.logits(ModelAdapter(net), x) is None
