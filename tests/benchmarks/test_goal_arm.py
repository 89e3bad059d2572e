"""``closed_loop_callbacks``, as README calls it, is the benchmark's anchored arm, setting for setting."""

from __future__ import annotations

import inspect
import json
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import anchor
import closed_loop as cl  # scripts beside the package, not part of it

from dlguard._own_random import drawing_from
from dlguard.augment import ScoreGuidedPadding
from dlguard.callbacks import GaussianNoise, KeepOriginals
from dlguard.data import FailureBank
from tests.test_readme import BLOCKS

MARK = "callbacks = closed_loop_callbacks(masks="

PROJECT_OWN = {"batch_keys", "accessor", "preprocess", "masks"}
"""What a project sets for its own batches and network (dict keys, the normalisation its network expects, the
mask's key), not the arm; the benchmark's network normalises in ``forward``, so its loops take no ``preprocess``."""

BANK_ARGUMENTS = tuple(inspect.signature(FailureBank).parameters)


def readme_callbacks() -> list[L.Callback]:
    """The callbacks README's block makes, run as written (it calls ``closed_loop_callbacks``)."""
    (block,) = [code for code in BLOCKS if MARK in code]
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(block, "README.md", "exec"), namespace)
    return namespace["callbacks"]


def benchmark_callbacks(monkeypatch: pytest.MonkeyPatch) -> list[L.Callback]:
    """The anchored arm README gives the command of, seed 0, with the flags set as ``closed_loop.main`` sets them.

    ``--on noise --arms dlguard --properties framework capture exposure --combine dscore robustness hda metamorphic
    relevancy --guide strength=0.125 --padding "padding_mode='reflection'" --dscore "p_from='unpadded'"
    start_epoch=2``; the harness's ``Dose``, which only records, is left out.
    """
    monkeypatch.setattr(cl, "ON", ["noise"])
    monkeypatch.setattr(cl, "COMBINED", ["dscore", "robustness", "hda", "metamorphic", "relevancy"])
    monkeypatch.setattr(cl, "PROPERTIES", ["framework", "capture", "exposure"])
    monkeypatch.setattr(cl, "SPREAD", ["cell"])
    monkeypatch.setattr(cl, "VIOLATION_GUIDE", [])
    for name, given in {
        "guide": {"strength": 0.125},
        "padding": {"padding_mode": "reflection"},
        "dscore": {"p_from": "unpadded", "start_epoch": 2},
    }.items():
        monkeypatch.setitem(cl.OPTIONS, name, given)
    pictures, labels = torch.rand(20, 3, 32, 32), torch.arange(20) % 10
    split = (pictures, labels)  # the arm reads no split: only whether the validation scenes have masks
    setting = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    arm, _ = anchor.anchored(cl.make_arm("dlguard", setting, 0, {}))
    return [c for c in arm.callbacks if not isinstance(c, cl.Dose)]


def configured(thing: Any) -> dict[str, Any]:
    """``thing``'s public settings: scalars and containers of them, its properties, its guide's and bank's."""
    out: dict[str, Any] = {}
    for name, value in vars(thing).items():
        if name.startswith("_") or name in PROJECT_OWN:
            continue
        if name == "properties":
            out[name] = [(p.name, tuple(p.levels), p.deterministic) for p in value]
        elif name == "guide":
            out[name] = None if value is None else (type(value).__name__, configured(value))
        elif name == "bank":  # the benchmark's is a FailureBank that also records its deposits: its arguments
            out[name] = None if value is None else {arg: getattr(value, arg) for arg in BANK_ARGUMENTS}
        elif isinstance(value, bool | int | float | str | None | tuple | list | dict):
            out[name] = value
    return out


def test_the_readme_block_makes_the_benchmark_s_anchored_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    readme, benchmark = readme_callbacks(), benchmark_callbacks(monkeypatch)
    (noise, *loops), (underneath, *theirs) = readme, benchmark
    assert isinstance(underneath, cl.Underneath) and isinstance(noise, GaussianNoise)
    assert noise.max_sigma == largest_sigma(underneath) == 0.3 and noise.value_range == (0.0, 1.0)
    assert [type(c).__name__ for c in loops] == [type(c).__name__ for c in theirs]
    for mine, their in zip(loops, theirs, strict=True):
        assert configured(mine) == configured(their), type(mine).__name__
    for callbacks in (loops, theirs):  # one bank, which every loop fills and the replay draws from
        replay = next(c for c in callbacks if isinstance(c, cl.FailureReplay))
        banked = [type(c).__name__ for c in callbacks if getattr(c, "bank", None) is replay.bank]
        assert banked == ["RobustnessCallback", "HDACallback", "MetamorphicCallback", "ObjectRelevancyCallback",
                          "FailureReplay"]  # fmt: skip

    # KeepOriginals keeps the rows as the noise left them: its keeper goes after the noise, before D-Score's padding
    trainer = L.Trainer(callbacks=list(readme), logger=False, enable_checkpointing=False, enable_model_summary=False)
    readme[-1].setup(trainer, None, "fit")  # a list of its own: Lightning appends its progress bar to the one given
    order = [type(c).__name__ for c in trainer.callbacks]
    assert order[:3] == ["GaussianNoise", "_Keeper", "DScoreCallback"] and order[-1] == "KeepOriginals"

    # the comparison reads the settings that make the arm: the goal's own arguments are among them
    dscore, robustness = configured(loops[0]), configured(loops[1])
    assert dscore["p_from"] == "unpadded" and dscore["start_epoch"] == 2
    assert dscore["guide"] == ("ScoreGuidedPadding", {**dscore["guide"][1], "flags": {"padding_mode": "reflection"}})
    assert robustness["guide"][1]["strength"] == 0.125
    assert {"reduced_contrast", "defocus", "underexposure"} <= {name for name, *_ in robustness["properties"]}


