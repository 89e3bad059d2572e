"""MetamorphicCallback's guide: each class's violation rate under each property, shrunk and scaled, sets an
ErrorGuidedAugmentation, against a loop written out one input at a time; checkpointed; two processes agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import Tensor

from dlguard.augment import (
    ErrorGuidedAugmentation,
    Property,
    ScoreGuidedPadding,
    deeptest_properties,
    label_preserving_properties,
)
from dlguard.callbacks import MetamorphicCallback
from dlguard.callbacks.metamorphic import _violation_proposal
from dlguard.data import MNISTDataModule
from dlguard.zoo import ClassifierModule, pretrained
from tests.callbacks.projects import DigitDicts, NormalizedDigits, normalize
from tests.quick import quick_trainer, run_on_two_processes


def chosen(*names: str) -> list[Property]:
    return [p for p in deeptest_properties() if p.name in names]


def reference_proposal(
    net: torch.nn.Module, inputs: Tensor, labels: Tensor, keys: Tensor, properties: list[Property], classes: int
) -> list[list[float]]:
    """Flips counted per input and level; each class pulled towards the property's rate by one pseudo-input."""
    with torch.no_grad():
        source = net(inputs).argmax(1)
        flips = {
            p.name: [[int(f) for f in net(p(inputs, level, keys)).argmax(1) != source] for level in p.levels]
            for p in properties
        }
    table = []
    for c in range(classes):
        members = [i for i in range(len(labels)) if int(labels[i]) == c]
        row = []
        for p in properties:
            every = sum(sum(level) for level in flips[p.name]) / (len(labels) * len(p.levels))
            mine = sum(flips[p.name][level][i] for level in range(len(p.levels)) for i in members)
            row.append((mine + every * len(p.levels)) / ((len(members) + 1) * len(p.levels)))
        table.append(row)
    top = max(max(row) for row in table)
    return [[v / top for v in row] for row in table]


def test_the_guide_takes_each_class_s_violation_rates(tmp_path: Path) -> None:
    properties = chosen("rotation", "fog")
    guide = ErrorGuidedAugmentation(properties)
    callback = MetamorphicCallback(properties=properties, budget=None, probe_size=8, guide=guide)
    assert not callback._guide_ready()
    module = ClassifierModule(pretrained("mnist_a"))
    trainer = quick_trainer(tmp_path, [callback], val_batches=2)
    logged = trainer.validate(module, datamodule=MNISTDataModule(batch_size=50), verbose=False)[0]
    probe = callback.probe_set()
    assert len(set(probe.target.tolist())) < 10  # 8 inputs: classes without one get the rate of all
    expected = reference_proposal(module.net, probe.inputs, probe.target, probe.keys, properties, 10)
    torch.testing.assert_close(torch.tensor(callback.proposal), torch.tensor(expected), rtol=0, atol=1e-9)
    torch.testing.assert_close(guide.proposal, torch.tensor(expected, dtype=torch.float32))
    assert max(max(row) for row in callback.proposal) == 1.0
    assert callback._guide_ready()
    # what the guide now applies, logged: half strength times the mean of the table written out by hand above
    mean = sum(sum(row) for row in expected) / (len(expected) * len(expected[0]))
    assert logged["metamorphic/guide_p"] == pytest.approx(0.5 * mean, abs=1e-6)


def test_the_proposal_is_checkpointed_into_a_fresh_guide(tmp_path: Path) -> None:
    properties = chosen("rotation", "brightness")
    callback = MetamorphicCallback(
        properties=properties, budget=None, probe_size=30, guide=ErrorGuidedAugmentation(properties)
    )
    module = ClassifierModule(pretrained("mnist_a"))
    quick_trainer(tmp_path, [callback], val_batches=1).validate(module, datamodule=MNISTDataModule(batch_size=30))
    fresh_guide = ErrorGuidedAugmentation(properties)
    fresh = MetamorphicCallback(properties=properties, budget=None, probe_size=30, guide=fresh_guide)
    saved = tmp_path / "callback.pt"
    torch.save(callback.state_dict(), saved)
    fresh.load_state_dict(torch.load(saved, weights_only=False))
    assert fresh.proposal == callback.proposal and fresh.proposal is not callback.proposal and fresh._guide_ready()
    torch.testing.assert_close(fresh_guide.proposal, torch.tensor(callback.proposal, dtype=torch.float32))


