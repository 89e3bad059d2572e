from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch

from dlguard.data.batch import BatchAccessor


def make(seed: int = 0, batch: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 1, 3, 3, generator=gen), torch.randint(0, 10, (batch,), generator=gen)


@dataclass
class Sample:
    image: torch.Tensor
    label: torch.Tensor
    meta: str = "x"


Pair = namedtuple("Pair", ["label", "image"])


def structures():
    """(batch, accessor, getter returning (inputs, target) straight from the structure)."""
    images, labels = make()
    yield (images, labels), BatchAccessor(), lambda b: (b[0], b[1])
    images, labels = make()
    yield [labels, "id", images], BatchAccessor((2, 0)), lambda b: (b[2], b[0])
    images, labels = make()
    yield (
        {"image": images, "label": labels, "n": 3},
        BatchAccessor(("image", "label")),
        lambda b: (
            b["image"],
            b["label"],
        ),
    )
    images, labels = make()
    yield Sample(images, labels), BatchAccessor(lambda s: (s.image, s.label)), lambda b: (b.image, b.label)
    images, labels = make()
    yield Pair(labels, images), BatchAccessor((1, 0)), lambda b: (b.image, b.label)


@pytest.mark.parametrize("index", range(5))
def test_read_returns_the_batch_tensors(index: int) -> None:
    batch, accessor, get = list(structures())[index]
    inputs, target = accessor.read(batch)
    assert inputs is get(batch)[0] and target is get(batch)[1]
    assert accessor.inputs(batch) is get(batch)[0]


TAKES_NEW = {1, 2}
"""The structures whose batches take new tensors (the list and the dict); the others are written into."""


@pytest.mark.parametrize("index", range(5))
def test_write_reaches_the_batch_and_leaves_a_list_or_dict_batch_s_own_tensor_as_it_was(index: int) -> None:
    batch, accessor, get = list(structures())[index]
    original = get(batch)[0]
    before = original.clone()
    new = torch.rand_like(original)
    accessor.write(batch, new)
    assert torch.equal(get(batch)[0], new)
    if index in TAKES_NEW:  # a new tensor at the key: the loader's (a view of its dataset?) is untouched
        assert get(batch)[0] is not original and torch.equal(original, before)
    else:  # a tuple or a callable's batch cannot take a new tensor: the same one, changed in place
        assert get(batch)[0] is original


@pytest.mark.parametrize("index", range(5))
def test_write_rows_reaches_the_batch(index: int) -> None:
    batch, accessor, get = list(structures())[index]
    given = get(batch)
    before_inputs, before_target = (t.clone() for t in given)
    rows = torch.tensor([4, 1])
    new_inputs = torch.full((2, 1, 3, 3), 0.5, dtype=torch.float64)  # cast to the batch dtype
    accessor.write_rows(batch, rows, new_inputs, torch.tensor([77, 88]))
    inputs, target = get(batch)
    if index in TAKES_NEW:
        assert torch.equal(given[0], before_inputs) and torch.equal(given[1], before_target)
    else:
        assert inputs is given[0] and target is given[1]
    assert inputs.dtype == torch.float32 and target.dtype == torch.long
    assert torch.equal(inputs[4], torch.full((1, 3, 3), 0.5)) and torch.equal(inputs[1], torch.full((1, 3, 3), 0.5))
    assert target[4] == 77 and target[1] == 88
    untouched = [0, 2, 3, 5]
    assert torch.equal(inputs[untouched], before_inputs[untouched])
    assert torch.equal(target[untouched], before_target[untouched])


def test_callable_returning_copies_is_refused_on_write() -> None:
    images, labels = make()
    batch = {"image": images, "label": labels}
    accessor = BatchAccessor(lambda b: (b["image"].clone(), b["label"]))
    inputs, _ = accessor.read(batch)  # reading copies is fine
    assert torch.equal(inputs, images)
    with pytest.raises(ValueError, match="batch_keys: the callable returns copies"):
        accessor.write(batch, torch.zeros_like(images))
    with pytest.raises(ValueError, match="batch_keys: the callable returns copies"):
        accessor.write_rows(batch, torch.tensor([0]), torch.zeros(1, 1, 3, 3), torch.tensor([1]))
    assert torch.equal(batch["image"], make()[0])  # nothing was written


def test_callable_returning_a_converted_copy_is_refused() -> None:
    images = (torch.rand(4, 1, 2, 2) * 255).to(torch.uint8)
    batch = (images, torch.arange(4))
    accessor = BatchAccessor(lambda b: (b[0].float() / 255, b[1]))
    with pytest.raises(ValueError, match="copies"):
        accessor.write(batch, torch.zeros(4, 1, 2, 2))


def test_callable_returning_views_can_write() -> None:
    images, labels = make()
    batch = {"image": images, "label": labels}
    accessor = BatchAccessor(lambda b: (b["image"][:, :, 1:], b["label"]))  # a view: same storage
    accessor.write(batch, torch.ones(6, 1, 2, 3))
    assert torch.equal(batch["image"][:, :, 1:], torch.ones(6, 1, 2, 3))
    assert torch.equal(batch["image"][:, :, 0], make()[0][:, :, 0])