def largest_sigma(underneath: cl.Underneath) -> float:
    """The benchmark's noise with every uniform draw at its top and every normal draw at one: ``x + max σ``."""
    pictures = torch.full((3, 3, 4, 4), 0.25)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(*shape, **kw))
        patch.setattr(torch, "randn_like", lambda x, **kw: torch.ones_like(x, **kw))
        rows = [pictures.clone(), torch.zeros(3)]
        underneath.on_train_batch_start(None, None, rows, 0)
    (shift,) = (rows[0] - pictures).unique().tolist()
    return round(shift, 6)


def test_the_largest_sigma_is_read_from_the_noise_not_assumed() -> None:
    assert largest_sigma(cl.Underneath(lambda x: (x + 0.125).clamp(0, 1))) == 0.125  # a planted other noise


def test_the_benchmark_s_library_arm_is_the_readme_call_with_its_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--arms closed_loop_callbacks`` fits what README's call makes, each callback seeded by the run's seed."""
    pictures, labels = torch.rand(20, 3, 32, 32), torch.arange(20) % 10
    split = (pictures, labels)
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    arm = cl.make_arm(cl.LIBRARY, scenes, 3, {})
    assert isinstance(arm.callbacks[-1], cl.LibraryDose) and arm.dose is arm.callbacks[-1]  # it only watches
    readme = readme_callbacks()
    call = arm.callbacks[:-1]
    assert [type(c).__name__ for c in call] == [type(c).__name__ for c in readme]
    for mine, theirs in zip(call, readme, strict=True):
        seeded = configured(mine)
        assert seeded.pop("seed", 3) == 3, type(mine).__name__
        assert seeded == {k: v for k, v in configured(theirs).items() if k != "seed"}, type(mine).__name__
    relevancy = next(c for c in arm.callbacks if type(c).__name__ == "ObjectRelevancyCallback")
    assert relevancy.masks == 2  # the validation batches' third field
    digits = cl.Setting(split, split, split, cl.resnet18_cifar)  # no masks: no object relevancy
    assert "ObjectRelevancyCallback" not in [type(c).__name__ for c in cl.make_arm(cl.LIBRARY, digits, 0, {}).callbacks]
    # anchor.py keeps the call's own KeepOriginals and adds none; --on is refused: the call brings its own noise
    made: list = []
    monkeypatch.setattr(cl, "main", lambda: made.append(cl.make_arm(cl.LIBRARY, scenes, 0, {})))
    monkeypatch.setattr(cl, "make_arm", cl.make_arm)  # restored after the test: anchor.main() patches both
    monkeypatch.setattr(cl, "fit", cl.fit)
    monkeypatch.setattr(sys, "argv", ["anchor.py"])
    anchor.main()
    assert sum(isinstance(c, KeepOriginals) for c in made[0].callbacks) == 1
    monkeypatch.setattr(cl, "ON", ["noise"])
    with pytest.raises(SystemExit, match="--on"):
        cl.make_arm(cl.LIBRARY, scenes, 0, {})


def test_properties_reach_the_library_arm_and_its_record_names_them_unless_they_are_the_historic_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No ``--properties``: the call's own presets, named in the record as if given; given: the union of the presets
    replaces its robustness loop's (guide alike); ``framework capture``, the call's default of the records without
    options, labels as they do."""
    split = (torch.rand(20, 3, 32, 32), torch.arange(20) % 10)
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))

    def robustness_names() -> tuple[list[str], list[str]]:
        (loop,) = [
            c for c in cl.make_arm(cl.LIBRARY, scenes, 0, {}).callbacks if type(c).__name__ == "RobustnessCallback"
        ]
        return [p.name for p in loop.properties], [p.name for p in loop.guide.properties]

    trio, capture = ["noise", "rotation", "brightness"], ["reduced_contrast", "defocus", "low_resolution"]
    assert robustness_names() == (trio + capture + ["underexposure"],) * 2
    default = cl.given_options(cl.LIBRARY, scenes)
    assert default == {"properties": ["framework", "capture", "exposure"]}
    label = cl._label(cl.LIBRARY, [{"options": default}])
    assert label == "closed_loop_callbacks [--properties framework capture exposure]"
    monkeypatch.setattr(cl, "LIBRARY_PROPERTIES", ["framework", "capture", "exposure"])
    monkeypatch.setattr(cl, "PROPERTIES", ["framework", "capture", "exposure"])
    assert cl.given_options(cl.LIBRARY, scenes) == default  # the flag given as the default labels as the default
    monkeypatch.setattr(cl, "LIBRARY_PROPERTIES", ["framework", "capture"])
    monkeypatch.setattr(cl, "PROPERTIES", ["framework", "capture"])
    assert robustness_names() == (trio + capture,) * 2
    assert cl.given_options(cl.LIBRARY, scenes) == {}  # as the records of the call before 2026-12-06
    monkeypatch.setattr(cl, "LIBRARY_PROPERTIES", ["exposure"])
    monkeypatch.setattr(cl, "PROPERTIES", ["exposure"])
    assert robustness_names() == (["underexposure"],) * 2
    assert cl.given_options(cl.LIBRARY, scenes) == {"properties": ["exposure"]}


def test_the_library_arm_meets_the_goal_s_references_in_the_paired_table() -> None:
    results = {
        "plain": [{"seed": 0, "clean": 0.90, "pgd": 0.50, "mCA": 0.70}],
        "augmix": [{"seed": 0, "clean": 0.91, "pgd": 0.40, "mCA": 0.80}],
        cl.LIBRARY: [{"seed": 0, "clean": 0.89, "pgd": 0.60, "mCA": 0.84}],
    }
    assert cl.paired(results)[2:] == [
        "| closed_loop_callbacks − augmix | mCA | +0.040 ± nan | 1 of 1 |",
        "| closed_loop_callbacks − augmix | pgd | +0.200 ± nan | 1 of 1 |",
        "| closed_loop_callbacks − plain | clean | -0.010 ± nan | 0 of 1 |",
        "| closed_loop_callbacks − plain | pgd | +0.100 ± nan | 1 of 1 |",
    ]


