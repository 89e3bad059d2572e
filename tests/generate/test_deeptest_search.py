from __future__ import annotations

from collections import deque
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dlguard.augment.properties import Property, deeptest_properties
from dlguard.generate.deeptest_search import SearchResult, coverage_guided_search, first_increments
from dlguard.metrics.functional.coverage import neuron_coverage
from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.capture import capture_activations
from tests.probes.fingerprint import assert_unchanged, fingerprint

THRESHOLD = 0.6  # this net's seeds cover about half its neurons at 0.6: room for the search


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 12, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(12 * 3 * 3, 48),
        nn.ReLU(),
        nn.Linear(48, 4),
    )


def smooth_seeds(count: int, seed: int = 1) -> Tensor:
    """Smooth random 12x12 images in [0, 1] (upsampled 4x4 noise): structure the transformations can move."""
    coarse = torch.rand(count, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(12, 12), mode="bilinear", align_corners=False)


def identity(images: Tensor, level: Tensor) -> Tensor:
    return images.clone()


# ---- an independent, plain per-image Algorithm 1 -------------------------------------------------


def covered_by(net: nn.Module, image: Tensor, threshold: float) -> tuple[set[tuple[int, int]], Tensor]:
    """The (layer, neuron) pairs one image covers, scaling each layer output before averaging; and its output."""
    layers = [m for m in net.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    outs: dict[int, Tensor] = {}
    handles = [
        m.register_forward_hook(lambda _m, _i, o, i=i: outs.__setitem__(i, o.detach())) for i, m in enumerate(layers)
    ]
    try:
        output = net(image)
    finally:
        for handle in handles:
            handle.remove()
    covered = set()
    for index, out in outs.items():
        low, high = out.min(), out.max()
        scaled = (out - low) / (high - low) if high > low else torch.zeros_like(out)
        per_neuron = scaled.flatten(2).mean(2)[0] if out.ndim == 4 else scaled[0]
        covered |= {(index, j) for j, value in enumerate(per_neuron.tolist()) if value > threshold}
    return covered, output


def reference_search(
    net: nn.Module,
    seeds: Tensor,
    props: list[Property],
    threshold: float,
    max_failed_tries: int,
    seed: int,
    max_images: int | None = None,
) -> dict[str, Any]:
    """Algorithm 1 one image at a time, with the draws coverage_guided_search documents."""
    net.eval()
    total = sum(m.out_channels if isinstance(m, nn.Conv2d) else m.out_features for m in net.modules()
                if isinstance(m, nn.Conv2d | nn.Linear))  # fmt: skip
    covered: set[tuple[int, int]] = set()
    with torch.no_grad():
        for image in seeds:
            covered |= covered_by(net, image[None], threshold)[0]
    start = len(covered) / total
    generator = torch.Generator().manual_seed(seed)
    stack = [(seeds[i], i) for i in reversed(range(len(seeds)))]
    kept: dict[str, list[Any]] = {"images": [], "source": [], "names": [], "parameters": [], "history": [], "out": []}
    tries = dequeued = 0

    def full() -> bool:
        return max_images is not None and len(kept["images"]) >= max_images

    def pick(count: int, u: float) -> int:
        return min(int(u * count), count - 1)

    def apply(prop: Property, image: Tensor, level: float, key: Tensor) -> Tensor:
        level_tensor = torch.tensor([level], dtype=torch.float64)
        return prop(image, level_tensor, key[None]) if prop.keyed else prop(image, level_tensor)

    with torch.no_grad():
        while stack and not full():
            image, source = stack.pop()
            queue: deque[int] = deque()
            failed = 0
            while failed < max_failed_tries and not full():
                u = torch.rand(1, 4, generator=generator, dtype=torch.float64)[0].tolist()
                keys = torch.randint(2**62, (1, 2), generator=generator)[0]
                dequeued += bool(queue)
                t1 = queue.popleft() if queue else pick(len(props), u[0])
                p1 = props[t1].levels[pick(len(props[t1].levels), u[1])]
                t2 = pick(len(props), u[2])
                p2 = props[t2].levels[pick(len(props[t2].levels), u[3])]
                new = apply(props[t2], apply(props[t1], image[None], p1, keys[0]), p2, keys[1])
                tries += 1
                cover, out = covered_by(net, new, threshold)
                if cover - covered:
                    queue.extend([t1, t2])
                    covered |= cover
                    for name, value in zip(
                        kept,
                        (new[0], source, f"{props[t1].name}+{props[t2].name}", (p1, p2), len(covered) / total, out[0]),
                        strict=True,
                    ):
                        kept[name].append(value)
                    stack.append((new[0], source))
                else:
                    failed += 1
    return {**kept, "start": start, "end": len(covered) / total, "tries": tries, "dequeued": dequeued}


def assert_matches_reference(result: SearchResult, ref: dict[str, Any]) -> None:
    assert len(ref["images"]) >= 5, "the example should keep several images"
    assert result.transformations == ref["names"]
    assert result.source.tolist() == ref["source"]
    assert result.tries == ref["tries"]
    torch.testing.assert_close(result.images, torch.stack(ref["images"]), rtol=0, atol=0)
    torch.testing.assert_close(result.parameters, torch.tensor(ref["parameters"], dtype=torch.float32))
    torch.testing.assert_close(result.outputs, torch.stack(ref["out"]), rtol=1e-5, atol=1e-5)
    assert [round(h, 9) for h in result.history] == [round(h, 9) for h in ref["history"]]
    assert round(result.coverage_seeds, 9) == round(ref["start"], 9)
    assert round(result.coverage, 9) == round(ref["end"], 9)


def test_one_lane_is_algorithm_1_image_by_image() -> None:
    net, seeds, props = small_net(), smooth_seeds(8), deeptest_properties()
    result = coverage_guided_search(net, seeds, props, threshold=THRESHOLD, max_failed_tries=5, lanes=1, seed=3)
    ref = reference_search(net, seeds, props, THRESHOLD, 5, seed=3)
    assert_matches_reference(result, ref)
    assert ref["dequeued"] > 0, "some T1 should come from the queue"


def test_one_lane_with_max_images_stops_where_algorithm_1_does() -> None:
    net, seeds, props = small_net(), smooth_seeds(8), deeptest_properties()
    result = coverage_guided_search(net, seeds, props, threshold=THRESHOLD, max_failed_tries=5, lanes=1, max_images=5)
    assert_matches_reference(result, reference_search(net, seeds, props, THRESHOLD, 5, seed=0, max_images=5))


def recomputed_coverage(net: nn.Module, images: Tensor, threshold: float) -> float:
    with torch.no_grad(), capture_activations(net, ["0", "3", "6", "8"]) as acts:
        net(images)
    return float(neuron_coverage({name: outs[0] for name, outs in acts.items()}, threshold))


@pytest.mark.parametrize("lanes", [3, 16])
def test_every_kept_image_raised_coverage_of_seeds_and_earlier_images(lanes: int) -> None:
    net, seeds = small_net(), smooth_seeds(8)
    result = coverage_guided_search(net, seeds, deeptest_properties(), threshold=THRESHOLD, lanes=lanes)
    net.eval()
    assert len(result.images) >= 3
    assert round(recomputed_coverage(net, seeds, THRESHOLD), 9) == round(result.coverage_seeds, 9)
    previous = result.coverage_seeds
    for k, value in enumerate(result.history, 1):
        assert value > previous
        assert round(recomputed_coverage(net, torch.cat([seeds, result.images[:k]]), THRESHOLD), 9) == round(value, 9)
        previous = value
    assert result.history[-1] == result.coverage
    with torch.no_grad():
        torch.testing.assert_close(result.outputs, net(result.images), rtol=1e-5, atol=1e-5)
    # without a cap every explored image (seed or kept) ends after exactly max_failed_tries failures
    assert result.tries == (len(seeds) + len(result.images)) * 3 + len(result.images)
    assert result.parameters.shape == (len(result.images), 2) and len(result.transformations) == len(result.images)


def test_judging_in_lane_order_equals_one_candidate_after_another() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        masks = torch.rand(16, 40, generator=generator) < 0.15
        before = torch.rand(40, generator=generator) < 0.5
        added = first_increments(masks, before)
        covered, kept = before.clone(), []
        for row in masks:  # the plain sequential judgement
            raises = bool((row & ~covered).any())
            kept.append(raises)
            if raises:
                covered |= row
        assert added.any(dim=1).tolist() == kept
        assert torch.equal(before | added.any(dim=0), covered)
        assert not (added & before).any() and int(added.sum(dim=0).max()) <= 1


def test_identity_transformation_never_keeps_an_image() -> None:
    net, seeds = small_net(), smooth_seeds(5)
    with pytest.warns(UserWarning, match=r"kept no image in 15 tries: the seeds cover .* of the neurons at threshold"):
        result = coverage_guided_search(net, seeds, [Property("identity", identity, (1.0,))], threshold=THRESHOLD,
                                        lanes=2)  # fmt: skip
    assert len(result.images) == 0 and result.history == [] and result.outputs.shape == (0, 4)
    assert result.coverage == result.coverage_seeds and result.tries == 5 * 3
    assert result.images.shape == (0, 1, 12, 12) and result.parameters.shape == (0, 2)


def test_deterministic_and_capped_run_is_a_prefix() -> None:
    net, seeds, props = small_net(), smooth_seeds(8), deeptest_properties()
    first = coverage_guided_search(net, seeds, props, threshold=THRESHOLD, lanes=4, seed=7)
    again = coverage_guided_search(net, seeds, props, threshold=THRESHOLD, lanes=4, seed=7)
    capped = coverage_guided_search(net, seeds, props, threshold=THRESHOLD, lanes=4, seed=7, max_images=2)
    assert torch.equal(first.images, again.images) and first.transformations == again.transformations
    assert first.history == again.history and first.tries == again.tries
    assert len(first.images) > 2 and len(capped.images) == 2
    assert torch.equal(capped.images, first.images[:2]) and capped.history == first.history[:2]
    assert capped.coverage == capped.history[-1] and capped.tries <= first.tries


def test_model_left_exactly_as_found_and_run_in_eval_mode() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(),
                        nn.Linear(6 * 10 * 10, 16))  # fmt: skip
    net.train()
    before = fingerprint(net)
    result = coverage_guided_search(net, smooth_seeds(4), deeptest_properties()[:6], threshold=0.5, lanes=2)
    assert_unchanged(net, before)
    assert len(result.images)
    net.eval()
    with torch.no_grad():  # dropout off and running statistics used: eval mode during the search
        torch.testing.assert_close(result.outputs, net(result.images), rtol=1e-5, atol=1e-5)
    net.train()

    def broken(images: Tensor, level: Tensor) -> Tensor:
        raise RuntimeError("transformation failed")

    with pytest.raises(RuntimeError, match="transformation failed"):
        coverage_guided_search(net, smooth_seeds(2), [Property("broken", broken, (1.0,))])
    assert_unchanged(net, before)


