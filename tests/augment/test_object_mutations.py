"""Object relevancy's OpenCV mutations and the transplant (SPEC §3) against expectations computed independently.

Follow-ups are read through :func:`~dlguard.augment.object_follow_ups`, which names each one.
"""

from __future__ import annotations

import pytest
import torch

from dlguard.augment import object_follow_ups
from dlguard.augment.functional import follow_up_images, transplant
from tests.augment.objects import LUMA, SIZE, box_of, disk, grow, index, median3, scene, shrink


def test_fill_with_color_fills_the_region_and_median_blurs_only_the_seam(removed) -> None:
    images, _, regions, follow_ups = removed
    colors = {"red": (1, 0, 0), "cyan": (0, 1, 1), "gray": (0.5, 0.5, 0.5), "black": (0, 0, 0)}
    for b in range(len(images)):
        inner, outer = regions[b], grow(regions[b])  # the region whole, the seam is the ring outside it
        seam = outer & ~inner
        for name, rgb in colors.items():
            color = torch.tensor(rgb, dtype=torch.float32).view(3, 1, 1)
            out = follow_ups.inputs[b, index(follow_ups, f"FillObjectWithColor/{name}")]
            assert torch.equal(out[:, inner], color.expand(3, SIZE, SIZE)[:, inner])
            assert torch.equal(out[:, ~outer], images[b][:, ~outer])
            composite = torch.where(regions[b], color, images[b])
            torch.testing.assert_close(out[:, seam], median3(composite)[:, seam])


def test_gray_background_keeps_the_object_and_grays_the_rest(textured) -> None:
    images, masks, _, follow_ups = textured
    out = follow_ups.inputs[:, index(follow_ups, "GrayBackground/gray")]
    for b in range(len(images)):
        inner, outer = masks[b], grow(masks[b])  # the object whole, the seam is the ring outside it
        assert torch.equal(out[b][:, inner], images[b][:, inner])
        assert bool((out[b][:, ~outer] == 0.5).all())
        seam = outer & ~inner
        torch.testing.assert_close(out[b][:, seam], median3(torch.where(masks[b], images[b], 0.5))[:, seam])


def test_move_puts_the_object_on_each_background(textured) -> None:
    images, masks, backgrounds, follow_ups = textured
    moved = follow_ups.background_swapped()
    assert moved.shape == (3, 4, 3, SIZE, SIZE)
    for b in range(len(images)):
        inner, outer = masks[b], grow(masks[b])  # the object whole, the seam is the ring outside it
        for n in range(len(backgrounds)):
            assert torch.equal(moved[b, n][:, inner], images[b][:, inner])
            assert torch.equal(moved[b, n][:, ~outer], backgrounds[n][:, ~outer])
            composite = torch.where(masks[b], images[b], backgrounds[n])
            seam = outer & ~inner
            torch.testing.assert_close(moved[b, n][:, seam], median3(composite)[:, seam])


def test_blend_keeps_the_objects_gradients_and_shifts_it_towards_the_new_background() -> None:
    image, mask = scene(background=(0.2, 0.2, 0.2))
    targets = torch.tensor([[0.5, 0.4, 0.5], [0.1, 0.1, 0.3]]).view(2, 3, 1, 1).expand(2, 3, SIZE, SIZE)
    follow_ups = object_follow_ups(image, mask, targets.contiguous())
    blended = follow_ups.inputs[0, follow_ups.function == 1]
    for n in range(2):
        # Poisson cloning with constant surroundings: the source plus the difference of the backgrounds
        offset = (targets[n, :, 0, 0] - 0.2).view(3, 1)
        difference = blended[n][:, mask[0]] - image[0][:, mask[0]]
        assert float((difference - offset).abs().max()) <= 2.5 / 255
        # the object's box grown by the clone's margin bounds what changes; outside it, the background exactly
        near = torch.zeros(SIZE, SIZE, dtype=torch.bool)
        rows, cols = mask[0].nonzero().unbind(1)
        near[int(rows.min()) - 4 : int(rows.max()) + 5, int(cols.min()) - 4 : int(cols.max()) + 5] = True
        assert torch.equal(blended[n][:, ~near], targets[n][:, ~near])
        assert not torch.equal(blended[n], follow_ups.background_swapped()[0, n])