def test_the_library_control_keeps_the_call_s_noise_replay_and_keeper_and_replaces_each_detector() -> None:
    """``closed_loop_callbacks-open``: the call's noise first, a stand-in per detector at its dose and origin, the
    call's replay and ``KeepOriginals`` last; it refuses to run before the call whose dose it follows."""
    split = (torch.rand(20, 3, 32, 32), torch.arange(20) % 10)
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    with pytest.raises(SystemExit, match="run closed_loop_callbacks before it"):
        cl.make_arm(cl.LIBRARY_CONTROL, scenes, 0, {})
    origins = {"robustness": {"0": 5}, "hda": {"1": 2}, "metamorphic": {"0": 3}, "relevancy": {"2": 6}}
    dose = {"origins": origins, "strength": [0.0, 0.1, 0.2], "guides": {"dscore": [0.0, 0.0, 0.3, 0.4]}}
    arm = cl.make_arm(cl.LIBRARY_CONTROL, scenes, 4, {cl.LIBRARY: dose})
    names = [type(c).__name__ for c in arm.callbacks]
    assert names == ["GaussianNoise", *["OpenLoop"] * 4, "RelevancyOpenLoop", "FailureReplay", "KeepOriginals"]
    padding, robustness, hda, metamorphic, relevancy = arm.callbacks[1:6]
    assert padding.guide.p == pytest.approx(((0.3**2 + 0.4**2) / 4) ** 0.5)  # D-Score's rms p, from the first epoch
    assert padding.guide.flags["padding_mode"] == "reflection" and padding.bank is None
    assert [c.origin for c in (robustness, hda, metamorphic, relevancy)] == list(origins)
    assert [c.deposits for c in (robustness, hda, metamorphic, relevancy)] == list(origins.values())
    replay = arm.callbacks[-2]
    assert all(c.bank is replay.bank for c in (robustness, hda, metamorphic, relevancy))
    assert robustness.strength == dose["strength"]
    call = {type(c).__name__: c for c in cl.make_arm(cl.LIBRARY, scenes, 4, {}).callbacks}
    assert [p.name for p in robustness.guide.properties] == [p.name for p in call["RobustnessCallback"].properties]
    assert len({c.generator.initial_seed() for c in arm.callbacks[1:6]}) == 5  # each stand-in draws rows of its own
    # ... but its guide draws what the call's guide draws (common random numbers): the call's seed, not the rows'
    for stand_in, guided in ((padding, "DScoreCallback"), (robustness, "RobustnessCallback")):
        assert stand_in.draws.seed == call[guided]._guide_random.seed, guided
    assert cl.given_options(cl.LIBRARY_CONTROL, scenes) == cl.given_options(cl.LIBRARY, scenes)  # labelled alike


def test_under_control_padding_schedule_the_library_control_pads_at_the_call_s_p_epoch_by_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--control_padding schedule``: the control's padding is the call's, no padding (and no draw) before the call
    padded, then each epoch's ``p``, drawn from D-Score's guide's stream as the call's guide draws it; the label names
    the flag, and the default keeps the root mean square from the first epoch under the label it had."""
    split = (torch.rand(20, 3, 32, 32), torch.arange(20) % 10)
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    dose = {"origins": {}, "strength": [0.0] * 4, "guides": {"dscore": [0.0, 0.0, 0.3, 0.6]}}
    default = cl.given_options(cl.LIBRARY_CONTROL, scenes)
    assert "control_padding" not in default  # the default's label is the one its records have
    rms = cl.make_arm(cl.LIBRARY_CONTROL, scenes, 4, {cl.LIBRARY: dose}).callbacks[1]
    assert rms.guide.p == pytest.approx(((0.3**2 + 0.6**2) / 4) ** 0.5) and rms.strength == []
    monkeypatch.setattr(cl, "CONTROL_PADDING", ["schedule"])
    assert cl.given_options(cl.LIBRARY_CONTROL, scenes) == {**default, "control_padding": "schedule"}
    assert "control_padding" not in cl.given_options(cl.LIBRARY, scenes)  # the call pads as it pads
    padding = cl.make_arm(cl.LIBRARY_CONTROL, scenes, 4, {cl.LIBRARY: dose}).callbacks[1]
    # the call's guide's stream, written out: seed + crc32 of the callback's name, one draw per padded batch
    stream = torch.Generator().manual_seed(4 + zlib.crc32(b"DScoreCallback"))
    images, labels = torch.rand(32, 3, 32, 32), torch.arange(32) % 10
    for epoch, p in enumerate([0.0, 0.0, 0.3, 0.6]):
        trainer = SimpleNamespace(current_epoch=epoch)
        padding.on_train_epoch_start(trainer, None)
        assert padding.guide.p == pytest.approx(p)
        batch = [images.clone(), labels]
        padding.on_train_batch_start(trainer, None, batch, 0)
        if p == 0:
            assert torch.equal(batch[0], images)  # unpadded, as the call trains before its first measurement
            continue
        with drawing_from(stream):
            expected = ScoreGuidedPadding(p=p, padding_mode="reflection")(images)
        assert torch.equal(batch[0], expected) and not torch.equal(batch[0], images)
    assert padding.applied == [0.0, 0.0, 0.3, 0.6]  # recorded as the call's dose holds its p


def test_the_library_control_s_label_names_draws_from_the_global_rng(monkeypatch: pytest.MonkeyPatch) -> None:
    split = (torch.rand(20, 3, 32, 32), torch.arange(20) % 10)
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    monkeypatch.setattr(cl, "CONTROL_DRAWS", ["global"])
    call = cl.given_options(cl.LIBRARY, scenes)
    assert "control_draws" not in call  # the call has no control draws
    assert cl.given_options(cl.LIBRARY_CONTROL, scenes) == {**call, "control_draws": "global"}  # not the default's
    dose = {"origins": {}, "strength": [0.0], "guides": {"dscore": [0.0]}}
    assert all(c.draws is None for c in cl.make_arm(cl.LIBRARY_CONTROL, scenes, 0, {cl.LIBRARY: dose}).callbacks[1:3])


def test_call_arguments_reach_the_call_and_its_control_and_label_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--call budget=0.5``: every detector of the call measures at that budget, the control is the call made with
    it (its noise, replay and keeper), and both arms' labels name it, so such a run is not merged with a default."""
    split = (torch.rand(20, 3, 32, 32), torch.arange(20) % 10)
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    default = cl.given_options(cl.LIBRARY, scenes)
    monkeypatch.setitem(cl.OPTIONS, "call", {"budget": 0.5})
    detectors = [c for c in cl.make_arm(cl.LIBRARY, scenes, 0, {}).callbacks if isinstance(c, cl.LOOP_TYPES)]
    assert len(detectors) == 5 and {c.budget for c in detectors} == {0.5}
    labelled = {**default, "call": {"budget": 0.5}}
    assert cl.given_options(cl.LIBRARY, scenes) == cl.given_options(cl.LIBRARY_CONTROL, scenes) == labelled
    assert cl._label(cl.LIBRARY, [{"options": labelled}]).endswith("--call budget=0.5]")
    seen: list[dict] = []
    call = cl.closed_loop_callbacks
    monkeypatch.setattr(cl, "closed_loop_callbacks", lambda **kw: seen.append(kw) or call(**kw))
    dose = {"origins": {}, "strength": [0.0], "guides": {"dscore": [0.0]}}
    cl.make_arm(cl.LIBRARY_CONTROL, scenes, 0, {cl.LIBRARY: dose})
    assert seen[0]["budget"] == 0.5