def test_preprocess_and_output_transform() -> None:
    class DictNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = small_net()

        def forward(self, x: Tensor) -> dict[str, Tensor]:
            return {"logits": self.net(x)}

    model, seeds, props = DictNet(), smooth_seeds(4), deeptest_properties()[:6]
    invert, read = (lambda x: 1 - x), (lambda out: out["logits"])
    direct = coverage_guided_search(model, seeds, props, threshold=0.5, preprocess=invert, output_transform=read)
    adapted = coverage_guided_search(ModelAdapter(model, invert, read), seeds, props, threshold=0.5)
    assert torch.equal(direct.images, adapted.images) and direct.history == adapted.history
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(direct.outputs, model.net(1 - direct.images), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="output_transform"):
        coverage_guided_search(model, seeds, props)


class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net, self.calls = small_net(), 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.net(x)


NAN = smooth_seeds(2)
NAN[0, 0, 0, 0] = float("nan")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"properties": []}, "properties: expected a non-empty"),
        ({"properties": [identity]}, "properties: expected dlguard.augment.Property items"),
        ({"properties": deeptest_properties()[:1] * 2}, "distinct property names"),
        ({"max_failed_tries": 0}, "max_failed_tries"),
        ({"lanes": 0}, "lanes"),
        ({"max_images": 0}, "max_images"),
        ({"threshold": 1.5}, "threshold"),
        ({"seed": -1}, "seed"),
        ({"seeds": smooth_seeds(2)[:, 0]}, r"seeds: expected images \(B, C, H, W\)"),
        ({"seeds": smooth_seeds(2) * 2}, r"seeds: expected values in \[0, 1\]"),
        ({"seeds": NAN}, "seeds: contains NaN"),
        ({"seeds": smooth_seeds(0)}, "seeds: expected at least one"),
        ({"layers": ["nope"]}, "layers"),
    ],
)
def test_bad_input_is_refused_before_any_work(change: dict[str, Any], match: str) -> None:
    model = Counting()
    arguments: dict[str, Any] = {"seeds": smooth_seeds(2), "properties": deeptest_properties()[:2]} | change
    with pytest.raises(ValueError, match=match):
        coverage_guided_search(model, **arguments)
    assert model.calls == 0


