"""The contract every callback keeps, tried with bad input as a user would: clear errors before any work.

Each case failed before the callbacks shared one base that checks the first evaluation batch: a model
whose output is not logits was refused only after training had started, coverage read dict batches
only when it profiled, NaN inputs surfaced at the end of the pass, an empty validation set passed
without a word, and some messages named the wrong argument.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch import Tensor, nn

from dlguard.augment import Property, deeptest_properties, default_properties
from dlguard.callbacks import (
    DScoreCallback,
    MetamorphicCallback,
    NeuronCoverageCallback,
    ObjectRelevancyCallback,
    ProbeCallback,
    RobustnessCallback,
)
from dlguard.data import MNISTDataModule
from dlguard.generate import dscore_test, robustness_sweep
from dlguard.zoo import ClassifierModule, pretrained
from tests.callbacks.projects import DigitDicts, NormalizedDigits, normalize
from tests.probes.fingerprint import assert_unchanged, fingerprint
from tests.quick import quick_trainer

KEYS = ("image", "label")


class Steps(L.Callback):
    """Counts the training steps that ran before an error stopped the fit."""

    def __init__(self) -> None:
        self.steps = 0

    def on_train_batch_end(self, *args: object) -> None:
        self.steps += 1


class DigitRegressor(L.LightningModule):
    """A model returning one number per input (B,) -- the digit as a value: a regression model, not logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)[:, 0]

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        return nn.functional.mse_loss(self(batch[0]), batch[1].float())

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self.log("val_mse", nn.functional.mse_loss(self(batch[0]), batch[1].float()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize(
    "make",
    [
        lambda: DScoreCallback(n=2, probe_size=20, preprocess=normalize, batch_keys=KEYS),
        lambda: RobustnessCallback(per_class=2, pairs=10, preprocess=normalize, batch_keys=KEYS),
        lambda: MetamorphicCallback(
            properties=deeptest_properties()[:1], probe_size=20, preprocess=normalize, batch_keys=KEYS
        ),
    ],
)
def test_outputs_that_are_not_logits_fail_in_the_sanity_check_before_training(tmp_path: Path, make) -> None:
    steps = Steps()
    trainer = quick_trainer(tmp_path, [make(), steps], train_batches=2, val_batches=2, num_sanity_val_steps=1)
    module = NormalizedDigits(output_dict=True).train()
    before = fingerprint(module)
    with pytest.raises(ValueError, match="output_transform"):
        trainer.fit(module, datamodule=DigitDicts())
    assert steps.steps == 0  # refused at the sanity check's first batch, not after training steps
    module.train()
    assert_unchanged(module, before)


def test_a_regression_shaped_output_fails_at_the_first_batch_naming_what_to_pass(tmp_path: Path) -> None:
    steps = Steps()
    trainer = quick_trainer(tmp_path, [RobustnessCallback(per_class=2), steps], num_sanity_val_steps=1)
    with pytest.raises(ValueError, match=r"model output \(after output_transform\): expected class logits \(B, K\)"):
        trainer.fit(DigitRegressor(), datamodule=MNISTDataModule(batch_size=50))
    assert steps.steps == 0


def test_num_classes_that_is_not_the_logits_width_is_named_at_the_first_batch(tmp_path: Path) -> None:
    for callback in (DScoreCallback(n=2, num_classes=5), RobustnessCallback(per_class=2, num_classes=5)):
        trainer = quick_trainer(tmp_path, [callback], num_sanity_val_steps=1)
        with pytest.raises(ValueError, match="num_classes: is 5 but the model's outputs have 10 classes"):
            trainer.fit(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50))


def test_generators_name_num_classes_and_an_empty_probe_set() -> None:
    net = pretrained("mnist_a")
    images, labels = torch.rand(8, 1, 28, 28), torch.arange(8)
    with pytest.raises(ValueError, match="num_classes: is 5 but the model's outputs have 10 classes"):
        dscore_test(net, images, labels, n=2, num_classes=5)
    with pytest.raises(ValueError, match="num_classes: is 5 but the model's outputs have 10 classes"):
        robustness_sweep(net, images, labels, default_properties()[:1], num_classes=5)
    with pytest.raises(ValueError, match="images: none on any process; the test needs at least one"):
        dscore_test(net, images[:0], labels[:0], n=2)


def test_coverage_takes_every_base_argument_and_reads_dict_batches_at_the_first_batch(tmp_path: Path) -> None:
    coverage = NeuronCoverageCallback(output_transform=lambda out: out["logits"], max_profile_batches=1)
    assert coverage.output_transform is not None  # accepted like every callback's (README's table)
    steps = Steps()
    trainer = quick_trainer(tmp_path, [coverage, steps], train_batches=2, num_sanity_val_steps=1)
    with pytest.raises(ValueError, match=r"batch_keys: cannot read the inputs at key 0 .* keys \['image', 'label'\]"):
        trainer.fit(NormalizedDigits(output_dict=True), datamodule=DigitDicts())
    assert steps.steps == 0 and coverage.ranges is None  # before training and before profiling


class NaNInBatch(MNISTDataModule):
    """MNIST whose second validation batch holds a NaN pixel."""

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        class Poisoned(torch.utils.data.Dataset):
            def __init__(self, base: torch.utils.data.Dataset) -> None:
                self.base = base

            def __len__(self) -> int:
                return len(self.base)

            def __getitem__(self, index: int) -> tuple[Tensor, int]:
                image, label = self.base[index]
                if index == 60:
                    image = image.clone()
                    image[0, 0, 0] = float("nan")
                return image, label

        return torch.utils.data.DataLoader(Poisoned(self.val_set), batch_size=50)


def test_nan_inputs_reach_coverage_and_fail_at_their_batch_naming_the_inputs(tmp_path: Path) -> None:
    trainer = quick_trainer(tmp_path, [NeuronCoverageCallback(criteria=["nc"])], val_batches=3)
    with pytest.raises(ValueError, match=r"inputs \(evaluation loader 0, batch 1\): contains NaN"):
        trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=NaNInBatch(), verbose=False)