@pytest.mark.slow
def test_the_library_control_follows_the_call_s_dose_origin_by_origin() -> None:
    """A short fit of the call on small scenes, then of its control: as many cases per origin at the same validations,
    the robustness guide's strength and D-Score's rms ``p`` as the call applied them, as many rows replayed."""
    from dlguard.zoo import mnist_b

    # spurious corners: a small network passes the detectors' min_accuracy='auto' by the third epoch, so the call
    # deposits at its third validation and replays in the fourth epoch (plain scenes stay near chance that long)
    digits, labels, train_rows, val_rows, _ = cl._split()
    train, val = (cl.make_scenes(digits[rows], labels[rows], spurious=1.0, seed=i)
                  for i, rows in enumerate((train_rows[:600], val_rows[:200])))  # fmt: skip
    small = cl.Setting((train.images, train.labels), (val.images, val.labels), (val.images[:50], val.labels[:50]),
                       lambda: mnist_b(in_channels=3, input_size=32), val_masks=val.masks)  # fmt: skip
    doses: dict = {}
    _, measured = cl.fit(cl.LIBRARY, small, 0, 4, doses)
    _, control = cl.fit(cl.LIBRARY_CONTROL, small, 0, 4, doses)
    origins = measured["dose"]["origins"]
    assert sum(n for counts in origins.values() for n in counts.values()) > 0  # the call found failures
    stand_ins = control["dose"]["origins"]  # every detector's, those that found nothing with nothing
    assert set(origins) <= set(stand_ins) == {"robustness", "hda", "metamorphic", "relevancy"}
    assert stand_ins == {o: {e: n for e, n in origins.get(o, {}).items() if n} for o in stand_ins}
    assert control["dose"]["strength"] == pytest.approx(measured["dose"]["strength"], abs=1e-6)
    assert max(measured["dose"]["strength"]) > 0  # the robustness guide transformed batches in the last epoch
    p = measured["dose"]["guides"]["dscore"]
    assert control["dose"]["padding_p"] == pytest.approx((sum(v * v for v in p) / len(p)) ** 0.5)
    assert control["replayed"] == measured["replayed"] > 0
    assert measured["options"] == control["options"]


