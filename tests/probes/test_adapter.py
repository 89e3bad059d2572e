from __future__ import annotations

import pytest
import torch
from torch import nn

from dlguard.probes.adapter import ModelAdapter


class Recorder(nn.Module):
    """A linear model with fixed weights that records the dtype, device and values it was called with."""

    def __init__(self, dtype: torch.dtype = torch.float32, out: int = 3) -> None:
        super().__init__()
        self.linear = nn.Linear(4, out).to(dtype)
        with torch.no_grad():
            self.linear.weight.copy_(torch.arange(4 * out, dtype=dtype).reshape(out, 4) / 10)
            self.linear.bias.copy_(torch.arange(out, dtype=dtype))
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        return self.linear(x)


class BufferNormalize(nn.Module):
    """A Normalize holding its statistics as float32 buffers (like kornia's)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.full((4,), 0.5))
        self.register_buffer("std", torch.full((4,), 0.25))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def hand_linear(x: torch.Tensor, out: int = 3) -> torch.Tensor:
    """Recorder's forward written out elementwise in float64."""
    weight = torch.arange(4 * out, dtype=torch.float64).reshape(out, 4) / 10
    bias = torch.arange(out, dtype=torch.float64)
    rows = []
    for sample in x.double():
        rows.append(torch.stack([sum(weight[k, j] * sample[j] for j in range(4)) + bias[k] for k in range(out)]))
    return torch.stack(rows)


def test_float64_model_gets_float64_inputs_from_float32_data() -> None:
    model = Recorder(torch.float64)
    adapter = ModelAdapter(model)
    x = torch.rand(5, 4, generator=torch.Generator().manual_seed(0))
    assert x.dtype == torch.float32
    logits = adapter.logits(x)
    assert adapter.dtype == torch.float64
    assert model.seen[0].dtype == torch.float64
    assert torch.equal(model.seen[0], x.double())
    assert logits.dtype == torch.float64
    torch.testing.assert_close(logits, hand_linear(x), rtol=0, atol=1e-12)


def test_integer_inputs_keep_their_dtype() -> None:
    model = nn.Sequential(nn.Embedding(10, 3), nn.Flatten())
    out = ModelAdapter(model).logits(torch.tensor([[1], [7]]))
    assert torch.equal(out, model[0].weight[[1, 7]])


def test_preprocess_before_model_and_output_transform_after() -> None:
    model = Recorder()
    x = torch.rand(6, 4, generator=torch.Generator().manual_seed(1))
    adapter = ModelAdapter(
        model,
        preprocess=lambda t: 2 * t - 1,
        output_transform=lambda out: {"scores": out}["scores"][:, [2, 0]] * 3,
    )
    logits = adapter.logits(x)
    assert torch.allclose(model.seen[0], 2 * x - 1)
    expected = hand_linear(2 * x - 1)[:, [2, 0]] * 3
    torch.testing.assert_close(logits.double(), expected, rtol=1e-5, atol=1e-5)
    # the other order (transform the inputs after the model) gives different numbers
    assert not torch.allclose(logits.double(), (2 * hand_linear(x) - 1)[:, [2, 0]] * 3, atol=1e-3)


def test_dict_output_without_transform_names_output_transform() -> None:
    class DictModel(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"logits": x}

    with pytest.raises(ValueError, match="output_transform"):
        ModelAdapter(DictModel()).logits(torch.rand(3, 4))
    out = ModelAdapter(DictModel(), output_transform=lambda d: d["logits"]).logits(torch.rand(3, 4))
    assert out.shape == (3, 4)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_outputs_come_back_as_float32(half: torch.dtype) -> None:
    class HalfOut(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 1000 + 0.1).to(half)

    x = torch.rand(4, 3, generator=torch.Generator().manual_seed(2))
    logits = ModelAdapter(HalfOut()).logits(x)
    assert logits.dtype == torch.float32
    assert torch.equal(logits, (x * 1000 + 0.1).to(half).float())