def test_adapter_with_preprocess_beside_it_is_refused() -> None:
    model = Counting()
    with pytest.raises(ValueError, match="preprocess, output_transform"):
        coverage_guided_search(ModelAdapter(model), smooth_seeds(2), deeptest_properties()[:2], preprocess=identity)
    assert model.calls == 0


@pytest.mark.gpu
def test_on_the_models_device() -> None:
    net = small_net().cuda()
    result = coverage_guided_search(net, smooth_seeds(8), deeptest_properties(), threshold=THRESHOLD, lanes=16)
    assert result.images.device.type == "cpu" and result.outputs.device.type == "cpu"
    assert all(b > a for a, b in zip([result.coverage_seeds, *result.history], result.history, strict=False))
    assert next(net.parameters()).device.type == "cuda"
    assert round(recomputed_coverage(net.cpu().eval(), smooth_seeds(8), THRESHOLD), 9) == round(
        result.coverage_seeds, 9
    )


def test_search_violations_judge_each_image_against_its_seed_and_feed_the_bank() -> None:
    from dlguard.data import FailureBank
    from dlguard.generate.deeptest_search import search_violations
    from dlguard.metrics.functional import MetamorphicRelation

    images = torch.arange(4, dtype=torch.float32).reshape(4, 1, 1, 1).expand(4, 1, 2, 2).contiguous() / 4
    source = torch.tensor([0, 0, 1, 2])

    def result(outputs: torch.Tensor) -> SearchResult:
        return SearchResult(images, source, ["rotation+fog"] * 4, torch.zeros(4, 2), 0.5, 0.6, [0.6] * 4, outputs, 9)

    # steering: seeds predict 0.1, 0.3, -0.2 for true angles 0.0, 0.5, -0.2 -> MSE_orig = (0.01 + 0.04 + 0) / 3
    seed_outputs, angles = torch.tensor([0.1, 0.3, -0.2]), torch.tensor([0.0, 0.5, -0.2])
    outputs = torch.tensor(
        [0.05, 0.4, 0.45, 0.2]
    )  # squared errors against the seed's angle: 0.0025, 0.16, 0.0025, 0.16
    bank = FailureBank()
    flags = search_violations(result(outputs), MetamorphicRelation("regression", lam=3.0), seed_outputs, angles,
                              bank=bank)  # fmt: skip
    assert flags.tolist() == [False, True, False, True]  # λ·MSE_orig = 3 · 0.05 / 3 = 0.05
    torch.testing.assert_close(bank.inputs("guided"), images[[1, 3]])
    torch.testing.assert_close(bank.labels("guided"), torch.tensor([0.0, -0.2]))  # the seeds' true angles

    # classification: the label predicted on the seed must not change
    seed_logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 3.0]])
    flags = search_violations(
        result(logits), MetamorphicRelation("classification"), seed_logits, torch.tensor([0, 1, 1])
    )
    assert flags.tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match="regression"):
        search_violations(result(outputs), MetamorphicRelation("classification"), seed_outputs)
    with pytest.raises(ValueError, match="seed_target"):
        search_violations(result(outputs), MetamorphicRelation("regression"), seed_outputs)