def test_a_call_run_is_kept_apart_from_a_default_run_of_the_same_seed() -> None:
    """``merge`` keys the call at ``--call budget=0.5`` by its label: beside the default call's seed 3, not a rerun of
    it (which would be refused as judging differently)."""

    def run(clean: float, call: dict | None) -> dict:
        options = {"properties": ["framework"], **({"call": call} if call else {})}
        return {"seed": 3, "epochs": 6, "options": options, "clean": clean}

    merged = cl.merge([{cl.LIBRARY: [run(0.97, None)]}, {cl.LIBRARY: [run(0.98, {"budget": 0.5})]}])
    assert set(merged) == {
        f"{cl.LIBRARY} [--properties framework]",
        f"{cl.LIBRARY} [--properties framework --call budget=0.5]",
    }
    assert [r["clean"] for r in merged[f"{cl.LIBRARY} [--properties framework --call budget=0.5]"]] == [0.98]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"budjet": 0.5}, "--call: .*budjet"),  # a typo, refused before any arm fits
        ({"budget": 0}, "--call: budget: expected a positive int"),
        ({"seed": 1}, r"--call: \['seed'\] are the benchmark's own"),
        ({"properties": None, "masks": "mask"}, r"--call: \['masks', 'properties'\] are the benchmark's own"),
    ],
)
def test_call_arguments_the_call_refuses_stop_the_benchmark_before_it_fits(call: dict, message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        cl.check_call(call)
    cl.check_call({"budget": 0.5, "max_sigma": 0.2})  # what the call takes passes


def _read_one(path: Path, epochs: int) -> dict[str, Any]:
    """The dose ``--dose_from path`` gives a seed (a one-dose file gives every seed the same)."""
    return cl.read_doses(path, epochs, [0])[0]


def _dose_file(tmp_path: Path, dose: Any) -> Path:
    path = tmp_path / "dose.json"
    path.write_text(json.dumps(dose))
    return path


def test_the_library_control_follows_a_dose_file_in_every_seed_without_the_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--dose_from FILE``: the control runs with no call before it, every seed at the file's dose (cases per origin
    and validation, the guide's strength, D-Score's rms ``p``), and its label names the file, so a merge keeps it
    apart from the control that followed its own seed's call."""
    split = (torch.rand(20, 3, 32, 32), torch.arange(20) % 10)
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    origins = {"robustness": {"0": 7}, "hda": {"1": 2, "3": 1}, "metamorphic": {"0": 3}}
    written = {"note": "by hand", "origins": origins, "strength": [0.0, 0.05, 0.05, 0.05],
               "guides": {"dscore": [0.0, 0.6, 0.0, 0.0]}}  # fmt: skip
    dose = _read_one(_dose_file(tmp_path, written), 4)
    assert "note" not in dose
    own = {"origins": {"robustness": {"0": 1}}, "strength": [0.3], "guides": {"dscore": [0.1]}}
    monkeypatch.setattr(cl, "DOSE_FROM", [("dose.json", cl.read_doses(_dose_file(tmp_path, written), 4, [3, 4]))])
    for seed, doses in ((3, {}), (4, {cl.LIBRARY: own})):  # the file's dose, even where the call's ran in the seed
        padding, robustness, hda, metamorphic, relevancy = cl.make_arm(
            cl.LIBRARY_CONTROL, scenes, seed, doses
        ).callbacks[1:6]
        assert [c.deposits for c in (robustness, hda, metamorphic, relevancy)] == [*origins.values(), {}]
        assert robustness.strength == [0.0, 0.05, 0.05, 0.05]
        assert padding.guide.p == pytest.approx((0.6**2 / 4) ** 0.5)
    labelled = cl.given_options(cl.LIBRARY_CONTROL, scenes)
    assert labelled == {**cl.given_options(cl.LIBRARY, scenes), "dose_from": "dose.json"}  # the call's has no file
    assert cl._label(cl.LIBRARY_CONTROL, [{"options": labelled}]).endswith("--dose_from dose.json]")
    # merged beside the control of the call's own dose, and paired with neither the call nor that control by itself
    call, own_control, fixed = (
        {"seed": 3, "epochs": 6, "options": options, "clean": 0.9, "mCA": 0.8, "pgd": 0.4}
        for options in (cl.given_options(cl.LIBRARY, scenes), cl.given_options(cl.LIBRARY, scenes), labelled)
    )
    merged = cl.merge([{cl.LIBRARY: [call], cl.LIBRARY_CONTROL: [own_control]}, {cl.LIBRARY_CONTROL: [fixed]}])
    fixed_key = next(key for key in merged if "dose_from" in key)
    assert len(merged) == 3 and merged[fixed_key] == [fixed]
    assert [pair[:2] for pair in cl.comparisons(merged)] == [
        (cl._label(cl.LIBRARY, [call]), cl._label(cl.LIBRARY_CONTROL, [own_control]))
    ]


def test_a_call_s_recorded_dose_reads_back_as_the_dose_the_control_follows(tmp_path: Path) -> None:
    """A dose as a call's record keeps it (its ``deposits`` too) reads as the three parts the control uses."""
    record = Path(__file__).parents[2] / "docs/results/closed_loop/scenes_resnet18_cpu_avx512.json"
    recorded = json.loads(record.read_text())[f"{cl.LIBRARY} [--properties framework capture exposure]"][0]["dose"]
    parts = {"origins": recorded["origins"], "strength": recorded["strength"]}
    assert _read_one(_dose_file(tmp_path, recorded), 6) == {
        **parts,
        "guides": {"dscore": recorded["guides"]["dscore"]},
    }
    written = Path(__file__).parents[2] / "docs/results/closed_loop/call_dose_mean_seeds_3_5.json"
    assert _read_one(written, 6)["strength"][1] == pytest.approx(0.0562)  # the committed file reads for 6 epochs


GOOD_DOSE = {"origins": {"hda": {"0": 2, "1": 0}}, "strength": [0.0, 0.1], "guides": {"dscore": [0.0, 0.2]}}


@pytest.mark.parametrize(
    ("dose", "message"),
    [
        ([1, 2], "has no origins, strength, guides"),
        ({k: v for k, v in GOOD_DOSE.items() if k != "strength"}, "has no strength"),
        ({**GOOD_DOSE, "origins": {"dscore": {"0": 1}}}, "origins must be a dict of robustness, hda"),
        ({**GOOD_DOSE, "origins": {"hda": {"0": -1}}}, r"origins\['hda'\] must map epochs '0' to '1'"),
        ({**GOOD_DOSE, "origins": {"hda": {"first": 1}}}, r"origins\['hda'\] must map epochs"),
        ({**GOOD_DOSE, "origins": {"hda": {"0": 1.5}}}, r"origins\['hda'\] must map epochs"),
        ({**GOOD_DOSE, "origins": {"hda": {"0": True}}}, r"origins\['hda'\] must map epochs"),
        ({**GOOD_DOSE, "origins": {"hda": {"2": 1}}}, r"origins\['hda'\] must map epochs '0' to '1' \(--epochs 2\)"),
        ({**GOOD_DOSE, "origins": {"hda": {"01": 1}}}, r"origins\['hda'\] must map epochs"),  # never a Trainer's
        ({**GOOD_DOSE, "strength": [0.0, 1.5]}, r"strength must be a list of 2 probabilities in \[0, 1\]"),
        ({**GOOD_DOSE, "strength": [0.0, float("nan")]}, "strength must be a list of 2 probabilities"),
        ({**GOOD_DOSE, "strength": [0.1]}, r"strength must be a list of 2 probabilities .* \(--epochs 2\)"),
        ({**GOOD_DOSE, "strength": 0.1}, "strength must be a list of 2 probabilities"),
        ({**GOOD_DOSE, "guides": {"dscore": [0.0, 0.1, 0.2]}}, r"guides\['dscore'\] must be a list of 2"),
        ({**GOOD_DOSE, "guides": {"dscore": [None, 0.0]}}, r"guides\['dscore'\] must be a list of 2"),
        ({**GOOD_DOSE, "guides": {"padding": [0.1]}}, "guides must hold dscore's p"),
    ],
)
def test_a_malformed_dose_file_is_refused_naming_what_is_wrong(tmp_path: Path, dose: Any, message: str) -> None:
    with pytest.raises(SystemExit, match=f"--dose_from: .*{message}"):
        _read_one(_dose_file(tmp_path, dose), 2)
    assert _read_one(_dose_file(tmp_path, GOOD_DOSE), 2) == GOOD_DOSE