def test_half_model_gets_half_inputs() -> None:
    model = Recorder(torch.float16)
    logits = ModelAdapter(model).logits(torch.rand(3, 4))
    assert model.seen[0].dtype == torch.float16
    assert logits.dtype == torch.float32


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_model_with_buffered_preprocess(half: torch.dtype) -> None:
    model = Recorder(half)
    x = torch.rand(5, 4, generator=torch.Generator().manual_seed(3))
    logits = ModelAdapter(model, preprocess=BufferNormalize()).logits(x)
    assert model.seen[0].dtype == half
    assert logits.dtype == torch.float32


def test_float64_model_with_buffered_preprocess() -> None:
    model = Recorder(torch.float64)
    x = torch.rand(5, 4, generator=torch.Generator().manual_seed(3))
    logits = ModelAdapter(model, preprocess=BufferNormalize()).logits(x)
    assert model.seen[0].dtype == torch.float64
    torch.testing.assert_close(logits, hand_linear((x.double() - 0.5) / 0.25), rtol=0, atol=1e-12)


def test_inputs_and_preprocess_follow_the_model_device() -> None:
    model = nn.Linear(4, 3, device="meta")
    preprocess = BufferNormalize()
    adapter = ModelAdapter(model, preprocess=preprocess)
    assert adapter.device == torch.device("meta")
    out = adapter.logits(torch.rand(5, 4))
    assert out.device.type == "meta" and out.shape == (5, 3)
    assert preprocess.mean.device.type == "meta"


@pytest.mark.parametrize(
    "output",
    [
        lambda x: x.sum(1),  # (B,)
        lambda x: x.unsqueeze(-1),  # (B, K, 1)
        lambda x: x[:-1],  # (B - 1, K)
        lambda x: (x, x),  # a tuple
    ],
)
def test_shape_errors_name_output_transform(output) -> None:
    adapter = ModelAdapter(Recorder(), output_transform=output)
    with pytest.raises(ValueError, match="output_transform"):
        adapter.logits(torch.rand(4, 4))


def test_num_classes_mismatch_names_num_classes() -> None:
    adapter = ModelAdapter(Recorder(out=3))
    assert adapter.logits(torch.rand(2, 4), num_classes=3).shape == (2, 3)
    with pytest.raises(ValueError, match=r"num_classes: is 5 .* 3 classes"):
        adapter.logits(torch.rand(2, 4), num_classes=5)


def test_max_batch_splits_passes_and_matches_one_pass() -> None:
    model = Recorder()
    adapter = ModelAdapter(model)
    x = torch.rand(11, 4, generator=torch.Generator().manual_seed(4))
    whole = adapter.logits(x)
    model.seen.clear()
    parts = adapter.logits(x, max_batch=4)
    assert [len(s) for s in model.seen] == [4, 4, 3]
    torch.testing.assert_close(parts, whole)
    model.seen.clear()
    adapter.logits(x, max_batch=11)
    assert [len(s) for s in model.seen] == [11]


def test_adapter_leaves_the_model_mode_alone() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5))
    ModelAdapter(model).logits(torch.rand(2, 4))
    assert model.training
    model.eval()
    ModelAdapter(model).logits(torch.rand(2, 4))
    assert not model.training


def test_model_without_parameters_runs_in_float32() -> None:
    adapter = ModelAdapter(nn.Flatten())
    assert adapter.dtype == torch.float32
    assert adapter.logits(torch.rand(2, 3, dtype=torch.float64)).dtype == torch.float32


def test_argument_validation_names_the_argument() -> None:
    with pytest.raises(ValueError, match="model"):
        ModelAdapter(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="preprocess"):
        ModelAdapter(nn.Identity(), preprocess=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="output_transform"):
        ModelAdapter(nn.Identity(), output_transform="logits")  # type: ignore[arg-type]


def test_max_batch_zero_names_max_batch() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        ModelAdapter(Recorder()).logits(torch.rand(4, 4), max_batch=0)