def test_no_violation_leaves_an_all_zero_proposal() -> None:
    logits = torch.eye(3)
    fog = chosen("fog")
    proposal = _violation_proposal(
        logits, {"fog": logits.expand(len(fog[0].levels), 3, 3)}, torch.tensor([1, 1, 2]), fog
    )
    assert proposal == [[0.0]] * 3  # the first input is read wrong, alike at every level: not a violation


def _shards(rank: int, world: int) -> list[list[float]]:
    outputs, transformed, target = _sources()
    rows = slice(rank, None, world)  # each process its own rows
    return _violation_proposal(outputs[rows], {"fog": transformed[:, rows]}, target[rows], chosen("fog"))


def _sources() -> tuple[Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(0)
    outputs = torch.randn(9, 4, generator=generator)
    return outputs, torch.randn(len(chosen("fog")[0].levels), 9, 4, generator=generator), torch.arange(9) % 3


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_propose_what_one_process_proposes(tmp_path: Path) -> None:
    outputs, transformed, target = _sources()
    whole = _violation_proposal(outputs, {"fog": transformed}, target, chosen("fog"))
    shared = run_on_two_processes(_shards, tmp_path)
    torch.testing.assert_close(torch.tensor(shared), torch.tensor(whole), rtol=0, atol=1e-12)
    assert len(whole) == 4 and max(max(row) for row in whole) == 1.0  # 4 logit columns: 4 classes, one absent


def test_a_guide_the_relation_cannot_drive_is_refused() -> None:
    properties = label_preserving_properties()
    with pytest.raises(ValueError, match="guide: expected an ErrorGuidedAugmentation or None, got ScoreGuidedPadding"):
        MetamorphicCallback(guide=ScoreGuidedPadding())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="guide: needs task='classification'"):
        MetamorphicCallback(task="regression", guide=ErrorGuidedAugmentation(properties))
    with pytest.raises(ValueError, match=r"guide: its properties \['noise', 'rotation', 'brightness'\] must be"):
        MetamorphicCallback(guide=ErrorGuidedAugmentation())


class _Seen(L.Callback):
    """Records what the training step gets, after the callbacks before it have changed the batch."""

    def __init__(self) -> None:
        self.images: dict[tuple[int, int], Tensor] = {}
        self.labels: dict[tuple[int, int], Tensor] = {}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        self.images[trainer.current_epoch, idx] = batch["image"].clone()
        self.labels[trainer.current_epoch, idx] = batch["label"].clone()


def test_in_a_user_s_project_the_guide_reads_what_the_model_sees_and_augments_dict_batches(tmp_path: Path) -> None:
    """Normalised input (``preprocess``), dict outputs, dict batches: the proposal is the pixel network's."""
    properties = chosen("rotation", "fog")
    guide = ErrorGuidedAugmentation(properties, strength=1.0)
    callback = MetamorphicCallback(
        properties=properties, budget=None, probe_size=20, guide=guide,
        preprocess=normalize, output_transform=lambda out: out["logits"], batch_keys=("image", "label"),
    )  # fmt: skip
    seen = _Seen()
    module, datamodule = NormalizedDigits(output_dict=True, lr=0.0), DigitDicts()
    trainer = quick_trainer(tmp_path, [callback, seen], epochs=2, train_batches=2, val_batches=2)
    trainer.fit(module, datamodule=datamodule)
    probe = callback.probe_set()
    pixel_model = module.backbone[1]  # the same network taking pixels
    expected = reference_proposal(pixel_model, probe.inputs, probe.target, probe.keys, properties, 10)
    torch.testing.assert_close(torch.tensor(callback.proposal), torch.tensor(expected), rtol=0, atol=1e-6)
    # epoch 0 trained on the loader's digits; epoch 1 on the guide's transformations of them, labels untouched
    for idx in range(2):
        assert torch.equal(seen.labels[1, idx], seen.labels[0, idx])
    changed = torch.cat([(seen.images[1, i] != seen.images[0, i]).flatten(1).any(1) for i in range(2)])
    untouched = torch.stack([datamodule._mnist.train_set[i][0] for i in range(100)])
    assert torch.equal(torch.cat([seen.images[0, i] for i in range(2)]), untouched)
    assert 0 < int(changed.sum()) < 100  # some rows drew a transformation, not all