def test_a_dose_file_of_one_dose_per_seed_gives_each_seed_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``{"seeds": {seed: dose}}``: each seed follows its own dose (the call's records, rerun without the call), one
    dose alone every seed; a seed without a dose, a malformed map or a malformed seed's dose is refused, named."""
    other = {**GOOD_DOSE, "strength": [0.0, 0.3], "origins": {"hda": {"1": 4}}}
    per_seed = {"note": "by hand", "seeds": {"3": GOOD_DOSE, "4": other}}
    doses = cl.read_doses(_dose_file(tmp_path, per_seed), 2, [4, 3])
    assert doses == {3: GOOD_DOSE, 4: other}
    split = (torch.rand(20, 3, 32, 32), torch.arange(20) % 10)
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    monkeypatch.setattr(cl, "DOSE_FROM", [("per_seed.json", doses)])
    for seed, dose in doses.items():  # the arm each seed fits follows that seed's dose
        robustness, hda = cl.make_arm(cl.LIBRARY_CONTROL, scenes, seed, {}).callbacks[2:4]
        assert (robustness.strength, hda.deposits) == (dose["strength"], dose["origins"]["hda"])
    assert cl.read_doses(_dose_file(tmp_path, other), 2, [3, 4]) == {3: other, 4: other}
    for given, message in [
        (per_seed, r"holds no dose for seeds \[5\] \(--seeds\); it has \['3', '4'\]"),
        ({"seeds": [GOOD_DOSE]}, r"seeds must map seeds \('3'\) to doses"),
        ({"seeds": {"three": GOOD_DOSE}}, r"seeds must map seeds \('3'\) to doses"),
        ({"seeds": {"3": GOOD_DOSE, "5": {**GOOD_DOSE, "strength": [0.5]}}},
         r"seeds\['5'\]'s strength must be a list of 2 probabilities"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit, match=f"--dose_from: .*{message}"):
            cl.read_doses(_dose_file(tmp_path, given), 2, [3, 5])


def test_a_control_at_each_seed_s_recorded_dose_follows_the_call_s_records(tmp_path: Path) -> None:
    """The per-seed file of the call's records at ``budget=0.15`` on seeds 3-5 (``call_doses_seeds_3_5.json``) is
    each seed's record's ``dose``, as the own-dose control followed it: its seed 3 is the seed-3 file's dose."""
    results = Path(__file__).parents[2] / "docs/results/closed_loop"
    records = json.loads((results / "scenes_resnet18_cpu_avx512.json").read_text())
    recorded = {run["seed"]: run["dose"] for run in records[f"{cl.LIBRARY} [--properties framework capture exposure]"]}
    doses = cl.read_doses(results / "call_doses_seeds_3_5.json", 6, [3, 4, 5])
    assert doses == {  # the records' three parts, as the control takes them (a record's "deposits" is read past)
        seed: {"origins": d["origins"], "strength": d["strength"], "guides": {"dscore": d["guides"]["dscore"]}}
        for seed, d in recorded.items()
        if seed in (3, 4, 5)
    }
    assert doses[3] == _read_one(results / "call_dose_seed3.json", 6)


def test_a_dose_file_the_run_cannot_follow_stops_the_benchmark_before_any_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Refused before a setting is built: no control among the arms (of a dose file, or of the call's padding
    schedule), a missing file, a dose for other epochs, and a dose file given to ``--results``, which fits nothing."""
    path = _dose_file(tmp_path, GOOD_DOSE)
    per_seed = tmp_path / "per_seed.json"
    per_seed.write_text(json.dumps({"seeds": {"3": GOOD_DOSE, "4": GOOD_DOSE}}))
    monkeypatch.setattr(cl, "SETTINGS", {name: pytest.fail for name in cl.SETTINGS})  # no setting may be built
    for name in ("DOSE_FROM", "COMBINED", "SPREAD", "CONTROL_DRAWS", "CONTROL_PADDING", "PROPERTIES",
                 "LIBRARY_PROPERTIES", "JUDGED", "ON", "VIOLATION_GUIDE"):  # fmt: skip
        monkeypatch.setattr(cl, name, list(getattr(cl, name)))  # main sets them in place: restored after the test
    monkeypatch.setattr(cl, "OPTIONS", {name: {} for name in cl.OPTIONS})
    for argv, message in [
        (["--setting", "scenes", "--arms", "plain", "--epochs", "2", "--dose_from", path],
         "--dose_from: only closed_loop_callbacks-open follows a dose file"),
        (["--setting", "scenes", "--arms", "closed_loop_callbacks", "--control_padding", "schedule"],
         "--control_padding: only closed_loop_callbacks-open pads on the call's schedule"),
        (["--dose_from", tmp_path / "missing.json"], r"--dose_from: cannot read a dose from .*missing\.json"),
        (["--dose_from", path], r"strength must be a list of 6 probabilities .* \(--epochs 6\)"),  # the default 6
        (["--results", path, "--dose_from", path], "--dose_from: a fit's flag; --results only reads"),
        (["--seeds", "3", "5", "--epochs", "2", "--dose_from", per_seed],
         r"holds no dose for seeds \[5\] \(--seeds\); it has \['3', '4'\]"),
    ]:  # fmt: skip
        monkeypatch.setattr(sys, "argv", ["closed_loop.py", *map(str, argv)])
        with pytest.raises(SystemExit, match=message):
            cl.main()


def test_a_dose_with_relevancy_cases_is_refused_on_a_setting_without_masks(monkeypatch: pytest.MonkeyPatch) -> None:
    """As object relevancy's arms are: its control could not deposit them (no objects to move); refused before a fit."""
    split = (torch.rand(20, 3, 32, 32), torch.arange(20) % 10)
    digits = cl.Setting(split, split, split, cl.resnet18_cifar)  # no val_masks: MNIST-like
    scenes = cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=torch.ones(20, 32, 32))
    dose = {**GOOD_DOSE, "origins": {"relevancy": {"1": 10}}}
    monkeypatch.setattr(cl, "DOSE_FROM", [("relevancy.json", {0: GOOD_DOSE, 1: dose})])  # one seed's is enough
    with pytest.raises(SystemExit, match=r"--dose_from relevancy\.json \(its relevancy cases\): needs scenes"):
        cl.arms_for(digits, [cl.LIBRARY_CONTROL], [])
    assert cl.arms_for(scenes, [cl.LIBRARY_CONTROL], []) == [cl.LIBRARY_CONTROL]
    monkeypatch.setattr(cl, "DOSE_FROM", [("none.json", {0: {**GOOD_DOSE, "origins": {"relevancy": {"1": 0}}}})])
    assert cl.arms_for(digits, [cl.LIBRARY_CONTROL], []) == [cl.LIBRARY_CONTROL]  # no case to deposit: runs


def _distinct_scenes() -> cl.Setting:
    """Twenty validation scenes, each one grey level (0.2 to 0.77) with label ``row % 10``, and square objects."""
    levels = 0.2 + 0.03 * torch.arange(20.0)
    pictures, labels = levels.view(20, 1, 1, 1).expand(20, 3, 32, 32).clone(), torch.arange(20) % 10
    masks = torch.zeros(20, 32, 32, dtype=torch.bool)
    masks[:, 8:24, 8:24] = True
    split = (pictures, labels)
    return cl.Setting(split, split, split, cl.resnet18_cifar, val_masks=masks)


def test_the_fill_deposits_as_many_random_cases_as_each_detector_found_with_their_true_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``closed_loop_callbacks-fill``: a detector's deposit of ``n`` failures becomes ``n`` cases of its control's
    generator on random validation rows, labelled as those rows are, drawn without moving training's RNG; the dose
    records the detector's count; the arm is labelled as the call is."""
    scenes = _distinct_scenes()
    arm = cl.make_arm(cl.LIBRARY_FILL, scenes, 3, {})
    call = cl.make_arm(cl.LIBRARY, scenes, 3, {})
    assert [type(c).__name__ for c in arm.callbacks] == [*(type(c).__name__ for c in call.callbacks[:-1]),
                                                         "RandomFill", "LibraryDose"]  # fmt: skip
    assert cl.given_options(cl.LIBRARY_FILL, scenes) == cl.given_options(cl.LIBRARY, scenes)
    monkeypatch.setattr(cl, "CONTROL_DRAWS", ["global"])  # a control's flags: the fill's guide is the call's own,
    monkeypatch.setattr(cl, "DOSE_FROM", [("doses.json", {})])  # and its dose its detectors'
    assert cl.given_options(cl.LIBRARY_FILL, scenes) == cl.given_options(cl.LIBRARY, scenes)
    assert cl.given_options(cl.LIBRARY_CONTROL, scenes)["dose_from"] == "doses.json"
    monkeypatch.setattr(cl, "DOSE_FROM", [])
    found = {type(c).__name__: c for c in arm.callbacks}
    bank, radius = found["FailureReplay"].bank, found["HDACallback"].radius
    arm.dose.on_validation_epoch_start(SimpleNamespace(current_epoch=2), None)  # type: ignore[arg-type]
    state = torch.get_rng_state()
    planted = torch.zeros(7, 3, 32, 32), torch.full((7,), 9)  # what a detector found: black, all labelled 9
    for origin in ("hda", "robustness", "metamorphic", "relevancy"):
        bank.add(*planted, origin=origin)
    assert torch.equal(torch.get_rng_state(), state)  # the cases drew from their own generators
    assert arm.dose.record()["origins"] == {o: {"2": 7} for o in ("hda", "robustness", "metamorphic", "relevancy")}
    levels = scenes.val[0][:, 0, 0, 0]
    for origin in ("hda", "robustness", "metamorphic"):
        cases, labels = bank.inputs(origin), bank.labels(origin)
        assert len(labels) == 7 and cases.amax() > 0, origin  # not the planted failures
        if origin == "hda":  # uniform noise in the radius ball around a validation row, with that row's label
            rows = (cases.mean((1, 2, 3))[:, None] - levels).abs().argmin(1)
            assert ((cases - levels[rows].view(-1, 1, 1, 1)).abs() <= radius + 1e-6).all()
            assert torch.equal(labels, scenes.val[1][rows])
        assert set(labels.tolist()) <= set(range(10)) and (labels != 9).any(), origin
    assert len(bank.labels("relevancy")) == 7
    cases = bank.inputs("relevancy")  # the object's grey level inside the square, a fresh background outside
    rows = (cases[:, :, 8:24, 8:24].mean((1, 2, 3))[:, None] - levels).abs().argmin(1)
    assert torch.equal(bank.labels("relevancy"), scenes.val[1][rows])
    assert not torch.equal(cases[:, :, :8], torch.zeros_like(cases[:, :, :8]))


def test_the_fill_s_robustness_guide_applies_its_strength_evenly() -> None:
    """Its proposal's mean in every cell, so every class and property is transformed at the strength detection set."""
    guide = next(c for c in cl.make_arm(cl.LIBRARY_FILL, _distinct_scenes(), 0, {}).callbacks
                 if isinstance(c, cl.RobustnessCallback)).guide  # fmt: skip
    proposal = torch.rand(10, len(guide.properties)) * torch.arange(1.0, 11.0)[:, None] / 10  # class by class
    reference = cl.ErrorGuidedAugmentation(guide.properties, strength=guide.strength)
    reference.set_proposal(proposal)
    guide.set_proposal(proposal)
    assert torch.allclose(guide.proposal, torch.full_like(guide.proposal, float(reference.proposal.mean())))
    assert cl.guide_p(guide) == pytest.approx(cl.guide_p(reference))
    with pytest.raises(ValueError):  # the cells' own checks still run
        guide.set_proposal(torch.full((10, len(guide.properties)), float("nan")))


def test_the_fill_is_paired_with_the_call_seed_by_seed() -> None:
    results = {
        cl.LIBRARY: [{"seed": 3, "clean": 0.97, "pgd": 0.44, "mCA": 0.86}],
        cl.LIBRARY_FILL: [{"seed": 3, "clean": 0.98, "pgd": 0.47, "mCA": 0.87}],
    }
    assert "| closed_loop_callbacks-fill − closed_loop_callbacks | pgd | +0.030 ± nan | 1 of 1 |" in cl.paired(results)
    assert not any("closed_loop_callbacks − closed_loop_callbacks-fill" in line for line in cl.paired(results))
    results[cl.LIBRARY_CONTROL] = [
        {"seed": 3, "clean": 0.98, "pgd": 0.49, "mCA": 0.87}
    ]  # the call's pair, not the fill's
    assert not any("closed_loop_callbacks-fill − closed_loop_callbacks-open" in line for line in cl.paired(results))
    assert any("closed_loop_callbacks − closed_loop_callbacks-open" in line for line in cl.paired(results))


@pytest.mark.slow
def test_a_fit_of_the_fill_replays_random_cases_as_many_as_its_detectors_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short fit of the fill on small spurious scenes: its detectors find failures, the bank holds as many cases
    per origin (the newest ``capacity``), none of them a failure a detector found, and the guide's table is even."""
    from dlguard.zoo import mnist_b

    digits, labels, train_rows, val_rows, _ = cl._split()
    train, val = (cl.make_scenes(digits[rows], labels[rows], spurious=1.0, seed=i)
                  for i, rows in enumerate((train_rows[:600], val_rows[:200])))  # fmt: skip
    small = cl.Setting((train.images, train.labels), (val.images, val.labels), (val.images[:50], val.labels[:50]),
                       lambda: mnist_b(in_channels=3, input_size=32), val_masks=val.masks)  # fmt: skip
    failures: list[torch.Tensor] = []  # what the detectors hand the bank, before the fill replaces it
    fill = cl.library_fill

    def spied(call: list, setting: cl.Setting, seed: int) -> list:
        callbacks = fill(call, setting, seed)
        bank = next(c for c in callbacks if isinstance(c, cl.FailureReplay)).bank
        filled = bank.add
        bank.add = lambda inputs, labels, origin: failures.append(inputs.clone()) or filled(inputs, labels, origin)
        return callbacks

    monkeypatch.setattr(cl, "library_fill", spied)
    kept: list = []
    _, record = cl.fit(cl.LIBRARY_FILL, small, 0, 4, {}, keep=kept)
    origins = record["dose"]["origins"]
    assert sum(n for counts in origins.values() for n in counts.values()) == sum(map(len, failures)) > 0
    assert record["replayed"] > 0 and record["options"] == cl.given_options(cl.LIBRARY, small)
    callbacks = {type(c).__name__: c for c in kept[0].callbacks}
    bank = callbacks["FailureReplay"].bank
    for origin, counts in origins.items():  # an origin whose detector found nothing has nothing in the bank
        assert bank.origins().get(origin, 0) == min(bank.capacity, sum(counts.values())), origin
    found = torch.cat(failures).flatten(1)
    for origin in bank.origins():  # random cases, not the detectors' failures: noise and fresh backgrounds never
        same = (torch.cdist(bank.inputs(origin).flatten(1), found) < 1e-4).any(1).float().mean()  # are one, a
        assert same < (0.1 if origin in ("robustness", "metamorphic") else 1e-9), (origin, same)  # transform seldom
    proposal = callbacks["RobustnessCallback"].guide.proposal
    assert proposal.numel() and torch.allclose(proposal, proposal.mean().expand_as(proposal))


def test_the_fill_draws_the_cases_the_call_s_control_draws_at_the_same_count() -> None:
    """At one validation, ``n`` failures of an origin become exactly the ``n`` cases the control's stand-in of that
    detector deposits at a dose of ``n`` there (the same generator, the same row seed); a measurement that found
    nothing is passed on as it is, and draws nothing."""
    scenes = _distinct_scenes()
    origins = ("robustness", "hda", "metamorphic", "relevancy")
    fill = cl.make_arm(cl.LIBRARY_FILL, scenes, 5, {})
    bank = next(c for c in fill.callbacks if isinstance(c, cl.FailureReplay)).bank
    randomly = next(c for c in fill.callbacks if isinstance(c, cl.RandomFill))
    drawn = {origin: generator.get_state() for origin, generator in randomly.generators.items()}
    for origin in origins:
        bank.add(torch.zeros(0, 3, 32, 32), torch.zeros(0, dtype=torch.long), origin=origin)
    assert all(torch.equal(randomly.generators[o].get_state(), drawn[o]) for o in origins)  # nothing drawn
    assert len(bank) == 0
    dose = {"origins": {o: {"2": 6} for o in origins}, "strength": [0.0] * 3, "guides": {"dscore": [0.0] * 3}}
    control = cl.make_arm(cl.LIBRARY_CONTROL, scenes, 5, {cl.LIBRARY: dose})
    validation = SimpleNamespace(current_epoch=2, sanity_checking=False)
    for stand_in in [c for c in control.callbacks if isinstance(c, cl.OpenLoop) and c.bank is not None]:
        stand_in.on_validation_epoch_end(validation, None)  # type: ignore[arg-type]
        bank.add(torch.zeros(6, 3, 32, 32), torch.full((6,), 9), origin=stand_in.origin)
        assert torch.equal(bank.inputs(stand_in.origin), stand_in.bank.inputs(stand_in.origin)), stand_in.origin
        assert torch.equal(bank.labels(stand_in.origin), stand_in.bank.labels(stand_in.origin)), stand_in.origin
