from __future__ import annotations

import pytest
import torch
from torch import nn

from dlguard.metrics import (
    KMultisectionCoverage,
    NeuronBoundaryCoverage,
    NeuronCoverage,
    NeuronRange,
    OutputImpartiality,
    StrongNeuronActivationCoverage,
    TopKNeuronCoverage,
)
from dlguard.metrics.functional import (
    activation_jaccard_distance,
    k_multisection_coverage,
    neuron_boundary_coverage,
    neuron_coverage,
    neuron_values,
    output_impartiality,
    strong_neuron_activation_coverage,
    top_k_neuron_coverage,
)
from dlguard.probes import capture_activations, select_layers


def random_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 8 * 8, 5)
    ).eval()


def deeptest_nc(model: nn.Module, images: torch.Tensor, threshold: float) -> float:
    """DeepTest's loop, one input at a time: scale the layer output, mean per neuron, compare."""
    layers = [m for m in model if isinstance(m, nn.Conv2d | nn.Linear)]
    covered = {id(m): set() for m in layers}
    for image in images:
        outputs = {}
        hooks = [m.register_forward_hook(lambda m, i, o, out=outputs: out.__setitem__(id(m), o[0])) for m in layers]
        with torch.no_grad():
            model(image[None])
        for h in hooks:
            h.remove()
        for layer in layers:
            out = outputs[id(layer)]
            scaled = (out - out.min()) / (out.max() - out.min())
            for neuron in range(out.shape[0]):
                if scaled[neuron].mean().item() > threshold:
                    covered[id(layer)].add(neuron)
    total = sum(m.out_channels if isinstance(m, nn.Conv2d) else m.out_features for m in layers)
    return sum(len(c) for c in covered.values()) / total