def test_blend_of_objects_touching_the_border_and_tiny_objects_does_not_crash() -> None:
    g = torch.Generator().manual_seed(3)
    images, backgrounds = torch.rand(3, 3, 16, 16, generator=g), torch.rand(2, 3, 16, 16, generator=g)
    masks = torch.zeros(3, 16, 16, dtype=torch.bool)
    masks[0, 0, 0] = True  # a corner pixel
    masks[1, :, 14:] = True  # a band along the right edge, top to bottom
    masks[2] = True  # the whole image
    follow_ups = object_follow_ups(images, masks, backgrounds)
    blended = follow_ups.inputs[:, follow_ups.function == 1]
    assert bool(blended.isfinite().all()) and bool(((blended >= 0) & (blended <= 1)).all())
    far = torch.ones(16, 16, dtype=torch.bool)
    far[:6, :6] = False  # the corner pixel's neighbourhood
    assert torch.equal(blended[0, 1][:, far], backgrounds[1][:, far])


@pytest.mark.parametrize("removal", ["box", "mask"])
def test_inpainting_fills_from_the_surroundings_and_leaves_the_rest(removal: str) -> None:
    image, mask = scene(background=(0.2, 0.6, 0.9))
    follow_ups = object_follow_ups(image, mask, torch.rand(1, 3, SIZE, SIZE), removal=removal)
    region = box_of(mask[0]) if removal == "box" else mask[0]
    outer = grow(region)
    color = torch.tensor([0.2, 0.6, 0.9]).view(3, 1)
    for name in ("ns", "telea"):
        out = follow_ups.inputs[0, index(follow_ups, f"InpaintObject/{name}")]
        assert torch.equal(out[:, ~outer], image[0][:, ~outer])
        assert float((out[:, outer] - color).abs().max()) <= 4 / 255  # a constant surrounding fills in ~constant

    g = torch.Generator().manual_seed(5)
    ramp = torch.linspace(0, 1, SIZE).view(1, 1, SIZE).expand(1, 3, SIZE, SIZE)
    textured = torch.where(mask[:, None], torch.rand(1, 3, SIZE, SIZE, generator=g), ramp)
    follow_ups = object_follow_ups(textured, mask, torch.rand(1, 3, SIZE, SIZE), removal=removal)
    ns = follow_ups.inputs[0, index(follow_ups, "InpaintObject/ns")]
    telea = follow_ups.inputs[0, index(follow_ups, "InpaintObject/telea")]
    assert not torch.equal(ns, telea)
    for out in (ns, telea):
        assert torch.equal(out[:, ~outer], textured[0][:, ~outer])
        # a horizontal ramp: the filled pixels follow it (the object's own texture is gone)
        error = float((out[:, mask[0]] - ramp[0][:, mask[0]]).abs().mean())
        assert error < 0.1 and error < float((textured[0][:, mask[0]] - ramp[0][:, mask[0]]).abs().mean()) / 3


def test_margin_statistics_are_those_of_the_box_outside_the_mask(removed) -> None:
    images, masks, regions, follow_ups = removed
    for b in range(len(images)):
        rows, cols = masks[b].nonzero().unbind(1)
        box = torch.zeros(SIZE, SIZE, dtype=torch.bool)
        box[int(rows.min()) : int(rows.max()) + 1, int(cols.min()) : int(cols.max()) + 1] = True
        margin = images[b][:, box & ~masks[b]].double()
        for name, value in (("mean", margin.mean(1)), ("median", margin.quantile(0.5, dim=1))):
            f = index(follow_ups, f"FillObjectWithMarginStatistic/{name}")
            out = follow_ups.inputs[b, f]
            expected = value.float().view(3, 1).expand(3, int(regions[b].sum()))
            torch.testing.assert_close(out[:, regions[b]], expected, atol=1e-6, rtol=0)
            assert torch.equal(out[:, ~regions[b]], images[b][:, ~regions[b]])  # no seam blur here
    assert bool(follow_ups.valid.all())


def test_a_mask_filling_its_box_has_no_margin_statistic() -> None:
    g = torch.Generator().manual_seed(2)
    images = torch.rand(2, 3, 12, 12, generator=g)
    masks = torch.zeros(2, 12, 12, dtype=torch.bool)
    masks[0, 3:8, 2:9] = True  # a rectangle: its box is the mask
    masks[1, 3:8, 2:9] = True
    masks[1, 3, 2] = False
    follow_ups = object_follow_ups(images, masks, torch.rand(1, 3, 12, 12, generator=g))
    assert follow_ups.valid[:, :-2].all() and follow_ups.valid[:, -2:].tolist() == [[False, False], [True, True]]
    assert torch.equal(follow_ups.inputs[0, -1], images[0]) and torch.equal(follow_ups.inputs[0, -2], images[0])


