"""Guided transplant attack (SPEC §3): planted defects, guided against random, order, seeding, no trace, bad inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms import Normalize

from dlguard.augment import object_follow_ups
from dlguard.augment.functional import transplant
from dlguard.data.backgrounds import scene_backgrounds
from dlguard.data.scenes import make_scenes
from dlguard.generate.object_relevancy import object_relevancy_test
from dlguard.generate.transplant_attack import TransplantAttackResult, transplant_attack
from dlguard.metrics.functional.object_relevancy import ObjectRelevancyScores
from dlguard.probes.adapter import ModelAdapter
from tests.probes.fingerprint import assert_unchanged, fingerprint

SIZE = 20
INNER = slice(5, 15)  # every object (and what inpainting or a seam touches) lies inside this central square
BACKGROUND_COLOURS = torch.tensor([[0.2, 0.2, 0.7], [0.7, 0.2, 0.2], [0.2, 0.7, 0.2]])  # class = background colour
OBJECT_COLOURS = torch.tensor([[1.0, 0.55, 0.0], [0.55, 0.0, 1.0], [0.0, 0.55, 0.55]])  # class = object colour


def _outside() -> Tensor:
    outside = torch.ones(SIZE, SIZE, dtype=torch.bool)
    outside[INNER, INNER] = False
    return outside


class _Reader(nn.Module):
    """A hand-built classifier of the synthetic scenes.

    ``"background"``: the class whose background colour is nearest the mean colour outside the central square.
    ``"object"``: the class whose object colour some pixel matches best. ``"gated"``: the background's class
    when the background is textured (a checker), the object's otherwise. ``"confused"``: the class both
    agree on, else class 2. A BatchNorm (identity in eval mode
    at its initial statistics) and Dropout make train mode visible.
    """

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.register_buffer("background_colours", BACKGROUND_COLOURS.clone())
        self.register_buffer("object_colours", OBJECT_COLOURS.clone())
        self.register_buffer("outside", _outside())
        self.scale = nn.Parameter(torch.tensor(10.0))
        self.norm = nn.BatchNorm1d(3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: Tensor) -> Tensor:
        border = x[:, :, self.outside]  # (B, 3, pixels)
        background = -self.scale * ((border.mean(2)[:, None] - self.background_colours) ** 2).sum(-1)
        pixels = x.flatten(2).transpose(1, 2)  # (B, HW, 3)
        closeness = ((pixels[:, :, None] - self.object_colours[None, None]) ** 2).sum(-1).amin(1)
        obj = -self.scale * closeness
        if self.mode == "background":
            logits = background
        elif self.mode == "object":
            logits = obj
        elif self.mode == "confused":
            agree = background.argmax(1) == obj.argmax(1)
            logits = torch.where(agree[:, None], background, 10.0 * torch.eye(3)[2].expand_as(background))
        else:
            textured = border.std(2).mean(1) > 0.05
            logits = torch.where(textured[:, None], background, obj)
        return self.drop(self.norm(logits))


def _scenes(labels: list[int], textured: list[bool], seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Scenes of ``SIZE²`` pixels: a plain or checkered background of the label's colour (jittered per image)
    and a rectangle of the label's object colour at a random place inside the central square."""
    generator = torch.Generator().manual_seed(seed)
    count = len(labels)
    target = torch.tensor(labels)
    jitter = (torch.rand(count, 3, 1, 1, generator=generator) - 0.5) * 0.06
    images = (BACKGROUND_COLOURS[target][:, :, None, None] + jitter).expand(-1, -1, SIZE, SIZE).clone()
    checker = ((torch.arange(SIZE)[:, None] + torch.arange(SIZE)[None]) % 2 * 2 - 1).float() * 0.15
    for i, tex in enumerate(textured):
        if tex:
            images[i] += checker
    masks = torch.zeros(count, SIZE, SIZE, dtype=torch.bool)
    for i in range(count):
        h, w = (int(v) for v in torch.randint(3, 7, (2,), generator=generator))
        top = 6 + int(torch.randint(0, 8 - h + 1, (1,), generator=generator))
        left = 6 + int(torch.randint(0, 8 - w + 1, (1,), generator=generator))
        masks[i, top : top + h, left : left + w] = True
    images = torch.where(masks[:, None], OBJECT_COLOURS[target][:, :, None, None], images)
    return images.clamp(0, 1), target, masks


