"""A callback's own generator: per-rank seeds, checkpoint round trip, restart reseeding, and a block
seeded from it that leaves the global RNG as it was, also when it raises."""

from __future__ import annotations

import random
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from dlguard._own_random import RankGenerator, drawing_from


def test_each_rank_starts_from_its_own_seed_and_an_earlier_state_is_kept() -> None:
    draws = []
    for rank in (0, 1):
        own = RankGenerator(seed=5)
        own.setup(rank)
        draws.append(torch.rand(3, generator=own.generator))
    assert torch.equal(draws[0], torch.rand(3, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(draws[1], torch.rand(3, generator=torch.Generator().manual_seed(6)))
    own = RankGenerator(seed=5)
    own.setup(0)
    torch.rand(1, generator=own.generator)
    state = own.state()
    own.setup(0)  # a second fit (validate, test) goes on drawing where the first stopped
    assert torch.equal(own.state(), state)


def test_a_checkpoint_continues_rank_zero_and_reseeds_the_other_ranks() -> None:
    assert RankGenerator(seed=0).state() is None  # before any draw: nothing to keep
    source = RankGenerator(seed=2)
    source.setup(0)
    torch.rand(4, generator=source.generator)
    state = source.state()
    expected = torch.rand(3, generator=source.generator)
    zero, one = RankGenerator(seed=2), RankGenerator(seed=2)
    for own, rank in ((zero, 0), (one, 1)):
        own.load(state)
        own.setup(rank)
        own.start(rank, drawn=4)
    assert torch.equal(torch.rand(3, generator=zero.generator), expected)
    assert torch.equal(
        torch.rand(3, generator=one.generator),
        torch.rand(3, generator=torch.Generator().manual_seed(2 + 1 + 1_000_003 * 4)),
    )
    one.start(1, drawn=9)  # only the first start after a restore reseeds
    assert not torch.equal(one.state(), torch.Generator().manual_seed(2 + 1 + 1_000_003 * 9).get_state())
    kept = RankGenerator(seed=2)
    kept.load(None)  # an old checkpoint without a generator keeps the seed
    assert torch.equal(
        torch.rand(2, generator=kept.generator), torch.rand(2, generator=torch.Generator().manual_seed(2))
    )


def test_the_block_draws_from_the_generator_and_the_global_rng_is_restored_after_an_exception() -> None:
    def block_draws(seed: int, fail: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        own = torch.Generator().manual_seed(seed)
        torch.manual_seed(123)
        inside = torch.empty(0)
        with pytest.raises(RuntimeError) if fail else nullcontext():
            with drawing_from(own):
                inside = torch.rand(4)
                if fail:
                    raise RuntimeError("boom")
        return inside, torch.rand(4)

    torch.manual_seed(123)
    untouched = torch.rand(4)
    inside, after = block_draws(0)
    # the block's numbers: the global RNG seeded with one draw from the generator
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(0)))
    assert torch.equal(inside, torch.rand(4, generator=torch.Generator().manual_seed(seed)))
    assert torch.equal(after, untouched)
    assert not torch.equal(block_draws(1)[0], inside)
    assert torch.equal(block_draws(0, fail=True)[1], untouched)


@pytest.mark.gpu
def test_on_cuda_the_device_generator_is_seeded_from_the_generator_and_restored() -> None:
    def draws(seed: int, fail: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        torch.cuda.manual_seed(7)
        inside = torch.empty(0)
        with pytest.raises(RuntimeError) if fail else nullcontext():
            with drawing_from(torch.Generator().manual_seed(seed), "cuda"):
                inside = torch.rand(4, device="cuda").cpu()
                if fail:
                    raise RuntimeError("boom")
        return inside, torch.rand(4, device="cuda").cpu()

    torch.cuda.manual_seed(7)
    untouched = torch.rand(4, device="cuda").cpu()
    inside, after = draws(0)
    # inside: numbers of a CUDA generator of the test's own, seeded by hand with the one draw taken from `own`
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(0)))
    expected = torch.rand(4, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).cpu()
    assert torch.equal(inside, expected)
    assert torch.equal(after, untouched)
    assert torch.equal(draws(0)[0], inside) and not torch.equal(draws(1)[0], inside)
    assert torch.equal(draws(0, fail=True)[1], untouched)


def test_every_test_starts_from_seed_0_whatever_ran_before_it() -> None:
    """``tests/conftest.py`` seeds the global generators before each test's setup; torch's default seed is not 0."""
    assert torch.equal(torch.random.get_rng_state(), torch.Generator().manual_seed(0).get_state())
    assert np.array_equal(np.random.get_state()[1], np.random.RandomState(0).get_state()[1])
    assert random.getstate() == random.Random(0).getstate()
    torch.rand(5), np.random.rand(5), random.random()  # what the next test must not see