def activations_of(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    layers = select_layers(model, types=(nn.Conv2d, nn.Linear))
    with torch.no_grad(), capture_activations(model, layers) as acts:
        model(images)
    return {name: outs[0] for name, outs in acts.items()}


@pytest.mark.parametrize("threshold", [0.0, 0.2, 0.5, 0.75])
def test_nc_matches_deeptest_per_input_loop(threshold: float) -> None:
    model = random_cnn()
    images = torch.rand(12, 1, 12, 12, generator=torch.Generator().manual_seed(1))
    acts = activations_of(model, images)
    expected = deeptest_nc(model, images, threshold)
    assert float(neuron_coverage(acts, threshold)) == pytest.approx(expected)
    metric = NeuronCoverage({k: v.shape[1] for k, v in acts.items()}, threshold)
    metric.update(acts)
    assert float(metric.compute()) == pytest.approx(expected)


def test_every_criterion_by_hand() -> None:
    # one layer, 3 neurons, ranges [0, 1], [0, 2], [-1, 1]; 3 inputs
    acts = {"fc": torch.tensor([[0.05, 1.0, -2.0], [0.95, 2.5, 0.0], [0.5, 0.4, 0.99]])}
    ranges = {"fc": NeuronRange(torch.tensor([0.0, 0.0, -1.0]), torch.tensor([1.0, 2.0, 1.0]))}
    # KMNC(k=4): neuron 0 sections 0, 3, 2; neuron 1: 1.0 -> 2, 0.4 -> 0 (2.5 outside);
    # neuron 2: 0.0 -> 2, 0.99 -> 3 (-2 outside) -> 7 of 12
    assert float(k_multisection_coverage(acts, ranges, k=4)) == pytest.approx(7 / 12)
    # NBC: above high: neuron 1 (2.5); below low: neuron 2 (-2.0) -> 2 of 6; SNAC: 1 of 3
    assert float(neuron_boundary_coverage(acts, ranges)) == pytest.approx(2 / 6)
    assert float(strong_neuron_activation_coverage(acts, ranges)) == pytest.approx(1 / 3)
    # TKNC(k=1): top neurons per input are 1, 1, 2 -> 2 of 3
    assert float(top_k_neuron_coverage(acts, k=1)) == pytest.approx(2 / 3)
    # NC, each input scaled by its own min/max: input 0 -> (0.68, 1, 0), input 1 -> (0.38, 1, 0),
    # input 2 -> (0.17, 0, 1): at 0.5 every neuron is covered, at 0.99 only neurons 1 and 2
    assert float(neuron_coverage(acts, 0.5)) == pytest.approx(1.0)
    scaled = (acts["fc"] - acts["fc"].amin(1, keepdim=True)) / (
        acts["fc"].amax(1, keepdim=True) - acts["fc"].amin(1, keepdim=True)
    )
    assert float(neuron_coverage(acts, 0.5)) == pytest.approx(float((scaled > 0.5).any(0).float().mean()))
    assert float(neuron_coverage(acts, 0.99)) == pytest.approx(2 / 3)  # neurons 1 and 2 reach 1.0


def test_conv_neuron_is_the_channel_mean_and_constant_output_is_zero() -> None:
    conv = torch.zeros(1, 2, 2, 2)
    conv[0, 0] = torch.tensor([[0.0, 4.0], [0.0, 0.0]])  # channel means 1, 0 before scaling
    assert float(neuron_coverage({"c": conv}, threshold=0.2)) == pytest.approx(0.5)  # 1/4 > 0.2
    assert float(neuron_coverage({"c": conv}, threshold=0.25)) == 0.0
    assert float(neuron_coverage({"c": torch.ones(3, 2, 2, 2)}, threshold=0.0)) == 0.0  # max == min: all zeros


def build_metrics(sizes: dict[str, int], ranges: dict[str, NeuronRange]) -> list:
    return [
        NeuronCoverage(sizes, 0.3, per_layer=True),
        KMultisectionCoverage(ranges, k=5, per_layer=True),
        NeuronBoundaryCoverage(ranges, per_layer=True),
        StrongNeuronActivationCoverage(ranges, per_layer=True),
        TopKNeuronCoverage(sizes, k=2, per_layer=True),
    ]


def test_order_and_batching_do_not_matter_and_values_stay_in_range() -> None:
    model = random_cnn()
    images = torch.rand(30, 1, 12, 12, generator=torch.Generator().manual_seed(2))
    acts = activations_of(model, images)
    sizes = {k: v.shape[1] for k, v in acts.items()}
    ranges = {k: NeuronRange(v.flatten(2).mean(2).amin(0) * 0.8 if v.ndim > 2 else v.amin(0) * 0.8,
                             v.flatten(2).mean(2).amax(0) * 0.7 if v.ndim > 2 else v.amax(0) * 0.7)
              for k, v in acts.items()}  # fmt: skip
    ranges = {k: NeuronRange(torch.minimum(r.low, r.high), torch.maximum(r.low, r.high)) for k, r in ranges.items()}
    whole = build_metrics(sizes, ranges)
    shuffled = build_metrics(sizes, ranges)
    order = torch.randperm(30, generator=torch.Generator().manual_seed(3))
    for metric in whole:
        metric.update(acts)
    for chunk in order.split(7):
        for metric in shuffled:
            metric.update({k: v[chunk] for k, v in acts.items()})
    for a, b in zip(whole, shuffled, strict=True):
        result_a, result_b = a.compute(), b.compute()
        assert result_a.keys() == {"all", *sizes}
        for key in result_a:
            assert float(result_a[key]) == float(result_b[key])
            assert 0.0 <= float(result_a[key]) <= 1.0


def test_one_dimensional_signal_model() -> None:
    torch.manual_seed(0)

    class SignalNet(nn.Module):  # e.g. EEG: (B, channels, time)
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(3, 8, 5)
            self.gru = nn.GRU(8, 6, batch_first=True)
            self.head = nn.Linear(6, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            features = torch.relu(self.conv(x)).transpose(1, 2)
            return self.head(self.gru(features)[0][:, -1])

    from dlguard.probes import neuron_layers, neuron_output, profile_neuron_ranges

    net = SignalNet().eval()
    signals = torch.randn(16, 3, 20)
    layers = neuron_layers(net)
    assert list(layers) == ["conv", "gru", "head"]
    with torch.no_grad(), capture_activations(net, layers) as acts:
        net(signals)
    read = {name: neuron_output(layers[name], outs[0]) for name, outs in acts.items()}
    assert read["conv"].shape == (16, 8, 16) and read["gru"].shape == (16, 16 * 6)  # a neuron per step and unit
    sizes = {"conv": 8, "gru": 96, "head": 2}
    metric = NeuronCoverage(sizes, threshold=0.5, per_layer=True)
    metric.update(read)
    result = metric.compute()
    assert 0 < float(result["all"]) <= 1
    ranges = profile_neuron_ranges(net, [signals[:8], signals[8:]])
    assert ranges["gru"].low.shape == (96,)
    kmnc = KMultisectionCoverage(ranges, k=4)
    kmnc.update(read)
    assert 0 < float(kmnc.compute()) <= 1


def test_profile_matches_min_max_of_neuron_values() -> None:
    from dlguard.probes import profile_neuron_ranges
    from tests.probes.fingerprint import assert_unchanged, fingerprint

    model = random_cnn().train()
    before = fingerprint(model)
    images = torch.rand(20, 1, 12, 12)
    ranges = profile_neuron_ranges(model, [(images[:7], None), (images[7:], None)], ["0", "5"])
    assert_unchanged(model, before)
    model.eval()
    acts = activations_of(model, images)
    torch.testing.assert_close(ranges["0"].low, acts["0"].mean(dim=(2, 3)).amin(0))
    torch.testing.assert_close(ranges["5"].high, acts["5"].amax(0))
    with pytest.raises(ValueError, match="yielded no batch"):
        profile_neuron_ranges(model, [])


def test_impartiality_and_jaccard() -> None:
    assert float(output_impartiality(torch.tensor([0, 1, 2, 3] * 5), 4)) == pytest.approx(1.0)
    assert float(output_impartiality(torch.tensor([2] * 9), 4)) == 0.0
    p = torch.tensor([0.5, 0.25, 0.25, 0.0])
    expected = float(-(p[:3] * p[:3].log()).sum() / torch.log(torch.tensor(4.0)))
    metric = OutputImpartiality(num_classes=4)
    metric.update(torch.tensor([0, 0, 1]))
    metric.update(torch.nn.functional.one_hot(torch.tensor([2, 0]), 4).float() * 5)  # logits
    metric.update(torch.tensor([0, 1, 2]))
    assert float(metric.compute()) == pytest.approx(expected)
    a = {"x": torch.tensor([True, False]), "y": torch.tensor([True, True])}
    b = {"x": torch.tensor([True, True]), "y": torch.tensor([False, True])}
    assert float(activation_jaccard_distance(a, b)) == pytest.approx(1 - 2 / 4)
    assert float(activation_jaccard_distance(torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool))) == 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: NeuronCoverage({"a": 2}, threshold=1.5), "threshold: expected a value in \\[0, 1\\]"),
        (lambda: KMultisectionCoverage({"a": NeuronRange(torch.zeros(2), torch.ones(2))}, k=0), "k: expected"),
        (lambda: TopKNeuronCoverage({"a": 2}, k=0), "k: expected"),
        (lambda: KMultisectionCoverage(k=3), "ranges: KMultisectionCoverage needs per-neuron ranges; profile"),
        (lambda: NeuronBoundaryCoverage(), "profile_neuron_ranges"),
        (lambda: StrongNeuronActivationCoverage({"a": NeuronRange(torch.ones(2), torch.zeros(2))}), "low > high"),
    ],
)
def test_bad_construction(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_updates() -> None:
    metric = NeuronCoverage({"a": 3, "b": 2})
    with pytest.raises(ValueError, match="layer 'a' has 4 neurons, expected 3"):
        metric.update({"a": torch.rand(2, 4), "b": torch.rand(2, 2)})
    with pytest.raises(ValueError, match="missing \\['b'\\]"):
        metric.update({"a": torch.rand(2, 3)})


def nan_activations() -> dict[str, torch.Tensor]:
    """A conv and a linear layer; one conv position of input 1 is NaN (a planted defect)."""
    gen = torch.Generator().manual_seed(4)
    conv, fc = torch.rand(3, 2, 4, 4, generator=gen), torch.rand(3, 5, generator=gen)
    conv[1, 0, 2, 3] = float("nan")
    return {"conv": conv, "fc": fc}


def unit_ranges() -> dict[str, NeuronRange]:
    return {"conv": NeuronRange(torch.zeros(2), torch.ones(2)), "fc": NeuronRange(torch.zeros(5), torch.ones(5))}


@pytest.mark.parametrize(
    "measure",
    [
        lambda acts: neuron_coverage(acts, 0.2),
        lambda acts: k_multisection_coverage(acts, unit_ranges(), k=3),
        lambda acts: neuron_boundary_coverage(acts, unit_ranges()),
        lambda acts: strong_neuron_activation_coverage(acts, unit_ranges()),
        lambda acts: top_k_neuron_coverage(acts, k=1),  # NaN used to win every top-k
    ],
)
def test_functional_criteria_refuse_nan(measure) -> None:
    with pytest.raises(ValueError, match="activations: contains NaN"):
        measure(nan_activations())
    assert 0.0 <= float(measure({k: v.nan_to_num() for k, v in nan_activations().items()})) <= 1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: NeuronCoverage({"conv": 2, "fc": 5}),  # scales each input: NaN must survive the scaling
        lambda: NeuronCoverage({"conv": 2, "fc": 5}, scale=False),
        lambda: KMultisectionCoverage(unit_ranges(), k=3),
        lambda: NeuronBoundaryCoverage(unit_ranges()),
        lambda: StrongNeuronActivationCoverage(unit_ranges()),
        lambda: TopKNeuronCoverage({"conv": 2, "fc": 5}, k=1),
    ],
)
def test_metrics_refuse_nan_with_one_check_per_update(make, monkeypatch: pytest.MonkeyPatch) -> None:
    import dlguard.metrics.coverage as module

    metric = make()
    with pytest.raises(ValueError, match="activations: contains NaN"):
        metric.update(nan_activations())
    assert all(int(getattr(metric, state).sum()) == 0 for state in metric._states)  # nothing was counted
    checked = []
    original = module._check_finite_values
    monkeypatch.setattr(module, "_check_finite_values", lambda v: checked.append(v.shape) or original(v))
    metric.update({k: v.nan_to_num() for k, v in nan_activations().items()})
    assert checked == [(3, 7)]  # once, on both layers side by side