def _scores(count: int, seed: int = 0, correct: Tensor | None = None) -> ObjectRelevancyScores:
    generator = torch.Generator().manual_seed(seed)
    preserving, removing = torch.rand(count, generator=generator), torch.rand(count, generator=generator)
    correct = torch.ones(count, dtype=torch.bool) if correct is None else correct
    return ObjectRelevancyScores(
        preserving,
        removing,
        (preserving + removing) / 2,
        torch.ones(count),
        correct,
        torch.zeros(count, 6),
    )


def _balanced(per_class: int, textured: bool = False, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    labels = [c for c in range(3) for _ in range(per_class)]
    return _scenes(labels, [textured] * len(labels), seed)


# --- (a) planted defects ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", [1, 2])
def test_a_model_reading_the_background_falls_for_every_transplant(scenario: int) -> None:
    images, target, masks = _balanced(4)
    model = _Reader("background").eval()
    assert torch.equal(model(images).argmax(1), target)  # correct on the sources
    for strategy in ("guided", "random"):
        result = transplant_attack(
            model, images, target, masks, _scores(len(target)), scenario=scenario, strategy=strategy, budget=10
        )
        assert result.pairs.tolist() == [[0, 1], [0, 2], [1, 0], [1, 2], [2, 0], [2, 1]]
        assert result.attempts.tolist() == [10] * 6
        assert result.successes.tolist() == [10] * 6, strategy
        assert result.first_success.tolist() == [0] * 6
        assert result.total == 60 and result.success_rate == 1.0
        # every prediction is the background's class
        assert torch.equal(result.predictions, result.pairs[:, :1].expand(-1, 10))


@pytest.mark.parametrize("scenario", [1, 2])
def test_a_model_reading_the_object_resists_every_transplant(scenario: int) -> None:
    images, target, masks = _balanced(4, textured=True)
    model = _Reader("object").eval()
    assert torch.equal(model(images).argmax(1), target)
    for strategy in ("guided", "random"):
        result = transplant_attack(
            model, images, target, masks, _scores(len(target)), scenario=scenario, strategy=strategy, budget=10
        )
        assert result.attempts.tolist() == [10] * 6
        assert result.total == 0, strategy
        assert result.first_success.tolist() == [-1] * 6
        assert result.examples.shape == (0, 3, SIZE, SIZE) and result.example_sources.shape == (0, 2)
        # every prediction is the donor's class: the transplanted object is what the model sees
        assert torch.equal(result.predictions, result.pairs[:, 1:].expand(-1, 10))


def test_the_scenarios_count_different_outcomes() -> None:
    images, target, masks = _balanced(3)
    model = _Reader("confused").eval()
    assert torch.equal(model(images).argmax(1), target)
    scores = _scores(len(target))
    one = transplant_attack(model, images, target, masks, scores, scenario=1, budget=4)
    two = transplant_attack(model, images, target, masks, scores, scenario=2, budget=4)
    assert torch.equal(one.sources, two.sources) and torch.equal(one.predictions, two.predictions)
    assert bool((one.predictions == 2).all())  # background and object disagree: always class 2
    # scenario 1 succeeds when the donor is not of class 2, scenario 2 when the background is
    assert one.successes.tolist() == [4 * int(donor != 2) for _, donor in one.pairs.tolist()]
    assert two.successes.tolist() == [4 * int(background == 2) for background, _ in two.pairs.tolist()]
    assert one.scenario == 1 and two.scenario == 2 and one.strategy == "guided"


def test_a_model_reading_the_background_of_scenes_falls_for_every_transplant() -> None:
    digits = torch.zeros(24, 28, 28, dtype=torch.uint8)
    labels = torch.arange(24) % 3
    for i, label in enumerate(labels.tolist()):
        digits[i, 4:24, 6 + 3 * label : 22 - 3 * label] = 220  # three shapes of "digit"
    scenes = make_scenes(digits, labels, size=32, spurious=1.0, seed=0)  # background kind = label
    mean_colours = scenes.images.mean((2, 3))
    centroids = torch.stack([mean_colours[labels == c].mean(0) for c in range(3)])
    model = _NearestMeanColour(centroids)
    follow_ups = object_follow_ups(scenes.images, scenes.masks, scene_backgrounds(3, 32, kinds=[5, 6, 7])[0], workers=1)
    scores = object_relevancy_test(model, scenes.images, scenes.labels, follow_ups).scores
    assert int(scores.correct.sum()) >= 20  # the attack uses only these
    for scenario in (1, 2):
        for strategy in ("guided", "random"):
            result = transplant_attack(
                model,
                scenes.images,
                scenes.labels,
                scenes.masks,
                scores,
                scenario=scenario,
                strategy=strategy,
                budget=8,
            )
            assert result.successes.tolist() == [8] * 6, (scenario, strategy)


class _NearestMeanColour(nn.Module):
    def __init__(self, centroids: Tensor) -> None:
        super().__init__()
        self.register_buffer("centroids", centroids)

    def forward(self, x: Tensor) -> Tensor:
        return -200.0 * ((x.mean((2, 3))[:, None] - self.centroids[None]) ** 2).sum(-1)


# --- (b) guided beats random when the scores are informative ------------------------------------------------------


def _mixed_candidates() -> tuple[Tensor, Tensor, Tensor]:
    """Per class 4 textured scenes (the gated model reads their background) and 4 plain ones (it reads the
    object); the textured ones come last so that index order alone would not find them."""
    labels = [c for c in range(3) for _ in range(8)]
    textured = [i % 8 >= 4 for i in range(len(labels))]
    return _scenes(labels, textured, seed=1)


def _honest_scores(model: nn.Module, images: Tensor, target: Tensor, masks: Tensor) -> ObjectRelevancyScores:
    generator = torch.Generator().manual_seed(5)
    colours = torch.rand(3, 3, 1, 1, generator=generator) * 0.5 + 0.25
    checker = ((torch.arange(SIZE)[:, None] + torch.arange(SIZE)[None]) % 2 * 2 - 1).float() * 0.15
    backgrounds = (colours + checker).clamp(0, 1)
    follow_ups = object_follow_ups(images, masks, backgrounds, workers=1)
    return object_relevancy_test(model, images, target, follow_ups).scores


@pytest.mark.parametrize("scenario", [1, 2])
def test_guided_selection_beats_random_when_the_scores_are_informative(scenario: int) -> None:
    images, target, masks = _mixed_candidates()
    model = _Reader("gated").eval()
    scores = _honest_scores(model, images, target, masks)
    assert bool(scores.correct.all())
    textured = torch.arange(len(target)) % 8 >= 4
    # the scores see the defect: removing the object of a textured scene changes nothing (S⁻ = 0)
    assert float(scores.removing[textured].max()) < float(scores.removing[~textured].min())
    guided = transplant_attack(model, images, target, masks, scores, scenario=scenario, strategy="guided", budget=10)
    random = transplant_attack(model, images, target, masks, scores, scenario=scenario, strategy="random", budget=10)
    assert guided.attempts.tolist() == random.attempts.tolist() == [10] * 6
    # the first 10 cells by i + j use the 4 lowest-S⁻ backgrounds: all textured, all successes
    assert guided.successes.tolist() == [10] * 6
    assert bool(textured[guided.sources[:, :, 0]].all())
    # a random background is textured half of the time, and only those succeed
    random_textured = textured[random.sources[:, :, 0]]
    assert torch.equal(random.successes, random_textured.sum(1))
    assert 15 <= random.total <= 45 < guided.total == 60
    assert bool((guided.first_success <= random.first_success.where(random.first_success >= 0, 10)).all())


# --- (c) guided order ---------------------------------------------------------------------------------------------


def test_guided_order_walks_the_score_grid_by_increasing_rank_sum() -> None:
    images, target, masks = _balanced(5)
    scores = _scores(len(target), seed=3)
    model = _Reader("background")
    result = transplant_attack(model, images, target, masks, scores, scenario=1, pairs=[[2, 0], [0, 1]], budget=12)
    for p, (background_class, donor_class) in enumerate(result.pairs.tolist()):
        backgrounds = sorted(
            (target == background_class).nonzero().flatten().tolist(), key=lambda i: scores.removing[i]
        )
        donors = sorted((target == donor_class).nonzero().flatten().tolist(), key=lambda i: scores.preserving[i])
        grid = sorted(((i, j) for i in range(5) for j in range(5)), key=lambda cell: (cell[0] + cell[1], cell[0]))
        expected = [[backgrounds[i], donors[j]] for i, j in grid[:12]]
        assert result.sources[p].tolist() == expected
        # the first attempt: the lowest S⁻ background with the lowest S⁺ donor
        lowest_background = min(backgrounds, key=lambda i: scores.removing[i])
        lowest_donor = min(donors, key=lambda i: scores.preserving[i])
        assert result.sources[p, 0].tolist() == [lowest_background, lowest_donor]
    # every attempt of this background-reading model succeeds: the examples start with attempt 0 of each pair
    assert result.example_sources[:2].tolist() == [result.sources[0, 0].tolist(), result.sources[1, 0].tolist()]


def test_the_budget_stops_at_the_pairs_combinations_and_skips_misclassified_images() -> None:
    images, target, masks = _balanced(3)
    correct = torch.ones(len(target), dtype=torch.bool)
    correct[[0, 4]] = False  # one image of class 0, one of class 1 are "misclassified"
    scores = _scores(len(target), correct=correct)
    model = _Reader("background")
    for strategy in ("guided", "random"):
        result = transplant_attack(
            model, images, target, masks, scores, scenario=2, strategy=strategy, pairs=[[0, 1], [2, 0]], budget=50
        )
        assert result.attempts.tolist() == [4, 6]  # 2·2 and 3·2 combinations
        for p in range(2):
            tried = result.sources[p, : result.attempts[p]]
            assert len({tuple(cell) for cell in tried.tolist()}) == len(tried)  # no combination twice
            assert bool(correct[tried].all())
            assert torch.equal(target[tried[:, 0]], result.pairs[p, 0].expand(len(tried)))
            assert torch.equal(target[tried[:, 1]], result.pairs[p, 1].expand(len(tried)))
            assert bool((result.sources[p, result.attempts[p] :] == -1).all())
            assert bool((result.predictions[p, result.attempts[p] :] == -1).all())


def test_examples_are_the_synthesised_images_and_their_predictions() -> None:
    images, target, masks = _balanced(4)
    model = _Reader("background").eval()
    result = transplant_attack(model, images, target, masks, _scores(len(target)), scenario=2, budget=5, keep=7)
    assert len(result.examples) == 7
    background, donor = result.example_sources[:, 0], result.example_sources[:, 1]
    expected = transplant(images[donor], masks[donor], images[background], masks[background])
    torch.testing.assert_close(result.examples, expected)
    assert torch.equal(result.example_predictions, model(expected).argmax(1))
    assert torch.equal(result.example_predictions, target[background])  # scenario 2: the background's class
    # the donor's object (a rectangle, as is the background's) fills the background's object box: inside its
    # seam, every pixel has the donor's object colour
    interior = -F.max_pool2d(-masks[background].float()[:, None], 3, 1, 1)[:, 0] > 0.5
    assert bool(interior.flatten(1).any(1).all())
    colours = OBJECT_COLOURS[target[donor]][:, :, None, None].expand_as(result.examples)
    assert torch.equal(
        result.examples[interior[:, None].expand_as(colours)], colours[interior[:, None].expand_as(colours)]
    )


def test_batching_and_preprocess_do_not_change_the_result() -> None:
    images, target, masks = _mixed_candidates()
    model = _Reader("gated").eval()
    scores = _scores(len(target), seed=2)
    one = transplant_attack(model, images, target, masks, scores, scenario=1, strategy="random", budget=7)
    other = transplant_attack(
        model, images, target, masks, scores, scenario=1, strategy="random", budget=7, max_batch=5
    )
    identity = Normalize((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    adapted = ModelAdapter(model, preprocess=identity)
    third = transplant_attack(adapted, images, target, masks, scores, scenario=1, strategy="random", budget=7)
    for result in (other, third):
        assert torch.equal(result.sources, one.sources) and torch.equal(result.predictions, one.predictions)
        assert torch.equal(result.successes, one.successes) and torch.equal(result.examples, one.examples)


# --- (d) random is seeded -----------------------------------------------------------------------------------------


def test_random_selection_is_seeded_and_per_pair() -> None:
    images, target, masks = _balanced(6)
    scores = _scores(len(target))
    model = _Reader("background")

    def run(seed: int, pairs: list[list[int]] | None = None) -> TransplantAttackResult:
        return transplant_attack(
            model, images, target, masks, scores, scenario=1, strategy="random", pairs=pairs, budget=8, seed=seed
        )

    first, again, other = run(0), run(0), run(1)
    assert torch.equal(first.sources, again.sources)
    assert not torch.equal(first.sources, other.sources)
    # a pair's draws depend on the seed and the pair, not on which other pairs run with it
    alone = run(0, pairs=[[2, 1]])
    index = first.pairs.tolist().index([2, 1])
    assert torch.equal(alone.sources[0], first.sources[index])
    # not the guided order, and not the same cells for every pair
    guided = transplant_attack(model, images, target, masks, scores, scenario=1, budget=8)
    assert not torch.equal(first.sources, guided.sources)
    # the guided order draws nothing: the seed does not matter
    guided_other = transplant_attack(model, images, target, masks, scores, scenario=1, budget=8, seed=9)
    assert torch.equal(guided.sources, guided_other.sources)


def test_random_selection_is_uniform_over_the_combinations() -> None:
    images, target, masks = _balanced(3)
    scores = _scores(len(target))
    model = _Reader("background")
    counts = torch.zeros(3, 3)
    for seed in range(150):
        result = transplant_attack(
            model, images, target, masks, scores, scenario=1, strategy="random", pairs=[[0, 1]], budget=1, seed=seed
        )
        background, donor = result.sources[0, 0].tolist()
        counts[background, donor - 3] += 1
    assert counts.sum() == 150 and int(counts.min()) >= 5  # 9 cells, about 16.7 each


# --- (e) the model is left as found -------------------------------------------------------------------------------


def test_the_model_is_left_exactly_as_found_also_after_a_bad_input() -> None:
    images, target, masks = _balanced(3)
    model = _Reader("background")
    model.train()
    model.norm.weight.requires_grad_(False)
    before = fingerprint(model)
    result = transplant_attack(model, images, target, masks, _scores(len(target)), scenario=2, budget=4)
    assert result.total == result.attempts.sum() == 24  # eval mode: no dropout, BatchNorm's running statistics
    assert_unchanged(model, before)
    with pytest.raises(ValueError, match=r"^scenario:"):
        transplant_attack(model, images, target, masks, _scores(len(target)), scenario=3)
    assert_unchanged(model, before)


# --- (f) bad inputs -----------------------------------------------------------------------------------------------


def _bad_cases() -> list[object]:
    images, target, masks = _balanced(2)
    empty = masks.clone()
    empty[1] = False
    scores = _scores(len(target))
    short = ObjectRelevancyScores(*(None if field is None else field[:-1] for field in scores))
    nan = scores._replace(removing=torch.full((len(target),), float("nan")))
    only_class_0 = scores._replace(correct=target == 0)
    no_class_2 = scores._replace(correct=target != 2)
    cases = [
        ("scenario", {"scenario": 0}),
        ("scenario", {"scenario": 1.0}),
        ("scenario", {"scenario": True}),
        ("strategy", {"strategy": "greedy"}),
        ("budget", {"budget": 0}),
        ("seed", {"seed": 0.5}),
        ("max_batch", {"max_batch": 0}),
        ("keep", {"keep": -1}),
        ("images", {"images": images * 2}),
        ("images", {"images": images[:, :2]}),
        ("target", {"target": target[:-1]}),
        ("masks", {"masks": masks[:, :-1]}),
        ("masks", {"masks": masks.float()}),
        ("masks", {"masks": empty}),
        ("scores", {"scores": short}),
        ("scores", {"scores": nan}),
        ("scores", {"scores": (scores.preserving, scores.removing)}),
        ("pairs", {"pairs": [[1, 1]]}),
        ("pairs", {"pairs": [[0, 1, 2]]}),
        ("pairs", {"pairs": torch.zeros(0, 2, dtype=torch.long)}),
        ("pairs", {"pairs": [[0.0, 1.0]]}),
        ("pairs", {"pairs": [[0, 5]]}),
        ("pairs", {"pairs": [[2, 0]], "scores": no_class_2}),
        ("pairs", {"scores": only_class_0}),
    ]
    return [pytest.param(name, change, id=f"{name}-{i}") for i, (name, change) in enumerate(cases)]


@pytest.mark.parametrize(("name", "change"), _bad_cases())
def test_bad_inputs_are_named(name: str, change: dict[str, object]) -> None:
    images, target, masks = _balanced(2)
    arguments: dict[str, object] = {
        "images": images,
        "target": target,
        "masks": masks,
        "scores": _scores(len(target)),
        "scenario": 1,
    }
    arguments.update(change)
    model = _Reader("background")
    with pytest.raises(ValueError, match=f"^{name}:"):
        transplant_attack(model, **arguments)  # type: ignore[arg-type]
