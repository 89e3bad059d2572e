"""benchmarks/anchor.py: the loops' rows train beside the originals of the rows they changed, not in their place."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import anchor
import closed_loop as cl  # scripts beside the package, not part of it

from tests.benchmarks.test_closed_loop import setting  # noqa: F401  (the fixture)


def through(callbacks: list, trainer: cl.L.Trainer, batch: list[torch.Tensor]) -> torch.Tensor:
    """``batch`` through ``callbacks`` in Lightning's order; returns what the noise underneath made of its inputs."""
    torch.manual_seed(0)
    noised = callbacks[0].augment(batch[0].clone())  # the draws the Underneath below will make
    torch.manual_seed(0)
    for callback in callbacks:
        callback.on_train_batch_start(trainer, None, batch, 0)
    return noised


def test_every_loader_row_trains_as_the_noise_left_it_and_the_replayed_failures_beside_them(
    setting: cl.Setting,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cl, "ON", ["noise"])
    arm, added = anchor.anchored(cl.make_arm("metamorphic", setting, 0, {}))
    trainer = cl.L.Trainer(
        callbacks=arm.callbacks, logger=False, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=False, max_epochs=1,
    )  # fmt: skip
    added.setup(trainer, None, "fit")  # the fit's start places the keeper
    order = [type(c).__name__ for c in trainer.callbacks]  # in the order Lightning calls them
    assert order[0] == "Underneath" and order[-1] == "KeepOriginals"
    assert order.index("_Keeper") < order.index("FailureReplay")

    batch = [torch.rand(20, 1, 28, 28), torch.arange(20) % 7]  # labels 0-6: no row holds a 9
    labels = batch[1].clone()
    noised = through(trainer.callbacks, trainer, batch)  # an empty bank: nothing changed, nothing added
    assert len(batch[0]) == 20 and torch.equal(batch[0], noised) and added.appended == 0

    replay = next(c for c in arm.callbacks if isinstance(c, cl.FailureReplay))
    replay.bank.add(torch.full((4, 1, 28, 28), 0.5), torch.full((4,), 9), "planted")
    batch = [torch.rand(20, 1, 28, 28), labels.clone()]
    noised = through(trainer.callbacks, trainer, batch)
    replaced = (batch[1][:20] == 9).nonzero().flatten()  # the rows the replay wrote its failures over
    assert len(replaced) == replay.replayed == round(replay.fraction * 20) > 0
    assert len(batch[0]) == len(batch[1]) == 20 + len(replaced) and added.appended == len(replaced)
    assert (batch[0][replaced] == 0.5).all()  # the failures stay in the batch
    # and the originals they replaced follow, as the noise left them, with their own labels
    assert torch.equal(batch[0][20:], noised[replaced]) and torch.equal(batch[1][20:], labels[replaced])
    kept = torch.ones(20, dtype=torch.bool)
    kept[replaced] = False
    assert torch.equal(batch[0][:20][kept], noised[kept])  # every other row as the noise left it, once


def test_the_goal_s_judge_measures_the_goal_s_figures_only(
    setting: cl.Setting,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = cl.Classifier(setting.make_net(), None, None)
    x, y = setting.test
    corrupted = {"dimmed": torch.stack([x * 0.5, x * 0.25])}  # two severities of a corruption of our own
    monkeypatch.setattr(cl, "JUDGED", ["goal"])
    scores = cl.judge(model, setting, corrupted, None)  # no distribution: HDA's R̂_g is not measured
    assert set(scores) == {"clean", "mCA", "corruptions", "fgsm", "pgd"}
    accuracy = [float((model(c).argmax(1) == y).float().mean()) for c in corrupted["dimmed"]]
    assert scores["mCA"] == pytest.approx(sum(accuracy) / 2)
    assert scores["clean"] == pytest.approx(float((model(x).argmax(1) == y).float().mean()))


def test_the_random_control_appends_as_many_originals_of_rows_drawn_at_random_without_the_global_rng() -> None:
    control = anchor.RandomOriginals(seed=3)
    drawn = torch.zeros(40, dtype=torch.bool)
    drawn[torch.randperm(40, generator=torch.Generator().manual_seed(3))[:5]] = True
    rows = drawn.nonzero().flatten().tolist()  # the seeded generator's draw, in row order
    batch = [torch.rand(40, 3, 4, 4), torch.arange(40)]
    control.keeper.on_train_batch_start(None, None, batch, 0)
    original = [part.clone() for part in batch]
    changed = [rows[0], *[row for row in range(40) if row not in rows][:4]]  # one of the drawn rows among them
    batch[0][changed] = 0.0  # five rows the loops changed, inputs and labels
    batch[1][changed] = 39
    state = torch.get_rng_state()
    control.on_train_batch_start(None, None, batch, 0)
    assert torch.equal(torch.get_rng_state(), state)  # the loops' draws stay the unanchored run's
    assert len(batch[0]) == len(batch[1]) == 45 and control.appended == 5
    # the originals of the drawn rows, as kept before the loops (the changed one too), with their own labels
    assert torch.equal(batch[0][40:], original[0][rows]) and torch.equal(batch[1][40:], original[1][rows])
    with pytest.raises(ValueError, match="draw"):
        anchor.anchored(SimpleNamespace(callbacks=[]), draw="every")


def test_the_script_takes_its_own_flag_and_labels_the_records(
    setting: cl.Setting,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for argv, draw, rest in [
        (["anchor.py", "--seeds", "0"], "changed", ["anchor.py", "--seeds", "0"]),
        (["anchor.py", "--anchor-draw", "random", "--seeds", "0"], "random", ["anchor.py", "--seeds", "0"]),
        (["anchor.py", "--seeds", "0", "--anchor-draw=random"], "random", ["anchor.py", "--seeds", "0"]),
    ]:
        assert anchor.take_draw(argv) == draw and argv == rest
    for argv in (["a", "--anchor-draw"], ["a", "--anchor-draw=every"], ["a", "--anchor-draw=random"] * 2):
        with pytest.raises(SystemExit, match="--anchor-draw"):
            anchor.take_draw(argv)

    seen: list = []

    def fake_main() -> None:  # what closed_loop.main does with an arm: make it, fit it, keep the record
        arm = cl.make_arm("metamorphic", setting, 4, {})
        seen.append(
            (arm.callbacks[-1], cl.fit("metamorphic", setting, 4, 1, {})[1], cl.fit("plain", setting, 4, 1, {})[1])
        )

    monkeypatch.setattr(cl, "fit", lambda arm_name, *args, **kwargs: (None, {"options": {"guide": 1}}))
    monkeypatch.setattr(cl, "main", fake_main)
    monkeypatch.setattr(cl, "make_arm", cl.make_arm)  # restored after the test: main() patches both
    monkeypatch.setattr(cl, "ON", [])
    monkeypatch.setattr(sys, "argv", ["anchor.py", "--anchor-draw", "random"])
    anchor.main()
    ((last, record, plain),) = seen
    assert isinstance(last, anchor.RandomOriginals)
    assert record == {"options": {"guide": 1, "anchor": "random"}, "anchored": 0}
    assert plain == {"options": {"guide": 1}}  # plain changes no row: not anchored, not labelled
