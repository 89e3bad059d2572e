from __future__ import annotations

import pickle

import pytest
import torch

from dlguard.augment import (
    ErrorGuidedAugmentation,
    Property,
    default_properties,
    label_preserving_properties,
    proposal_from_rates,
    rates_with_prior,
)

from .conftest import HostSyncRecorder


def _add(x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    return x + level.view(-1, *([1] * (x.ndim - 1)))


def _add_tens(x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
    return x + 10 * level.view(-1, *([1] * (x.ndim - 1)))


def _counting_properties() -> list[Property]:
    """``a`` adds 1 or 2, ``b`` adds 10: the output of a zero input tells which were applied, at which level."""
    return [
        Property("a", _add, (1.0, 2.0), needs_images=False, value_range=None),
        Property("b", _add_tens, (1.0,), needs_images=False, value_range=None),
    ]


def test_the_recorder_sees_every_kind_of_sync(host_syncs: type[HostSyncRecorder]) -> None:
    x = torch.rand(6)
    with host_syncs() as syncs:
        _ = torch.where(x > 0.5, x.sum() + 1, x)
    assert syncs.calls == []
    for read in (
        lambda: x.max().item(),
        lambda: bool(x.min() > 0),
        lambda: int(x.argmax()),
        lambda: torch.nonzero(x > 0.5),
        lambda: x[x > 0.5],
        lambda: x.unique(),
        lambda: torch.equal(x, x),
    ):
        with host_syncs() as syncs:
            read()
        assert syncs.calls, read


@pytest.mark.parametrize("properties", [default_properties(), _counting_properties()], ids=["default", "counting"])
def test_no_host_sync_after_the_first_call(host_syncs: type[HostSyncRecorder], properties: list[Property]) -> None:
    torch.manual_seed(0)
    aug = ErrorGuidedAugmentation(properties=properties, rows_only=False)  # an accelerator's path
    aug.set_proposal(torch.full((10, len(properties)), 0.5))
    images, labels = torch.rand(32, 1, 16, 16), torch.randint(10, (32,))
    with host_syncs() as first:
        aug(images, labels)
    assert first.calls  # the first call after a new proposal checks labels and inputs
    for _ in range(3):  # training batches
        with host_syncs() as syncs:
            out = aug(torch.rand(32, 1, 16, 16), torch.randint(10, (32,)))
        assert syncs.calls == [], syncs.calls
        assert out.shape == (32, 1, 16, 16)


@pytest.mark.parametrize("strength", [0.1, 1.0])
def test_only_the_chosen_rows_give_the_whole_batch_s_images(strength: float) -> None:
    # the CPU's path (rows_only) against the accelerator's, on the same draws: a deterministic property
    # transforms a row the same alone or with its batch, fog and rain draw on the whole batch either way,
    # and the paths leave the global RNG alike
    properties = label_preserving_properties()
    proposal = torch.rand(3, len(properties), generator=torch.Generator().manual_seed(1))
    images, labels = torch.rand(40, 1, 12, 12), torch.arange(40) % 3
    before = images.clone()
    outs = []
    for rows_only in (True, False):
        aug = ErrorGuidedAugmentation(properties, strength=strength, rows_only=rows_only)
        aug.set_proposal(proposal)
        aug(images, labels)  # the checked call, on the whole batch either way
        torch.manual_seed(0)
        outs.append(aug(images, labels))
        outs.append(torch.rand(3))  # what the global RNG gives next
    torch.testing.assert_close(outs[0], outs[2])
    torch.testing.assert_close(outs[1], outs[3])
    assert torch.equal(images, before)  # the caller's batch is not written
    changed = (outs[0] != images).flatten(1).any(1).float().mean()
    assert 0 < float(changed) <= 1
    deterministic = [p for p in properties if p.deterministic]  # fog and rain draw on the whole batch
    aug = ErrorGuidedAugmentation(deterministic, rows_only=True)
    aug.set_proposal(torch.zeros(3, len(deterministic)))  # nothing chosen: the images themselves
    aug(images, labels)
    assert aug(images, labels) is images


def test_labels_and_inputs_are_checked_after_each_new_proposal() -> None:
    aug = ErrorGuidedAugmentation()
    aug.set_proposal(torch.full((3, 3), 0.5))
    images = torch.rand(4, 1, 8, 8)
    with pytest.raises(ValueError, match=r"labels: expected labels in \[0, 3\), got labels in \[0, 5\]"):
        aug(images, torch.tensor([0, 1, 2, 5]))
    with pytest.raises(ValueError, match=r"images: expected values in \[0, 1\]"):
        aug(images * 255, torch.tensor([0, 1, 2, 2]))
    rare = ErrorGuidedAugmentation(rows_only=True)
    rare.set_proposal(torch.zeros(3, 3))  # no row draws a property, yet the first call checks every input
    with pytest.raises(ValueError, match=r"images: expected values in \[0, 1\]"):
        rare(images * 255, torch.tensor([0, 1, 2, 2]))
    aug(images, torch.tensor([0, 1, 2, 2]))  # checked once; later batches are not read
    aug.set_proposal(torch.full((2, 3), 0.5))  # fewer classes: label 2 is out of range again
    with pytest.raises(ValueError, match=r"labels: expected labels in \[0, 2\)"):
        aug(images, torch.tensor([0, 1, 2, 2]))
    aug(images, torch.tensor([0, 1, 1, 0]))
    aug.load_state_dict({"proposal": torch.full((1, 3), 0.5)})  # a loaded proposal is a new one too
    with pytest.raises(ValueError, match=r"labels: expected labels in \[0, 1\)"):
        aug(images, torch.tensor([0, 1, 1, 0]))
    with pytest.raises(ValueError, match=r"labels: expected shape \(4,\)"):
        aug(images, torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_each_property_is_applied_as_often_as_the_proposal_says(strength: float) -> None:
    aug = ErrorGuidedAugmentation(properties=_counting_properties(), strength=strength)
    aug.set_proposal([[0.2, 0.7], [0.9, 0.0], [0.0, 0.4]])
    proposal = strength * torch.tensor([[0.2, 0.7], [0.9, 0.0], [0.0, 0.4]])  # what is applied
    per_class = 4000
    labels = torch.arange(3).repeat_interleave(per_class)
    torch.manual_seed(0)
    first = aug(torch.zeros(len(labels), 1), labels)  # the checked call
    out = torch.cat([first, aug(torch.zeros(len(labels), 1), labels)]).flatten()
    labels = labels.repeat(2)
    b = out >= 10
    a_level = out - 10 * b
    for c in range(3):
        rows = labels == c
        n = int(rows.sum())
        for applied, p in ((a_level[rows] > 0, proposal[c, 0]), (b[rows], proposal[c, 1])):
            tolerance = 4 * (float(p * (1 - p)) / n) ** 0.5 + 1e-9
            assert float(applied.float().mean()) == pytest.approx(float(p), abs=tolerance)
        both = ((a_level[rows] > 0) & b[rows]).float().mean()  # drawn independently per property
        assert float(both) == pytest.approx(float(proposal[c, 0] * proposal[c, 1]), abs=0.015)
    levels = a_level[a_level > 0]  # severities uniform over the property's levels
    assert set(levels.unique().tolist()) == {1.0, 2.0}
    assert float((levels == 2).float().mean()) == pytest.approx(0.5, abs=0.02)


def test_no_proposal_leaves_images_unchanged_and_proposal_follows_the_module() -> None:
    aug = ErrorGuidedAugmentation(properties=_counting_properties())
    images = torch.rand(3, 1, 4, 4)
    assert aug(images, torch.zeros(3, dtype=torch.long)) is images
    aug.set_proposal([[1.0, 0.0]])
    aug.double()
    assert aug.proposal.dtype == torch.float64
    aug.to("meta")
    assert aug.proposal.device.type == "meta" and aug.level_table.device.type == "meta"
    aug.set_proposal([[1.0, 1.0]])
    assert aug.proposal.device.type == "meta"
    assert list(aug.state_dict()) == ["proposal"]  # the level tables are rebuilt, not checkpointed


def test_state_dict_round_trip_into_a_fresh_module() -> None:
    aug = ErrorGuidedAugmentation(properties=_counting_properties(), strength=1.0)
    aug.set_proposal([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    fresh = ErrorGuidedAugmentation(properties=_counting_properties(), strength=1.0)
    fresh.load_state_dict(aug.state_dict())
    torch.testing.assert_close(fresh.proposal, aug.proposal)
    out = fresh(torch.zeros(2, 1), torch.tensor([0, 1])).flatten()
    assert out[0] in (1.0, 2.0) and out[1] == 10.0


def test_pickles_and_still_works() -> None:
    aug = ErrorGuidedAugmentation()
    aug.set_proposal(torch.full((2, 3), 0.5))
    images, labels = torch.rand(8, 1, 12, 12), torch.tensor([0, 1] * 4)
    copy = pickle.loads(pickle.dumps(aug))
    assert [p.name for p in copy.properties] == ["noise", "rotation", "brightness"]
    torch.manual_seed(3)
    expected = aug(images, labels)
    torch.manual_seed(3)
    torch.testing.assert_close(copy(images, labels), expected)
    assert not torch.equal(expected, images)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="properties: expected at least one Property"):
        ErrorGuidedAugmentation(properties=[])
    with pytest.raises(ValueError, match="strength"):
        ErrorGuidedAugmentation(strength=1.5)
    with pytest.raises(ValueError, match="rows_only: expected True, False or None, got 1"):
        ErrorGuidedAugmentation(rows_only=1)  # type: ignore[arg-type]
    aug = ErrorGuidedAugmentation()
    with pytest.raises(ValueError, match=r"proposal: expected \(classes, 3\)"):
        aug.set_proposal([[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"proposal: expected probabilities in \[0, 1\]"):
        aug.set_proposal([[0.5, 0.5, 1.5]])


def test_a_proposal_from_rates_gives_the_weakest_cell_one_and_the_others_their_share_of_it() -> None:
    rates = torch.tensor([[0.0, 0.3, 0.05], [0.6, 0.15, 0.0]], dtype=torch.float64)
    expected = [[0.0, 0.5, 1 / 12], [1.0, 0.25, 0.0]]  # each cell over the largest rate, 0.6
    assert torch.allclose(proposal_from_rates(rates), torch.tensor(expected, dtype=torch.float64))
    assert proposal_from_rates(rates).dtype == torch.float64
    assert proposal_from_rates(torch.zeros(3, 2)).tolist() == [[0.0, 0.0]] * 3  # nothing failed: nothing to apply
    assert proposal_from_rates(torch.zeros(0, 2)).shape == (0, 2)
    for bad, message in [
        (torch.ones(3), "rates: expected a \\(classes, properties\\) tensor"),
        ([[0.1, 0.2]], "rates: expected a \\(classes, properties\\) tensor"),
        (torch.tensor([[0.1, float("nan")]]), "rates: expected non-negative"),
        (torch.tensor([[0.1, -0.2]]), "rates: expected non-negative"),
    ]:
        with pytest.raises(ValueError, match=message):
            proposal_from_rates(bad)  # type: ignore[arg-type]


def test_rates_with_prior_tops_a_short_class_up_at_the_pooled_rate() -> None:
    rates = torch.tensor([[0.5, 0.0], [0.25, 1.0], [float("nan"), float("nan")]], dtype=torch.float64)
    counts = torch.tensor([4, 2, 0])  # class 2 absent: no input qualified
    # pooled by hand: (4 x 0.5 + 2 x 0.25) / 6 = 5/12 and (0 + 2 x 1) / 6 = 1/3
    expected = [[0.5, 0.0], [(0.5 + 2 * 5 / 12) / 4, (2 + 2 / 3) / 4], [5 / 12, 1 / 3]]
    assert torch.allclose(rates_with_prior(rates, counts, 4), torch.tensor(expected, dtype=torch.float64))
    at_two = torch.tensor([[0.5, 0.0], [0.25, 1.0], [5 / 12, 1 / 3]], dtype=torch.float64)  # class 1 is full
    assert torch.allclose(rates_with_prior(rates, counts, 2), at_two)
    assert rates_with_prior(rates, counts, 0)[2].tolist() == pytest.approx([5 / 12, 1 / 3])  # none wanted, none held
    assert rates_with_prior(torch.zeros(3, 2), torch.zeros(3), 4).tolist() == [[0.0, 0.0]] * 3  # nothing measured
    for bad, message in [
        ((torch.ones(3), counts, 4), "rates: expected a \\(classes, properties\\)"),
        ((rates, torch.tensor([4, 2]), 4), "counts: expected one count per class \\(3,\\) or per cell \\(3, 2\\)"),
        ((rates, torch.tensor([4, -1, 0]), 4), "counts: expected whole, non-negative input counts"),
        ((rates, torch.tensor([4.0, 1.5, 0.0]), 4), "counts: expected whole, non-negative input counts"),
        ((rates, counts, -1), "wanted: expected whole, non-negative"),
        ((rates.nan_to_num(0.0) - 0.5, counts, 4), "rates: expected non-negative failure rates without NaN where"),
        ((torch.tensor([[0.5, 0.0], [float("nan"), 1.0], [0.0, 0.0]]), counts, 4), "rates: expected non-negative"),
    ]:
        with pytest.raises(ValueError, match=message):
            rates_with_prior(*bad)


def test_one_pseudo_input_each_is_the_metamorphic_shrinkage_written_out() -> None:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.tensor([3.0, 0.0, 1.0, 5.0], dtype=torch.float64)
    levels = torch.tensor([2.0, 5.0], dtype=torch.float64)
    violations = torch.floor(torch.rand(4, 2, generator=generator, dtype=torch.float64) * inputs[:, None] * levels)
    overall = violations.sum(0) / (inputs.sum() * levels)  # each property's rate over every source and level
    reference = (violations + overall * levels) / ((inputs[:, None] + 1) * levels)
    rates = violations / (inputs[:, None] * levels).clamp(min=1)
    assert torch.allclose(rates_with_prior(rates, inputs, inputs + 1), reference)
