from __future__ import annotations

import warnings

import pytest
import torch

from dlguard import _distributed
from dlguard._random import content_keys
from dlguard.data.probe_set import ProbeSetDraw, ProbeSetPolicy
from tests.quick import run_on_two_processes

N, CLASSES = 300, 5


def dataset(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs in [0, 1], labels, and a 'correctly predicted' mask; class 4 has only 2 correct inputs."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(N, 1, 4, 4, generator=gen)
    y = torch.randint(0, CLASSES, (N,), generator=gen)
    correct = torch.rand(N, generator=gen) < 0.7
    fours = torch.nonzero(y == 4).flatten()
    correct[fours] = False
    correct[fours[:2]] = True
    return x, y, correct


def brute_force(x: torch.Tensor, y: torch.Tensor, correct: torch.Tensor, policy: ProbeSetPolicy) -> list[int]:
    """Indices of the reference draw, ordered by key: keys over the whole set at once, smallest kept."""
    keys = content_keys(x, policy.seed).tolist()
    candidates = [i for i in range(len(x)) if correct[i] or not policy.correct_only]
    if policy.probe_size is not None:
        chosen = sorted(candidates, key=lambda i: keys[i])[: policy.probe_size]
    else:
        chosen = []
        for cls in sorted(set(y.tolist())):
            members = sorted((i for i in candidates if y[i] == cls), key=lambda i: keys[i])
            chosen += members[: policy.per_class]
    return sorted(chosen, key=lambda i: keys[i])


def random_batches(n: int, seed: int) -> list[torch.Tensor]:
    """A random order of range(n) cut into random batch sizes (1 to 40)."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen)
    sizes, left = [], n
    while left:
        sizes.append(min(left, int(torch.randint(1, 41, (1,), generator=gen))))
        left -= sizes[-1]
    return list(order.split(sizes))


def stream(draw: ProbeSetDraw, x, y, correct, batches) -> None:
    for rows in batches:
        draw.add(x[rows], y[rows], correct[rows])


POLICIES = [
    ProbeSetPolicy(probe_size=25, seed=0),
    ProbeSetPolicy(probe_size=25, seed=7),
    ProbeSetPolicy(probe_size=40, correct_only=True, seed=1),
    ProbeSetPolicy(per_class=6, seed=2),
    ProbeSetPolicy(per_class=6, correct_only=True, seed=3),
]


@pytest.mark.parametrize(
    "policy", POLICIES, ids=lambda p: f"size{p.probe_size}-pc{p.per_class}-c{p.correct_only}-s{p.seed}"
)
@pytest.mark.parametrize("split_seed", [0, 1, 2])
def test_streaming_draw_equals_brute_force(policy: ProbeSetPolicy, split_seed: int) -> None:
    x, y, correct = dataset()
    draw = ProbeSetDraw(policy)
    stream(draw, x, y, correct, random_batches(N, split_seed))
    probe = draw.finish()
    ref = brute_force(x, y, correct, policy)
    assert torch.equal(probe.inputs, x[ref])
    assert torch.equal(probe.target, y[ref])
    assert torch.equal(probe.keys, content_keys(x[ref], policy.seed))
    assert torch.equal(probe.all_keys, probe.keys)  # one process: its share is the whole set
    assert probe.size == len(probe) == len(ref)
    assert probe.class_counts == {c: n for c, n in enumerate(torch.bincount(y[ref]).tolist()) if n}
    if policy.correct_only:
        assert probe.found_per_class == {c: int(((y == c) & correct).sum()) for c in range(CLASSES)}
        assert all(bool(correct[i]) for i in ref)
    else:
        assert probe.found_per_class is None
    if policy.per_class is not None and policy.correct_only:
        assert probe.class_counts == {0: 6, 1: 6, 2: 6, 3: 6, 4: 2}  # class 4 is short: both of its correct ones


def test_draws_differ_by_seed_and_are_uniform_over_inputs() -> None:
    x, y, _correct = dataset()
    hits = torch.zeros(N)
    for seed in range(200):
        draw = ProbeSetDraw(ProbeSetPolicy(probe_size=30, seed=seed))
        draw.add(x, y)
        probe = draw.finish()
        hits[torch.isin(content_keys(x, seed), probe.keys)] += 1
    # each input is drawn with probability 30/300: 20 of 200 draws, binomial sd ~4.2
    assert abs(float(hits.mean()) - 20) < 1e-9
    assert float(hits.min()) >= 5 and float(hits.max()) <= 38


def test_repeated_inputs_count_once() -> None:
    x, y, correct = dataset()
    draw = ProbeSetDraw(ProbeSetPolicy(probe_size=N))
    draw.add(x[:200], y[:200])
    draw.add(x[100:], y[100:])  # rows 100..199 again
    probe = draw.finish()
    assert probe.size == N
    assert torch.equal(probe.inputs, x[brute_force(x, y, correct, ProbeSetPolicy(probe_size=N))])


@pytest.mark.parametrize("policy", [POLICIES[0], POLICIES[4]], ids=["size", "per_class_correct"])
def test_restore_by_keys_finds_the_same_inputs_in_other_batches(policy: ProbeSetPolicy) -> None:
    x, y, correct = dataset()
    first = ProbeSetDraw(policy)
    stream(first, x, y, correct, random_batches(N, 0))
    probe = first.finish()
    state = probe.state_dict()
    assert state["seed"] == policy.seed and torch.equal(state["keys"], probe.all_keys)
    again = ProbeSetDraw(policy, restore=state["keys"])
    for rows in random_batches(N, 5):  # another order and other batch sizes, no correct mask
        again.add(x[rows], y[rows])
    restored = again.finish()
    assert torch.equal(restored.inputs, probe.inputs)
    assert torch.equal(restored.target, probe.target)
    assert torch.equal(restored.all_keys, probe.all_keys)
    assert restored.class_counts == probe.class_counts


def test_restore_warns_when_some_inputs_are_missing() -> None:
    x, y, _correct = dataset()
    first = ProbeSetDraw(ProbeSetPolicy(probe_size=25))
    first.add(x, y)
    probe = first.finish()
    present = ~torch.isin(content_keys(x), probe.all_keys[:4])  # the 4 smallest keys are gone
    again = ProbeSetDraw(ProbeSetPolicy(probe_size=25), restore=probe.all_keys, context="validation loader 0")
    again.add(x[present], y[present])
    with pytest.warns(UserWarning, match=r"4 of the 25 inputs .* not found in validation loader 0.* 21 found"):
        restored = again.finish()
    assert torch.equal(restored.all_keys, probe.all_keys[4:])
    assert torch.equal(restored.inputs, probe.inputs[4:])


def test_a_restored_set_smaller_than_the_policy_s_size_is_found_again_without_a_word() -> None:
    """A set a budget cut to 16 inputs, found again after a resume: nothing is missing and no input was
    refused, so nothing is said (the old check read the policy's 500 and blamed misclassified inputs)."""
    x, y, correct = dataset()
    first = ProbeSetDraw(ProbeSetPolicy(probe_size=500, correct_only=True))
    first.add(x, y, correct)
    probe = first.finish(limit=lambda seen: 16)
    again = ProbeSetDraw(ProbeSetPolicy(probe_size=500, correct_only=True), restore=probe.all_keys)
    again.add(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = again.finish()
    assert probe.size == 16 and torch.equal(restored.all_keys, probe.all_keys)


def test_restore_with_nothing_found_is_an_error() -> None:
    x, y, _ = dataset()
    first = ProbeSetDraw(ProbeSetPolicy(probe_size=5))
    first.add(x, y)
    probe = first.finish()
    again = ProbeSetDraw(ProbeSetPolicy(probe_size=5), restore=probe.all_keys)
    again.add(dataset(seed=1)[0], y)
    with pytest.raises(ValueError, match="none of the 5 inputs kept in the checkpoint"):
        again.finish()


def test_fewer_inputs_than_size_warns_and_keeps_all() -> None:
    x, y, _ = dataset()
    draw = ProbeSetDraw(ProbeSetPolicy(probe_size=500), context="val")
    draw.add(x, y)
    with pytest.warns(UserWarning, match=r"size=500 requested but val gave 300 distinct inputs; measuring on 300"):
        probe = draw.finish()
    assert probe.size == N


def test_a_correct_only_shortfall_names_how_many_inputs_were_seen_and_how_many_were_correct() -> None:
    x, y, correct = dataset()
    draw = ProbeSetDraw(ProbeSetPolicy(probe_size=500, correct_only=True), context="val")
    draw.add(x, y, correct)
    right = int(correct.sum())
    with pytest.warns(UserWarning, match=rf"val gave 300 distinct inputs, {right} of them classified correctly"):
        draw.finish()


@pytest.mark.parametrize("policy", POLICIES[:1] + POLICIES[-1:], ids=["size", "per_class-correct"])
def test_seen_and_accuracy_count_each_distinct_input_once(policy: ProbeSetPolicy) -> None:
    x, y, correct = dataset()
    rows = torch.cat([torch.arange(N), torch.arange(40)])  # the first 40 inputs come twice (padded shards)
    draw = ProbeSetDraw(policy)
    stream(draw, x, y, correct, [rows[b] for b in random_batches(len(rows), 4)])
    probe = draw.finish()
    assert probe.seen == N
    assert probe.accuracy == pytest.approx(sum(bool(c) for c in correct.tolist()) / N, abs=1e-12)


def test_accuracy_is_unknown_unless_every_batch_said_which_inputs_were_correct() -> None:
    x, y, correct = dataset()
    draw = ProbeSetDraw(ProbeSetPolicy(probe_size=25))
    draw.add(x[:100], y[:100], correct[:100])
    draw.add(x[100:], y[100:])
    probe = draw.finish()
    assert probe.seen == N and probe.accuracy is None
    restored = ProbeSetDraw(ProbeSetPolicy(probe_size=25), restore=probe.all_keys)
    restored.add(x, y, correct)
    again = restored.finish()
    assert again.seen is None and again.accuracy is None  # a restored set was accepted when drawn


def test_no_batches_is_an_error() -> None:
    with pytest.raises(ValueError, match="gave no inputs"):
        ProbeSetDraw(ProbeSetPolicy(probe_size=3), context="validation loader 0").finish()


def test_nothing_correct_is_an_error() -> None:
    x, y, _ = dataset()
    draw = ProbeSetDraw(ProbeSetPolicy(per_class=3, correct_only=True))
    draw.add(x, y, torch.zeros(N, dtype=torch.bool))
    with pytest.raises(ValueError, match=f"none of the {N} inputs .* classified correctly"):
        draw.finish()


def test_correct_only_needs_the_mask() -> None:
    x, y, correct = dataset()
    draw = ProbeSetDraw(ProbeSetPolicy(per_class=3, correct_only=True))
    with pytest.raises(ValueError, match="correct"):
        draw.add(x, y)
    with pytest.raises(ValueError, match="correct"):
        draw.add(x, y, correct[:10])


def test_nan_and_out_of_range_inputs_are_refused() -> None:
    x, y, _ = dataset()
    bad = x.clone()
    bad[3, 0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match=r"inputs \(validation loader 0\): contains NaN"):
        ProbeSetDraw(ProbeSetPolicy(probe_size=3), context="validation loader 0").add(bad, y)
    with pytest.raises(ValueError, match=r"expected values in \[0, 1\], got values in \[-0\.49"):
        ProbeSetDraw(ProbeSetPolicy(probe_size=3)).add(x - 0.5, y)
    normalised = ProbeSetDraw(ProbeSetPolicy(probe_size=3, value_range=None))
    normalised.add((x - 0.5) / 0.25, y)  # any values when value_range is None
    assert normalised.finish().size == 3
    with pytest.raises(ValueError, match="contains NaN"):
        ProbeSetDraw(ProbeSetPolicy(probe_size=3, value_range=None)).add(bad, y)


def test_bad_labels_are_refused() -> None:
    x, y, _ = dataset()
    with pytest.raises(ValueError, match="target"):
        ProbeSetDraw(ProbeSetPolicy(probe_size=3)).add(x, y[:-1])
    with pytest.raises(ValueError, match="target"):
        ProbeSetDraw(ProbeSetPolicy(probe_size=3)).add(x, y.float())


def test_empty_batch_is_skipped() -> None:
    x, y, _ = dataset()
    draw = ProbeSetDraw(ProbeSetPolicy(probe_size=3))
    draw.add(x[:0], y[:0])
    draw.add(x, y)
    assert draw.finish().size == 3


def test_found_per_class_reports_a_lower_class_without_correct_inputs() -> None:
    x, y, correct = dataset()
    correct = correct & (y != 2)
    draw = ProbeSetDraw(ProbeSetPolicy(per_class=6, correct_only=True))
    draw.add(x, y, correct)
    probe = draw.finish()
    assert probe.found_per_class is not None and probe.found_per_class[2] == 0
    assert 2 not in probe.class_counts


def test_found_per_class_reports_the_top_class_without_correct_inputs() -> None:
    x, y, correct = dataset()
    correct = correct & (y != CLASSES - 1)
    draw = ProbeSetDraw(ProbeSetPolicy(per_class=6, correct_only=True))
    draw.add(x, y, correct)
    probe = draw.finish()
    assert probe.found_per_class is not None and probe.found_per_class.get(CLASSES - 1) == 0


def test_negative_labels_name_target() -> None:
    x, y, _ = dataset()
    with pytest.raises(ValueError, match="target"):
        draw = ProbeSetDraw(ProbeSetPolicy(per_class=3))
        draw.add(x, y - 1)
        draw.finish()


def test_distinct_sparse_inputs_are_all_kept() -> None:
    one_hot = torch.eye(4096).reshape(4096, 1, 64, 64)
    draw = ProbeSetDraw(ProbeSetPolicy(probe_size=4096))
    draw.add(one_hot, torch.zeros(4096, dtype=torch.long))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert draw.finish().size == 4096


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "exactly one"),
        ({"probe_size": 3, "per_class": 2}, "exactly one"),
        ({"probe_size": 0}, "probe_size"),
        ({"per_class": -1}, "per_class"),
        ({"probe_size": 2.5}, "probe_size"),
        ({"probe_size": 3, "value_range": (1.0, 0.0)}, "value_range"),
        ({"probe_size": 3, "value_range": (0.0, float("inf"))}, "value_range"),
        ({"per_class": 3, "labels": False}, "labels: a draw over targets that are not class labels"),
        ({"probe_size": 3, "correct_only": True, "labels": False}, "labels"),
    ],
)
def test_policy_validation(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ProbeSetPolicy(**kwargs)


def test_regression_targets_are_drawn_like_labels() -> None:
    """Steering angles (floats, any sign) ride along with their inputs: the same inputs as a label draw."""
    x, y, correct = dataset()
    angles = torch.linspace(-1.0, 1.0, N)
    policy = ProbeSetPolicy(probe_size=25, seed=4, labels=False)
    draw = ProbeSetDraw(policy)
    for rows in random_batches(N, 3):
        draw.add(x[rows], angles[rows])
    probe = draw.finish()
    chosen = brute_force(x, y, correct, policy)
    assert torch.equal(probe.inputs, x[chosen]) and torch.equal(probe.target, angles[chosen])
    assert probe.class_counts == {}
    with pytest.raises(ValueError, match="target: expected 3 targets for 3 inputs, got 2"):
        ProbeSetDraw(policy).add(x[:3], angles[:2])
    with pytest.raises(ValueError, match="target"):
        ProbeSetDraw(policy).add(x[:3], torch.tensor([0.1, float("nan"), 0.2]))
    with pytest.raises(ValueError, match="target"):  # a label draw still refuses float targets
        ProbeSetDraw(ProbeSetPolicy(probe_size=3)).add(x[:3], angles[:3])


# ---------------------------------------------------------------- two processes


def _two_process_draws(rank: int, world: int) -> dict:
    import torch.distributed as dist

    x, y, correct = dataset()
    results = {}
    for name, policy, pad in [
        ("size", ProbeSetPolicy(probe_size=25, seed=0), False),
        ("per_class", ProbeSetPolicy(per_class=6, correct_only=True, seed=3), False),
        ("padded", ProbeSetPolicy(per_class=6, correct_only=True, seed=3), True),
    ]:
        shard = torch.arange(rank, N, world)  # interleaved, like DistributedSampler
        if pad and rank == 1:  # DistributedSampler pads the last shard with the first inputs again
            first_correct = int(torch.nonzero(correct[0::world]).flatten()[0]) * world
            shard = torch.cat([shard, torch.tensor([first_correct])])
        draw = ProbeSetDraw(policy)
        batch = 7 if rank == 0 else 11
        for rows in shard.flip(0).split(batch):  # the ranks also see different orders
            draw.add(x[rows], y[rows], correct[rows])
        probe = draw.finish()
        local = {
            "shard": shard,
            "inputs": probe.inputs,
            "target": probe.target,
            "keys": probe.keys,
            "all_keys": probe.all_keys,
            "class_counts": probe.class_counts,
            "found": probe.found_per_class,
            "seen": probe.seen,
            "accuracy": probe.accuracy,
        }
        gathered: list = [None] * world
        dist.all_gather_object(gathered, local)
        results[name] = gathered
    return results


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_on_two_processes(_two_process_draws, tmp_path_factory.mktemp("ddp_probe_set"))


def check_two_equal_one(ranks: list[dict], policy: ProbeSetPolicy) -> None:
    x, y, correct = dataset()
    ref = brute_force(x, y, correct, policy)
    keys = content_keys(x, policy.seed)
    for rank in ranks:  # every rank knows the whole probe set
        assert torch.equal(rank["all_keys"], keys[ref])
        assert rank["class_counts"] == {c: n for c, n in enumerate(torch.bincount(y[ref]).tolist()) if n}
    # each rank keeps its own inputs only, and together they are the one-process draw
    for rank in ranks:
        own = set(keys[rank["shard"]].tolist())
        assert set(rank["keys"].tolist()) <= own
        assert torch.equal(rank["keys"], rank["keys"].sort().values)
        assert torch.equal(rank["keys"], content_keys(rank["inputs"], policy.seed))
    union = torch.cat([ranks[0]["keys"], ranks[1]["keys"]])
    assert len(union) == len(ref)
    order = union.argsort()
    assert torch.equal(union[order], keys[ref])
    assert torch.equal(torch.cat([ranks[0]["inputs"], ranks[1]["inputs"]])[order], x[ref])
    assert torch.equal(torch.cat([ranks[0]["target"], ranks[1]["target"]])[order], y[ref])
    assert len(ranks[0]["keys"]) > 0 and len(ranks[1]["keys"]) > 0


@pytest.mark.ddp
def test_two_processes_draw_what_one_process_draws(two_process_results: dict) -> None:
    _x, y, correct = dataset()
    check_two_equal_one(two_process_results["size"], ProbeSetPolicy(probe_size=25, seed=0))
    check_two_equal_one(two_process_results["per_class"], ProbeSetPolicy(per_class=6, correct_only=True, seed=3))
    expected_found = {c: int(((y == c) & correct).sum()) for c in range(CLASSES)}
    for rank in two_process_results["per_class"]:
        assert rank["found"] == expected_found


@pytest.mark.ddp
def test_two_processes_count_seen_inputs_and_accuracy_once(two_process_results: dict) -> None:
    _x, _y, correct = dataset()
    for rank in two_process_results["padded"] + two_process_results["size"]:
        assert rank["seen"] == N
        assert rank["accuracy"] == pytest.approx(float(correct.double().mean()), abs=1e-12)


@pytest.mark.ddp
def test_padded_shards_draw_what_one_process_draws(two_process_results: dict) -> None:
    check_two_equal_one(two_process_results["padded"], ProbeSetPolicy(per_class=6, correct_only=True, seed=3))


@pytest.mark.ddp
def test_padded_shards_count_found_per_class_once(two_process_results: dict) -> None:
    _x, y, correct = dataset()
    expected_found = {c: int(((y == c) & correct).sum()) for c in range(CLASSES)}
    for rank in two_process_results["padded"]:
        assert rank["found"] == expected_found


def test_single_process_gather_is_identity() -> None:
    t = torch.arange(6).reshape(2, 3)
    assert _distributed.world_size() == 1 and _distributed.rank() == 0
    assert _distributed.gather(t)[0] is t
    total = _distributed.all_sum(t)
    assert torch.equal(total, t) and total is not t