def test_unreadable_dict_batch_names_batch_keys_and_lists_keys() -> None:
    images, labels = make()
    batch = {"img": images, "y": labels}
    with pytest.raises(ValueError, match=r"batch_keys: cannot read the inputs at key 0 .* keys \['img', 'y'\]"):
        BatchAccessor().read(batch)
    with pytest.raises(ValueError, match=r"batch_keys: cannot read the target at key 'label' .*\['img', 'y'\]"):
        BatchAccessor(("img", "label")).read(batch)
    with pytest.raises(ValueError, match=r"batch_keys.*\['img', 'y'\]"):
        BatchAccessor(("image", "label")).inputs(batch)


def test_unreadable_sequence_batches_name_batch_keys() -> None:
    images, labels = make()
    with pytest.raises(ValueError, match="batch_keys: cannot read the target at key 5 from a tuple batch of 2"):
        BatchAccessor((0, 5)).read((images, labels))
    with pytest.raises(ValueError, match="batch_keys: cannot read the inputs at key 'image' from a list batch"):
        BatchAccessor(("image", "label")).read([images, labels])


def test_wrong_contents_name_batch_keys() -> None:
    images, labels = make()
    with pytest.raises(ValueError, match="batch_keys: expected the inputs to be a tensor"):
        BatchAccessor().read(("a path", labels))
    with pytest.raises(ValueError, match=r"batch_keys: expected the target .* batch size 6, got \(5,\)"):
        BatchAccessor().read((images, labels[:5]))
    with pytest.raises(ValueError, match="batch_keys: expected the target"):
        BatchAccessor().read((images, ["cat"] * 6))
    with pytest.raises(ValueError, match="batch_keys: the callable must return"):
        BatchAccessor(lambda b: b[0]).read((images, labels))
    with pytest.raises(ValueError, match="batch_keys: the callable failed"):
        BatchAccessor(lambda b: (b.image, b.label)).read((images, labels))


def test_invalid_keys_name_batch_keys() -> None:
    for keys in [(0,), (0, 1, 2), "image", ([0], 1)]:
        with pytest.raises(ValueError, match="batch_keys"):
            BatchAccessor(keys)  # type: ignore[arg-type]


def test_write_shape_mismatch_is_refused() -> None:
    images, labels = make()
    with pytest.raises(ValueError, match="inputs: expected shape"):
        BatchAccessor().write((images, labels), torch.zeros(6, 1, 2, 2))
    with pytest.raises(ValueError, match="inputs: expected rows of shape"):
        BatchAccessor().write_rows((images, labels), torch.tensor([0]), torch.zeros(1, 2, 3, 3), torch.tensor([1]))


def test_bare_tensor_batch_is_its_own_inputs() -> None:
    images, _ = make()
    assert BatchAccessor().inputs(images) is images


def test_reading_a_bare_tensor_batch_is_refused() -> None:
    images, _ = make()  # (6, 1, 3, 3): batch[0] and batch[1] have equal shapes, so the checks pass
    with pytest.raises(ValueError, match="batch_keys"):
        BatchAccessor().read(images)


def test_a_reader_that_needs_keys_refuses_a_callable_and_offers_none_in_its_hints() -> None:
    images, labels = make()
    with pytest.raises(ValueError, match="batch_keys: expected \\(inputs key, target key\\), got a callable"):
        BatchAccessor(lambda b: (b[0], b[1]), allow_callable=False)
    batch = {"image": images, "label": labels}
    with pytest.raises(ValueError, match="at key 0 from a dict batch") as keys_only:
        BatchAccessor(allow_callable=False).read(batch)
    assert "callable" not in str(keys_only.value) and "('image', 'label')" in str(keys_only.value)
    with pytest.raises(ValueError, match="or a callable batch -> \\(inputs, target\\)"):
        BatchAccessor().read(batch)  # the general reader offers both


def test_a_loader_of_views_keeps_its_dataset_through_a_guide_and_a_replay() -> None:
    """``batch_size=None`` over pre-batched tensors hands out views: guided and replayed rows must not reach them."""
    from torch.utils.data import DataLoader, Dataset

    from dlguard.callbacks import FailureReplay

    images, labels = make(batch=16)
    labels %= 9  # a replayed row is the only 9
    kept = images.clone(), labels.clone()

    class Batches(Dataset):  # slices of one tensor, as a GPU-resident loader gives them
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int) -> dict:
            return {"image": images[8 * index : 8 * index + 8], "label": labels[8 * index : 8 * index + 8]}

    replay = FailureReplay(fraction=0.5, repeats=None, batch_keys=("image", "label"))
    replay.bank.add(torch.ones(4, 1, 3, 3), torch.full((4,), 9), origin="robustness")
    accessor = BatchAccessor(("image", "label"))
    for batch in DataLoader(Batches(), batch_size=None):
        assert batch["image"].untyped_storage().data_ptr() == images.untyped_storage().data_ptr()  # a view indeed
        accessor.write(batch, 1 - batch["image"])  # as a guide writes
        replay.on_train_batch_start(None, None, batch, 0)
        assert int((batch["label"] == 9).sum()) == 4  # the training step sees the replayed rows
    assert torch.equal(images, kept[0]) and torch.equal(labels, kept[1])
