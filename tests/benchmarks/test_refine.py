"""benchmarks/refine.py: the loops' last epochs train on the batches the augmentation underneath made."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import closed_loop as cl  # scripts beside the package, not part of it
import refine

from tests.benchmarks.test_closed_loop import setting  # noqa: F401  (the fixture)


def batch_through(trainer: cl.L.Trainer, epoch: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A batch of zeros through every callback in Lightning's order at ``epoch``, and what the noise made of it."""
    trainer.fit_loop.epoch_progress.current.completed = epoch  # trainer.current_epoch
    batch = [torch.zeros(20, 1, 28, 28), torch.zeros(20, dtype=torch.long)]
    torch.manual_seed(0)
    noised = trainer.callbacks[0].augment(batch[0].clone())  # the draws the Underneath below will make
    torch.manual_seed(0)
    for callback in trainer.callbacks:
        callback.on_train_batch_start(trainer, None, batch, 0)
    return batch, noised


def test_the_refined_epochs_train_on_what_the_noise_left_and_the_loops_still_draw(
    setting: cl.Setting,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cl, "ON", ["noise"])
    arm = refine.refined(cl.make_arm("metamorphic", setting, 0, {}), first_refined=1)
    trainer = cl.L.Trainer(
        callbacks=arm.callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        max_epochs=2,
    )  # as the benchmark makes it
    order = [type(c).__name__ for c in trainer.callbacks]  # in the order Lightning calls them
    assert order[:2] == ["Underneath", "Keep"] and order[-1] == "PutBack"
    replay = next(c for c in arm.callbacks if isinstance(c, cl.FailureReplay))
    replay.bank.add(torch.full((4, 1, 28, 28), 0.5), torch.full((4,), 7), "planted")

    batch, noised = batch_through(trainer, 0)  # before the refined epochs: the planted failures go in
    planted = (batch[1] == 7).sum()
    assert planted == replay.replayed == round(replay.fraction * 20) > 0
    assert not torch.equal(batch[0], noised)

    batch, noised = batch_through(trainer, 1)  # refined: the batch as the noise left it, labels too
    assert torch.equal(batch[0], noised) and (batch[1] == 0).all()
    assert replay.replayed == 2 * planted  # the replay still drew its rows: its stream goes on as unrefined


def test_the_library_call_s_noise_is_the_augmentation_underneath_the_refined_epochs_keep() -> None:
    """``--arms closed_loop_callbacks``: ``Keep`` after its ``GaussianNoise``; ``PutBack`` restores the noisy rows."""
    split = (torch.rand(20, 3, 32, 32), torch.arange(20) % 10)
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    arm = refine.refined(cl.make_arm(cl.LIBRARY, scenes, 0, {}), first_refined=1)
    order = [type(c).__name__ for c in arm.callbacks]
    assert order[:3] == ["GaussianNoise", "Keep", "DScoreCallback"] and order[-1] == "PutBack"
