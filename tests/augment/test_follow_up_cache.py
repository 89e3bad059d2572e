"""FollowUpCache (SPEC §3): each image's follow-ups generated once, kept in memory and in files, refused inputs."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from dlguard.augment import FollowUpCache, follow_up_cache
from tests.augment.objects import BAD_INPUTS, good_inputs


def test_cache_generates_each_image_once_and_reads_files_back(textured, tmp_path) -> None:
    images, masks, backgrounds, reference = textured
    keys = torch.tensor([30, 10, 20])
    cache = FollowUpCache(tmp_path)
    first = cache.get_or_make(keys, images, masks, backgrounds, workers=1)
    assert cache.generated == 3 and torch.equal(first.inputs, reference.inputs)
    assert sorted(p.name.split("_")[0] for p in tmp_path.glob("*.pt")) == ["10", "20", "30"]

    again = cache.get_or_make(keys[[2, 0, 2]], images[[2, 0, 2]], masks[[2, 0, 2]], backgrounds)
    assert cache.generated == 3 and torch.equal(again.inputs, reference.inputs[[2, 0, 2]])

    fresh = FollowUpCache(tmp_path)  # a new process: the files, not the memory
    read = fresh.get_or_make(keys, images, masks, backgrounds)
    assert (fresh.generated, fresh.loaded) == (0, 3)
    assert torch.equal(read.inputs, reference.inputs) and torch.equal(read.valid, reference.valid)
    assert read.operation == reference.operation and torch.equal(read.function, reference.function)

    other = backgrounds.flip(0)  # other backgrounds: nothing may be reused
    swapped = fresh.get_or_make(keys, images, masks, other)
    assert fresh.generated == 3 and len(list(tmp_path.glob("*.pt"))) == 6
    assert torch.equal(swapped.background_swapped(), reference.background_swapped().flip(1))


def test_files_of_another_follow_up_format_or_opencv_version_are_not_read(textured, tmp_path, monkeypatch) -> None:
    images, masks, backgrounds, _ = textured
    keys = torch.tensor([1, 2, 3])
    FollowUpCache(tmp_path).get_or_make(keys, images, masks, backgrounds, workers=1)
    monkeypatch.setattr(follow_up_cache, "FORMAT", follow_up_cache.FORMAT + 1)  # follow_up_images changed
    newer = FollowUpCache(tmp_path)
    newer.get_or_make(keys, images, masks, backgrounds, workers=1)
    assert (newer.generated, newer.loaded) == (3, 0)
    monkeypatch.setattr(follow_up_cache.cv2, "__version__", "0.0.0")  # another OpenCV
    other = FollowUpCache(tmp_path)
    other.get_or_make(keys, images, masks, backgrounds, workers=1)
    assert (other.generated, other.loaded) == (3, 0) and len(list(tmp_path.glob("*.pt"))) == 9
    again = FollowUpCache(tmp_path)  # the same format and version read their own files
    again.get_or_make(keys, images, masks, backgrounds, workers=1)
    assert (again.generated, again.loaded) == (0, 3)


def test_cache_in_memory_generates_only_the_missing_keys(textured, monkeypatch) -> None:
    images, masks, backgrounds, reference = textured
    calls: list[int] = []
    generate = follow_up_cache.follow_up_images

    def counting(images: Tensor, *args: object, **kwargs: object) -> tuple[Tensor, Tensor]:
        calls.append(len(images))
        return generate(images, *args, **kwargs)

    monkeypatch.setattr(follow_up_cache, "follow_up_images", counting)
    cache = FollowUpCache()
    cache.get_or_make(torch.tensor([1, 1]), images[:2].clone().copy_(images[0]), masks[[0, 0]], backgrounds)
    out = cache.get_or_make(torch.tensor([2, 1, 3]), images[[1, 0, 2]], masks[[1, 0, 2]], backgrounds)
    assert calls == [1, 2] and len(cache) == 3
    assert torch.equal(out.inputs, reference.inputs[[1, 0, 2]])
    cache.get_or_make(torch.tensor([3, 2]), images[[2, 1]], masks[[2, 1]], backgrounds)
    assert calls == [1, 2]


@pytest.mark.parametrize(("change", "message"), BAD_INPUTS)
def test_bad_inputs_are_refused_before_any_work(change, message, monkeypatch) -> None:
    def planted(*args: object, **kwargs: object) -> None:
        raise AssertionError("work started before validation")

    monkeypatch.setattr(follow_up_cache, "follow_up_images", planted)
    x, m, bg = change(*good_inputs())
    with pytest.raises(ValueError, match=message):
        FollowUpCache().get_or_make(torch.arange(len(x)), x, m, bg)


def test_bad_keys_are_refused() -> None:
    images, masks, _ = good_inputs()
    with pytest.raises(ValueError, match=r"keys: expected shape \(2,\)"):
        FollowUpCache().get_or_make(torch.arange(3), images, masks, images)
    with pytest.raises(ValueError, match="keys: expected an integer tensor"):
        FollowUpCache().get_or_make(torch.zeros(2), images, masks, images)