class EmptyValidation(MNISTDataModule):
    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.utils.data.Subset(self.val_set, []), batch_size=50)


def test_an_empty_validation_set_is_reported_by_every_callback(tmp_path: Path) -> None:
    callbacks = [
        DScoreCallback(n=2, probe_size=10),
        RobustnessCallback(per_class=2),
        NeuronCoverageCallback(criteria=["nc"]),
        MetamorphicCallback(properties=deeptest_properties()[:1], probe_size=10),
        ObjectRelevancyCallback(masks=lambda x: x[:, 0] > 0.3, probe_size=10),
    ]
    trainer = quick_trainer(tmp_path, list(callbacks), epochs=2, train_batches=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(ClassifierModule(pretrained("mnist_a")), datamodule=EmptyValidation(batch_size=50))
    said = [str(w.message) for w in caught if "measured nothing in this fit" in str(w.message)]
    assert sorted(text.split(":")[0] for text in said) == sorted(type(c).__name__ for c in callbacks)
    assert all("2 validation epoch(s) were scheduled" in text and "[0] batch(es)" in text for text in said)
    assert all(c.history == [] for c in callbacks)


def _uses_global_rng(images: Tensor, level: Tensor) -> Tensor:
    return (images + level.view(-1, 1, 1, 1) * torch.randn_like(images)).clamp(0, 1)


@pytest.mark.parametrize("make", [
    lambda props: RobustnessCallback(properties=props),
    lambda props: MetamorphicCallback(properties=props),
])  # fmt: skip
def test_an_unkeyed_random_property_is_named_at_set_up_under_ddp(make) -> None:
    own = Property("jitter", _uses_global_rng, (0.1, 0.2))  # neither keyed nor deterministic
    callback: ProbeCallback = make([*default_properties(), own])
    with pytest.warns(UserWarning, match=r"properties \['jitter'\] are not keyed.*2 processes report other numbers"):
        callback._warn_if_drawn_globally(SimpleNamespace(world_size=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        callback._warn_if_drawn_globally(SimpleNamespace(world_size=1))  # one process: nothing to say
        make(default_properties())._warn_if_drawn_globally(SimpleNamespace(world_size=2))  # built-ins are fine
        make(deeptest_properties())._warn_if_drawn_globally(SimpleNamespace(world_size=2))
