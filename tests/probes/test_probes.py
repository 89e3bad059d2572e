from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch import nn

from dlguard.probes import capture_activations, evaluation, intervene, resolve_layers, select_layers
from tests.probes.fingerprint import assert_unchanged, fingerprint


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 6 * 6, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.relu(self.bn(self.conv(x)))))


@pytest.fixture
def net() -> Net:
    """A model in a mixed state: training, one submodule in eval, one frozen weight, a user hook."""
    torch.manual_seed(0)
    model = Net().train()
    model.drop.eval()
    model.conv.bias.requires_grad_(False)
    model.head[1].register_forward_hook(lambda m, i, o: None)
    with torch.no_grad():  # non-trivial BatchNorm statistics
        model.bn.running_mean.uniform_()
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def x() -> torch.Tensor:
    return torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def reference_forward(model: Net, images: torch.Tensor, conv_out_fn=lambda t: t) -> torch.Tensor:
    """The model's forward written out in eval mode, with an optional edit of the conv output."""
    conv = conv_out_fn(nn.functional.conv2d(images, model.conv.weight, model.conv.bias))
    bn = (conv - model.bn.running_mean[:, None, None]) / torch.sqrt(model.bn.running_var[:, None, None] + model.bn.eps)
    bn = bn * model.bn.weight[:, None, None] + model.bn.bias[:, None, None]
    return nn.functional.linear(torch.relu(bn).flatten(1), model.head[1].weight, model.head[1].bias)


# ---- select_layers / resolve_layers -----------------------------------------------------------


def test_select_layers_by_type_name_and_pattern(net: Net) -> None:
    assert list(select_layers(net, types=nn.Conv2d)) == ["conv"]
    assert list(select_layers(net, types=(nn.Conv2d, nn.Linear))) == ["conv", "head.1"]
    assert list(select_layers(net, names="head.*")) == ["head.0", "head.1"]
    assert list(select_layers(net, types=nn.Linear, names="head.*")) == ["head.1"]
    assert list(select_layers(net)) == ["conv", "bn", "drop", "head.0", "head.1"]  # leaves
    assert select_layers(net, names=["bn"])["bn"] is net.bn


def test_select_layers_error_lists_available_layers(net: Net) -> None:
    with pytest.raises(
        ValueError, match=r"no layer of type LSTM.*available layers: conv \(Conv2d\), bn \(BatchNorm2d\)"
    ):
        select_layers(net, types=nn.LSTM)
    with pytest.raises(ValueError, match="named \\['missing'\\]"):
        select_layers(net, names="missing")


def test_resolve_layers_rejects_unknown_and_foreign_layers(net: Net) -> None:
    with pytest.raises(ValueError, match=r"\['nope'\] not found in Net; available layers: conv"):
        resolve_layers(net, ["conv", "nope"])
    with pytest.raises(ValueError, match="'conv' is not a layer of Net"):
        resolve_layers(net, {"conv": nn.Conv2d(1, 4, 3)})
    with pytest.raises(ValueError, match="selection is empty"):
        resolve_layers(net, [])


# ---- capture_activations ----------------------------------------------------------------------


def test_capture_records_every_pass_of_every_layer(net: Net) -> None:
    net.eval()
    images = x()
    with capture_activations(net, ["conv", "head.1"]) as acts:
        out1 = net(images)
        out2 = net(images[:2])
    assert [t.shape[0] for t in acts["conv"]] == [5, 2]
    torch.testing.assert_close(acts["conv"][0], nn.functional.conv2d(images, net.conv.weight, net.conv.bias))
    torch.testing.assert_close(acts["head.1"][0], out1)
    torch.testing.assert_close(acts["head.1"][1], out2)
    assert not acts["conv"][0].requires_grad


def test_capture_records_recurrent_output_per_step() -> None:
    lstm = nn.Sequential(nn.LSTM(3, 4, batch_first=True))
    with capture_activations(lstm, "0") as acts:
        output, _ = lstm(torch.rand(2, 7, 3))
    assert torch.equal(acts["0"][0], output.detach())


@pytest.mark.parametrize("fail", [False, True])
def test_capture_leaves_no_trace(net: Net, fail: bool) -> None:
    net.eval()  # capture is passive: the forward passes (and BatchNorm updates) are the caller's
    before = fingerprint(net)
    with pytest.raises(RuntimeError) if fail else nullcontext():
        with capture_activations(net, select_layers(net, types=(nn.Conv2d, nn.Linear))):
            net(x())
            if fail:
                raise RuntimeError("boom")
    assert_unchanged(net, before)


# ---- intervene --------------------------------------------------------------------------------


def test_intervene_replaces_the_output(net: Net) -> None:
    net.eval()
    images = x()

    def delete_top_left(name: str, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[:, :, :3, :3] = 0
        return out

    def manual(conv: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(conv)
        mask[:, :, :3, :3] = 0
        return conv * mask

    with torch.no_grad(), intervene(net, "conv", delete_top_left):
        mutated = net(images)
    with torch.no_grad():
        torch.testing.assert_close(mutated, reference_forward(net, images, manual))
        torch.testing.assert_close(net(images), reference_forward(net, images))  # hook gone
        assert not torch.allclose(mutated, net(images))


@pytest.mark.parametrize("fail", ["block", "hook", None])
def test_intervene_leaves_no_trace_even_in_train_mode(net: Net, fail: str | None) -> None:
    """A mutated forward in train mode updates BatchNorm statistics; intervene must undo that."""
    before = fingerprint(net)

    def fn(name: str, out: torch.Tensor) -> torch.Tensor:
        if fail == "hook":
            raise RuntimeError("hook failed")
        return out * 0.5

    with pytest.raises(RuntimeError) if fail else nullcontext():
        with intervene(net, select_layers(net, types=nn.Conv2d), fn):
            net(x())
            assert not torch.equal(net.bn.running_mean, before["state"]["bn.running_mean"])
            if fail == "block":
                raise RuntimeError("block failed")
    assert_unchanged(net, before)


# ---- evaluation -------------------------------------------------------------------------------


@pytest.mark.parametrize("fail", [False, True])
def test_evaluation_sets_eval_and_freezes_then_restores(net: Net, fail: bool) -> None:
    before = fingerprint(net)
    images = x().requires_grad_(True)
    with pytest.raises(KeyError) if fail else nullcontext(), evaluation(net) as model:
        assert model is net
        assert not any(m.training for m in net.modules())
        assert not any(p.requires_grad for p in net.parameters())
        net(images).sum().backward()  # gradients still reach the input
        assert images.grad is not None and images.grad.abs().sum() > 0
        assert all(p.grad is None for p in net.parameters())
        if fail:
            raise KeyError("fail")
    assert_unchanged(net, before)


def test_probes_nest_and_unwind(net: Net) -> None:
    before = fingerprint(net)
    with pytest.raises(ValueError, match="inner"), evaluation(net), capture_activations(net, "bn") as acts:
        with intervene(net, "conv", lambda n, o: o * 0):
            net(x())
            raise ValueError("inner")
    assert len(acts["bn"]) == 1
    assert_unchanged(net, before)