def test_grayscale_images_get_gray_backgrounds_and_gray_colours() -> None:
    g = torch.Generator().manual_seed(4)
    images = torch.rand(2, 1, SIZE, SIZE, generator=g)
    masks = torch.stack([disk(12, 12, 20), disk(5, 5, 9)])
    backgrounds = torch.rand(3, 3, SIZE, SIZE, generator=g)  # RGB backgrounds for gray images
    follow_ups = object_follow_ups(images, masks, backgrounds)
    assert follow_ups.inputs.shape == (2, 20, 1, SIZE, SIZE)
    assert bool(((follow_ups.inputs >= 0) & (follow_ups.inputs <= 1)).all())
    gray = (backgrounds * LUMA.view(1, 3, 1, 1)).sum(1, keepdim=True)
    outer, inner = grow(masks[0]), shrink(masks[0])
    for n in range(3):
        torch.testing.assert_close(follow_ups.background_swapped()[0, n][:, ~outer], gray[n][:, ~outer])
    red = follow_ups.inputs[0, index(follow_ups, "FillObjectWithColor/red")]
    torch.testing.assert_close(red[:, inner], torch.full_like(red[:, inner], 0.299))
    one_channel = object_follow_ups(images, masks, gray)
    torch.testing.assert_close(one_channel.inputs, follow_ups.inputs, atol=2e-6, rtol=0)


def test_the_number_of_workers_does_not_change_the_follow_ups(textured) -> None:
    images, masks, backgrounds, sequential = textured
    for workers in (2, None):
        parallel = object_follow_ups(images, masks, backgrounds, workers=workers)
        assert torch.equal(parallel.inputs, sequential.inputs) and torch.equal(parallel.valid, sequential.valid)


def test_transplant_pastes_the_scaled_donor_into_the_emptied_scene() -> None:
    donors = torch.zeros(2, 3, 10, 10)
    donor_masks = torch.zeros(2, 10, 10, dtype=torch.bool)
    donor_masks[:, 2:6, 3:7] = True
    donor_masks[:, 2:4, 3:5] = False  # an L: its box is 4×4, the top-left quarter empty
    donors[:, 0] = 1.0  # red everywhere, the mask picks the object
    scenes = torch.tensor([0.3, 0.5, 0.7]).view(1, 3, 1, 1).repeat(2, 1, SIZE, SIZE)
    scene_masks = torch.zeros(2, SIZE, SIZE, dtype=torch.bool)
    scene_masks[0, 4:12, 6:14] = True  # 8×8: the donor doubled
    scene_masks[1, 10:14, 2:6] = True  # 4×4: the donor as it is
    scenes[scene_masks[:, None].expand_as(scenes)] = 0.95
    out, masks = transplant(donors, donor_masks, scenes, scene_masks, return_masks=True)
    assert out.shape == (2, 3, SIZE, SIZE) and masks.dtype == torch.bool

    doubled = donor_masks[0, 2:6, 3:7].repeat_interleave(2, 0).repeat_interleave(2, 1)
    assert torch.equal(masks[0, 4:12, 6:14], doubled) and int(masks[0].sum()) == int(doubled.sum())
    assert torch.equal(masks[1, 10:14, 2:6], donor_masks[1, 2:6, 3:7]) and int(masks[1].sum()) == 12
    background = torch.tensor([0.3, 0.5, 0.7]).view(3, 1)
    for b in range(2):
        inner = shrink(masks[b])
        assert bool((out[b][:, inner] == torch.tensor([1.0, 0.0, 0.0]).view(3, 1)).all())
        assert torch.equal(out[b][:, ~grow(scene_masks[b])], scenes[b][:, ~grow(scene_masks[b])])
    emptied = scene_masks[0] & ~grow(masks[0])  # the old object's uncovered part, inpainted from a constant
    assert int(emptied.sum()) == 9 and float((out[0][:, emptied] - background).abs().max()) <= 2 / 255

    plain = transplant(donors, donor_masks, scenes, scene_masks, workers=1)
    assert torch.equal(plain, out)