def test_half_precision_channel_means_accumulate_in_float32() -> None:
    # the mean of 1 and 1 + 2^-7 (both exact in bfloat16) is 1 + 2^-8, which bfloat16 cannot hold
    conv = torch.tensor([1.0, 1.0078125]).reshape(1, 1, 1, 2)
    for dtype in (torch.bfloat16, torch.float16):
        values = neuron_values(conv.to(dtype))
        assert values.dtype == torch.float32 and values.item() == 1.00390625
        assert neuron_values(torch.ones(2, 3, dtype=dtype)).dtype == torch.float32
    assert neuron_values(conv.double()).dtype == torch.float64
    metric = TopKNeuronCoverage({"conv": 2}, k=1)
    metric.update({"conv": torch.rand(4, 2, 3, 3).to(torch.bfloat16)})
    assert float(metric.compute()) > 0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: neuron_coverage({}), "activations: expected a non-empty"),
        (lambda: neuron_coverage({"a": torch.rand(2, 3), "b": torch.rand(3, 3)}), "batch sizes"),
        (lambda: neuron_values([1.0, 2.0]), "activations: expected a tensor"),
        (lambda: k_multisection_coverage({"a": torch.rand(2, 3)}, {}, k=2), r"ranges: .* missing \['a'\]"),
        (lambda: neuron_boundary_coverage({"a": torch.rand(2, 3)}, unit_ranges() | {"a": (1, 2)}), "needs low and"),
        (lambda: strong_neuron_activation_coverage({"fc": torch.rand(2, 3)}, unit_ranges()), "'fc' has 5 neurons"),
        (lambda: top_k_neuron_coverage({"a": torch.rand(2, 3)}, k=1.5), "k: expected an integer"),
        (lambda: neuron_coverage({"a": torch.rand(2, 3)}, threshold=float("nan")), "threshold: expected a value"),
        (lambda: output_impartiality(torch.tensor([0.0, 1.5]), 4), "preds: expected integer class labels"),
        (lambda: output_impartiality(torch.tensor([0, 4]), 4), r"preds: expected labels in \[0, 4\)"),
        (lambda: output_impartiality(torch.rand(2, 3), 4), r"preds: expected logits \(B, 4\)"),
        (lambda: OutputImpartiality(num_classes=1), "num_classes: expected an integer of at least 2"),
        (lambda: NeuronCoverage({"a": 0}), r"layer_sizes\['a'\]: expected an integer of at least 1"),
        (lambda: NeuronCoverage({"a": 2}).update([torch.rand(2, 2)]), "activations: expected {layer: output}"),
        (lambda: NeuronCoverage({"a": 2, "b": 1}).update({"a": torch.rand(2, 2), "b": torch.rand(3, 1)}), "batch"),
        (lambda: KMultisectionCoverage({"a": 3}), "ranges: layer 'a' needs a NeuronRange"),
        (lambda: KMultisectionCoverage({"a": torch.zeros(2)}), "ranges: layer 'a' needs low and high"),
    ],
)
def test_bad_input_names_the_argument(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("make", [
    lambda sizes, ranges: NeuronCoverage(sizes, threshold=0.3, per_layer=True),
    lambda sizes, ranges: KMultisectionCoverage(ranges, 4, per_layer=True),
    lambda sizes, ranges: TopKNeuronCoverage(sizes, 1, per_layer=True),
])  # fmt: skip
def test_per_layer_ratios_survive_set_dtype(make) -> None:
    """``set_dtype(torch.float64)`` casts every buffer; the layer bookkeeping must stay integer indices."""
    generator = torch.Generator().manual_seed(0)
    acts = {"conv": torch.rand(6, 3, 4, 4, generator=generator), "fc": torch.rand(6, 5, generator=generator)}
    sizes = {"conv": 3, "fc": 5}
    ranges = {name: NeuronRange(torch.full((n,), 0.2), torch.full((n,), 0.8)) for name, n in sizes.items()}
    plain, doubled = make(sizes, ranges), make(sizes, ranges).set_dtype(torch.float64)
    plain.update(acts)
    doubled.update({name: value.double() for name, value in acts.items()})
    expected, got = plain.compute(), doubled.compute()
    assert got.keys() == {"all", "conv", "fc"}
    for key, value in expected.items():
        assert float(got[key]) == pytest.approx(float(value), abs=1e-12), key
