from __future__ import annotations

import pickle

import pytest
import torch

from dlguard.data.failure_bank import FailureBank


def rows(labels: list[int], shape: tuple[int, ...] = (1, 2, 2)) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs that carry their label in every element, so input/label pairs can be checked."""
    labels_t = torch.tensor(labels)
    return labels_t.float().reshape(-1, *([1] * len(shape))).expand(-1, *shape).clone(), labels_t


def assert_pairs_consistent(inputs: torch.Tensor, labels: torch.Tensor) -> None:
    assert torch.equal(inputs.flatten(1), labels.float().reshape(-1, 1).expand_as(inputs.flatten(1)))


def test_capacity_and_fifo_per_origin() -> None:
    bank = FailureBank(capacity=5)
    bank.add(*rows([1, 2, 3]), origin="a")
    bank.add(*rows([4, 5, 6, 7]), origin="a")  # 7 rows for 5 places: 1 and 2 make room
    bank.add(*rows([50, 51]), origin="b")
    assert bank.labels("a").tolist() == [3, 4, 5, 6, 7]
    assert_pairs_consistent(bank.inputs("a"), bank.labels("a"))
    assert bank.labels("b").tolist() == [50, 51]
    assert bank.origins() == {"a": 5, "b": 2} and len(bank) == 7
    bank.add(*rows([8]), origin="a")
    assert bank.labels("a").tolist() == [4, 5, 6, 7, 8]
    assert bank.sample_shape == (1, 2, 2)


def test_deposits_are_copies() -> None:
    bank = FailureBank(capacity=4)
    inputs, labels = rows([1, 2])
    bank.add(inputs, labels, origin="a")
    inputs.zero_()
    labels.zero_()
    assert bank.labels("a").tolist() == [1, 2]
    assert_pairs_consistent(bank.inputs("a"), bank.labels("a"))


def test_oversized_deposit_keeps_a_uniform_subset() -> None:
    counts = torch.zeros(12)
    for seed in range(300):
        bank = FailureBank(capacity=4, seed=seed)
        bank.add(*rows([90, 91]), origin="a")
        bank.add(*rows(list(range(12))), origin="a")  # larger than the bank: the old rows go too
        kept = bank.labels("a")
        assert len(kept) == 4 and len(set(kept.tolist())) == 4 and int(kept.max()) < 12
        assert_pairs_consistent(bank.inputs("a"), kept)
        counts[kept] += 1
    # each row kept with probability 4/12: 100 of 300, binomial sd ~8.2
    assert float(counts.sum()) == 1200
    assert float(counts.min()) > 70 and float(counts.max()) < 130


def test_subsampling_is_fixed_by_the_seed() -> None:
    picks = []
    for seed in (0, 0, 1):
        bank = FailureBank(capacity=3, seed=seed)
        bank.add(*rows(list(range(20))), origin="a")
        picks.append(bank.labels("a").tolist())
    assert picks[0] == picks[1] and picks[0] != picks[2]


def test_shape_and_argument_errors() -> None:
    bank = FailureBank(capacity=4)
    bank.add(*rows([1]), origin="a")
    with pytest.raises(ValueError, match=r"inputs: expected rows of shape \(1, 2, 2\).*got \(1, 3, 3\)"):
        bank.add(*rows([2], shape=(1, 3, 3)), origin="b")
    with pytest.raises(ValueError, match="labels: expected 2 labels for 2 inputs, got 1"):
        bank.add(rows([1, 2])[0], torch.tensor([1]), origin="a")
    with pytest.raises(ValueError, match="origin"):
        bank.add(*rows([1]), origin="")
    with pytest.raises(ValueError, match="labels"):
        bank.add(rows([1])[0], [1], origin="a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capacity"):
        FailureBank(capacity=0)
    assert bank.labels("a").tolist() == [1] and "b" not in bank.origins()


def test_empty_deposit_changes_nothing() -> None:
    bank = FailureBank(capacity=4)
    bank.add(torch.zeros(0, 1, 2, 2), torch.zeros(0, dtype=torch.long), origin="a")
    assert len(bank) == 0 and bank.origins() == {} and bank.sample_shape is None


def test_sample_counts_device_and_pairs() -> None:
    bank = FailureBank(capacity=10)
    bank.add(*rows([1, 2, 3]), origin="a")
    bank.add(*rows([10, 11, 12, 13, 14, 15]), origin="b")
    bank.add(*rows([20]), origin="c")
    gen = torch.Generator().manual_seed(0)
    inputs, labels = bank.sample(5000, gen)
    assert inputs.shape == (5000, 1, 2, 2) and labels.shape == (5000,)
    assert_pairs_consistent(inputs, labels)
    # uniform over the 10 stored rows, whatever their origin: 500 each, sd ~21
    counts = torch.bincount(labels, minlength=21)
    stored = [1, 2, 3, 10, 11, 12, 13, 14, 15, 20]
    assert int(counts[stored].sum()) == 5000
    assert all(400 < int(counts[k]) < 600 for k in stored)
    meta_inputs, meta_labels = bank.sample(7, torch.Generator().manual_seed(1), device="meta")
    assert meta_inputs.device.type == "meta" and meta_labels.device.type == "meta"
    assert meta_inputs.shape == (7, 1, 2, 2) and meta_labels.shape == (7,)


def test_sample_is_fixed_by_the_generator() -> None:
    bank = FailureBank(capacity=10)
    bank.add(*rows(list(range(8))), origin="a")
    bank.add(*rows([40, 41]), origin="b")
    first = bank.sample(20, torch.Generator().manual_seed(3))[1]
    again = bank.sample(20, torch.Generator().manual_seed(3))[1]
    other = bank.sample(20, torch.Generator().manual_seed(4))[1]
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_sample_errors() -> None:
    bank = FailureBank()
    with pytest.raises(ValueError, match="empty"):
        bank.sample(3, torch.Generator())
    bank.add(*rows([1]), origin="a")
    with pytest.raises(ValueError, match="count"):
        bank.sample(0, torch.Generator())


def test_clear() -> None:
    bank = FailureBank(capacity=4)
    bank.add(*rows([1]), origin="a")
    bank.add(*rows([2]), origin="b")
    version = bank.version
    bank.clear("a")
    assert bank.origins() == {"b": 1} and bank.version > version
    bank.clear()
    assert len(bank) == 0 and bank.sample_shape is None


def filled_bank() -> FailureBank:
    bank = FailureBank(capacity=4, seed=5)
    bank.add(*rows(list(range(9))), origin="a")  # consumes the subsampling generator
    bank.add(*rows([70, 71]), origin="b")
    return bank


def continue_bank(bank: FailureBank) -> list[int]:
    bank.add(*rows(list(range(100, 110))), origin="a")  # another oversize deposit
    return bank.labels("a").tolist()


def test_state_round_trip_continues_the_subsampling() -> None:
    bank = filled_bank()
    state = bank.state_dict()
    assert state["capacity"] == 4
    assert all(t.device.type == "cpu" for t in state["inputs"].values())
    fresh = FailureBank(capacity=4, seed=123)
    fresh.load_state_dict(state)
    assert fresh.origins() == bank.origins()
    for origin in ("a", "b"):
        assert torch.equal(fresh.inputs(origin), bank.inputs(origin))
        assert torch.equal(fresh.labels(origin), bank.labels(origin))
    assert continue_bank(fresh) == continue_bank(bank)


def test_pickle_round_trip_continues_the_subsampling() -> None:
    bank = filled_bank()
    copy = pickle.loads(pickle.dumps(bank))
    assert copy.origins() == bank.origins() and copy.capacity == 4
    assert torch.equal(copy.inputs("a"), bank.inputs("a"))
    assert continue_bank(copy) == continue_bank(bank)


def test_empty_state_leaves_the_bank_empty() -> None:
    bank = FailureBank()
    bank.load_state_dict({})
    assert len(bank) == 0


def test_loaded_state_respects_capacity() -> None:
    big = FailureBank(capacity=8)
    big.add(*rows(list(range(8))), origin="a")
    small = FailureBank(capacity=3)
    small.load_state_dict(big.state_dict())
    assert all(n <= small.capacity for n in small.origins().values())