def test_transplant_of_grayscale_textured_scenes_does_not_depend_on_workers() -> None:
    g = torch.Generator().manual_seed(6)
    donors, scenes = torch.rand(5, 1, 16, 16, generator=g), torch.rand(5, 1, SIZE, SIZE, generator=g)
    donor_masks = torch.stack([disk(8, 8, r, size=16) for r in (4, 9, 16, 25, 36)])
    scene_masks = torch.stack([disk(10 + r, 12, 10, size=SIZE) for r in range(5)])
    one = transplant(donors, donor_masks, scenes, scene_masks, workers=1)
    assert one.shape == (5, 1, SIZE, SIZE) and bool(((one >= 0) & (one <= 1)).all())
    assert torch.equal(one, transplant(donors, donor_masks, scenes, scene_masks, workers=3))
    boxes = torch.zeros_like(scene_masks)  # the donor fills the scene object's box, and its seam one pixel more
    for b, mask in enumerate(scene_masks):
        rows, cols = mask.nonzero().unbind(1)
        boxes[b, int(rows.min()) : int(rows.max()) + 1, int(cols.min()) : int(cols.max()) + 1] = True
    far = ~grow(boxes)
    assert torch.equal(one[:, 0][far], scenes[:, 0][far])
    assert not torch.equal(one[:, 0][~far], scenes[:, 0][~far])


def test_follow_up_images_are_the_named_follow_ups(textured) -> None:
    images, masks, backgrounds, follow_ups = textured
    inputs, valid = follow_up_images(images, masks, backgrounds, workers=2)
    assert torch.equal(inputs, follow_ups.inputs) and torch.equal(valid, follow_ups.valid)


def test_bad_transplant_inputs_are_refused() -> None:
    images, masks = torch.rand(2, 3, 8, 8), torch.zeros(2, 8, 8, dtype=torch.bool)
    masks[:, 2:5, 2:5] = True
    with pytest.raises(ValueError, match="object_images: expected the batch size and channels"):
        transplant(images[:1], masks[:1], images, masks)
    with pytest.raises(ValueError, match="background_masks: the mask of image 0 is empty"):
        transplant(images, masks, images, torch.zeros_like(masks))
    with pytest.raises(ValueError, match="object_masks: expected a bool tensor"):
        transplant(images, masks[:, :4], images, masks)
    with pytest.raises(ValueError, match="workers: expected an integer of at least 1"):
        transplant(images, masks, images, masks, workers=0)


def read_shape(images: torch.Tensor, net: torch.nn.Module) -> torch.Tensor:
    """A model that reads only the object's shape: the bright pixels' silhouette, framed as MNIST, through mnist_a."""
    silhouettes = (images.amax(1) > 0.65).float()  # digits have a channel at 1, backgrounds stay below 0.6
    framed = torch.zeros(len(images), 1, 28, 28)
    for b, silhouette in enumerate(silhouettes):
        pixels = silhouette.nonzero()
        if not len(pixels):
            continue
        (y1, x1), (y2, x2) = pixels.min(0).values.tolist(), pixels.max(0).values.tolist()
        crop = silhouette[y1 : y2 + 1, x1 : x2 + 1]
        scale = 20 / max(crop.shape)  # MNIST: the digit's longer side 20 pixels, centred in 28
        h, w = max(1, round(crop.shape[0] * scale)), max(1, round(crop.shape[1] * scale))
        top, left = (28 - h) // 2, (28 - w) // 2
        framed[b, 0, top : top + h, left : left + w] = torch.nn.functional.interpolate(
            crop[None, None], size=(h, w), mode="bilinear", align_corners=False
        )[0, 0]
    with torch.no_grad():
        return net(framed).argmax(1)


def test_every_removing_operation_takes_the_object_from_a_model_that_reads_its_shape() -> None:
    from dlguard.data import make_scenes, scene_backgrounds
    from dlguard.data.mnist import embedded_mnist
    from dlguard.zoo import pretrained

    digits, labels = embedded_mnist()
    rows = torch.cat([(labels == c).nonzero()[:4, 0] for c in range(10)])
    scenes = make_scenes(digits[rows], labels[rows], seed=0)
    net = pretrained("mnist_a").eval()
    read = read_shape(scenes.images, net)
    right = read == scenes.labels
    assert float(right.float().mean()) >= 0.75  # it reads the digits
    backgrounds = scene_backgrounds(2, 32, seed=1)[0]
    kept = {}
    for removal in ("box", "mask"):
        follow_ups = object_follow_ups(scenes.images[right], scenes.masks[right], backgrounds, removal=removal)
        for f in (~follow_ups.preserving).nonzero()[:, 0].tolist():
            after = read_shape(follow_ups.inputs[:, f], net)
            kept[removal, follow_ups.operation[f]] = float((after == read[right]).float().mean())
    # the box leaves nothing of the shape: what the reader says of a rectangle or of nothing is the label by chance
    assert max(share for (removal, _), share in kept.items() if removal == "box") <= 0.3
    # the planted defect the box removes: a mask filled with a bright colour is the digit's silhouette, still read
    assert kept["mask", "FillObjectWithColor/white"] >= 0.8 and kept["mask", "FillObjectWithColor/red"] >= 0.8
