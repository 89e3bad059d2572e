from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from dlguard.data import MNISTDataModule
from dlguard.zoo import ClassifierModule, cifar_cnn, mnist_a, mnist_b, pretrained
from dlguard.zoo.pretrained import WEIGHTS_DIR

# The D-Score paper's Table I: (out channels, kernel) of each conv, then the FC widths.
TABLE_I = {
    mnist_a: ([(6, 5), (16, 5)], [120, 84, 10]),
    mnist_b: ([(32, 3), (32, 3), (64, 3), (64, 3)], [200, 10]),
    cifar_cnn: ([(64, 3), (64, 3), (128, 3), (128, 3)], [256, 256, 10]),
}


@pytest.mark.parametrize("architecture", list(TABLE_I))
def test_structure_follows_table_i(architecture) -> None:
    net = architecture()
    convs, fcs = TABLE_I[architecture]
    assert [(m.out_channels, m.kernel_size[0]) for m in net.modules() if isinstance(m, nn.Conv2d)] == convs
    assert [m.out_features for m in net.modules() if isinstance(m, nn.Linear)] == fcs
    assert sum(isinstance(m, nn.MaxPool2d) for m in net.modules()) == 2
    assert not any(isinstance(m, nn.Softmax | nn.LogSoftmax) for m in net.modules())  # logits


@pytest.mark.parametrize(
    ("architecture", "shape"),
    [(mnist_a, (1, 28, 28)), (mnist_b, (1, 28, 28)), (cifar_cnn, (3, 32, 32))],
)
def test_output_is_logits_of_shape_b_by_k(architecture, shape) -> None:
    logits = architecture()(torch.rand(3, *shape))
    assert logits.shape == (3, 10)
    assert not torch.allclose(logits.sum(dim=1), torch.ones(3))


def test_input_size_and_classes_are_configurable() -> None:
    assert mnist_a(input_size=32)(torch.rand(2, 1, 32, 32)).shape == (2, 10)
    assert mnist_b(num_classes=3, in_channels=3)(torch.rand(2, 3, 28, 28)).shape == (2, 3)
    with pytest.raises(ValueError, match="input_size: too small"):
        mnist_b(input_size=10)
    with pytest.raises(ValueError, match="num_classes"):
        mnist_a(num_classes=1)


@pytest.fixture(scope="module")
def val_loader() -> DataLoader:
    dm = MNISTDataModule(batch_size=250)
    dm.setup()
    return dm.val_dataloader()


@pytest.mark.parametrize(("name", "floor"), [("mnist_a", 0.94), ("mnist_b", 0.96)])
def test_pretrained_weights_are_small_and_accurate(name: str, floor: float, val_loader: DataLoader) -> None:
    assert (WEIGHTS_DIR / f"{name}.pt").stat().st_size < 1_000_000
    net = pretrained(name)
    assert not net.training and next(net.parameters()).dtype == torch.float32
    with torch.no_grad():
        correct = sum((net(x).argmax(1) == y).sum().item() for x, y in val_loader)
    assert correct / 1000 >= floor
    untrained = mnist_a() if name == "mnist_a" else mnist_b()
    with torch.no_grad():
        chance = sum((untrained(x).argmax(1) == y).sum().item() for x, y in val_loader)
    assert chance / 1000 < 0.5  # the check above can fail


def test_pretrained_unknown_name_lists_available() -> None:
    available = r"available: \['mnist_a', 'mnist_b', 'road_epoch', 'scene_digits', 'vae_mnist'\]"
    with pytest.raises(ValueError, match=r"unknown pretrained model 'lenet'; " + available):
        pretrained("lenet")


def test_classifier_module_logs_val_acc_that_matches_a_manual_count(tmp_path) -> None:
    dm = MNISTDataModule(batch_size=50)
    dm.setup()
    dm.val_set = Subset(dm.val_set, range(0, 1000, 5))  # the sample is ordered by class
    L.seed_everything(0, verbose=False)
    module = ClassifierModule(mnist_a(), num_classes=10, lr=1e-3)
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=40,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=dm)
    assert "train_loss_epoch" in trainer.callback_metrics
    logged = trainer.validate(module, datamodule=dm, verbose=False)[0]
    with torch.no_grad():
        batches = [(module(x).argmax(1) == y) for x, y in dm.val_dataloader()]
    manual = torch.cat(batches).float().mean().item()
    assert logged["val_acc"] == pytest.approx(manual)
    assert 0.2 < manual < 1.0 and "val_loss" in logged


def test_classifier_module_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        ClassifierModule(mnist_a(), num_classes=1)
    with pytest.raises(ValueError, match="lr"):
        ClassifierModule(mnist_a(), lr=0)
