"""The closed-loop benchmark's controls: the same dose as their loop, without detection (benchmarks/closed_loop.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import closed_loop as cl  # a script beside the package, not part of it

from dlguard.callbacks.base import DEFAULT_BUDGET
from dlguard.generate import dscore_test
from dlguard.metrics.functional import d_score
from dlguard.probes import ModelAdapter


@pytest.fixture(scope="module")
def setting() -> cl.Setting:
    full = cl.mnist_setting()
    return cl.Setting(
        (full.train[0][:1500], full.train[1][:1500]), (full.val[0][:300], full.val[1][:300]), full.test, full.make_net
    )


def test_the_splits_never_overlap() -> None:
    _, _, train, val, test = cl._split()
    assert len(train) == 3500 and len(val) == 1000 and len(test) == 500
    assert not (set(train.tolist()) & set(val.tolist()) or set(val.tolist()) & set(test.tolist()))
    assert not set(train.tolist()) & set(test.tolist())


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["metamorphic", "robustness", "metamorphic+guide"])
def test_the_open_loop_control_follows_its_loop_s_dose(
    setting: cl.Setting, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, _, guided = loop.partition("+")
    monkeypatch.setattr(cl, "VIOLATION_GUIDE", [True] if guided else [])
    doses: dict = {}
    _, measured = cl.fit(loop, setting, 0, 3, doses)
    _, control = cl.fit(f"{loop}-open", setting, 0, 3, doses)
    deposits = measured["dose"]["deposits"]
    assert sum(deposits.values()) > 0  # the loop found failures, so the comparison means something
    # as many cases at the same validations, so the bank grows alike and the replay dose is the same
    assert {e: n for e, n in deposits.items() if n} == control["dose"]["deposits"]
    assert control["replayed"] == measured["replayed"] > 0
    if (
        loop == "robustness" or guided
    ):  # the guide's strength as applied, epoch by epoch, evenly over classes and properties
        assert control["dose"]["strength"] == pytest.approx(measured["dose"]["strength"], abs=1e-6)
        assert max(measured["dose"]["strength"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["robustness", "metamorphic+guide"])
def test_a_control_that_replays_nothing_with_its_loop_s_even_guide_trains_the_loop_s_model(
    setting: cl.Setting, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # common random numbers: with the choice taken out (every cell at the mean, nothing replayed) loop and
    # control differ in nothing, so they must train the same weights; drawing from the global RNG, they do not
    loop, _, guided = loop.partition("+")
    monkeypatch.setattr(cl, "VIOLATION_GUIDE", [True] if guided else [])
    monkeypatch.setattr(cl, "SPREAD", ["even"])
    monkeypatch.setitem(cl.OPTIONS, "replay", {"fraction": 0.0})
    weights = {}
    for draws in ("loop", "global"):
        monkeypatch.setattr(cl, "CONTROL_DRAWS", [draws])
        doses: dict = {}
        looped, measured = cl.fit(loop, setting, 0, 3, doses)
        control, _ = cl.fit(f"{loop}-open", setting, 0, 3, doses)
        assert max(measured["dose"]["strength"]) > 0  # the guide transformed batches in two of the three epochs
        weights[draws] = [
            torch.equal(a, b) for a, b in zip(looped.state_dict().values(), control.state_dict().values(), strict=True)
        ]
    assert all(weights["loop"]) and not all(weights["global"])


def test_the_attack_is_one() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    x, y = torch.rand(64, 1, 4, 4), torch.randint(3, (64,))
    adversarial = cl.attack(net, x, y, 0.1, 10)
    assert float((adversarial - x).abs().max()) <= 0.1 + 1e-6 and bool(((adversarial >= 0) & (adversarial <= 1)).all())
    fgsm = cl.attack(net, x, y, 0.1, 1)
    with torch.no_grad():
        losses = [float(torch.nn.functional.cross_entropy(net(inputs), y)) for inputs in (x, fgsm, adversarial)]
    assert losses[0] < losses[1] < losses[2]  # FGSM raises the loss, PGD's ten steps more


@pytest.mark.parametrize("cosine", [False, True])
def test_the_rate_decays_to_zero_only_where_the_setting_asks(setting: cl.Setting, cosine: bool) -> None:
    # the RGB scenes judge the last epoch's model: decayed on a cosine, it is a settled one
    few = cl.Setting((setting.train[0][:128], setting.train[1][:128]), setting.val, setting.test, setting.make_net,
                     cosine=cosine)  # fmt: skip
    model, _ = cl.fit("plain", few, 0, 2, {})
    rates = [group["lr"] for group in model.trainer.optimizers[0].param_groups]
    assert rates == pytest.approx([0.0] if cosine else [1e-3], abs=1e-12)


@pytest.mark.slow
def test_only_the_rgb_scenes_decay_the_rate() -> None:
    assert cl.scenes_setting().cosine and not cl.mnist_setting().cosine


def test_the_loops_see_the_model_the_judge_sees(setting: cl.Setting) -> None:
    # a setting whose model expects normalised inputs: the Classifier normalises, and every callback of
    # every loop must probe exactly that function, not the network behind a second normalisation
    normalised = cl.Setting(setting.train, setting.val, setting.test, setting.make_net, preprocess=cl.Normalize())
    model = cl.Classifier(normalised.make_net(), normalised.preprocess, None).eval()
    x = setting.test[0][:8].expand(-1, 3, -1, -1)
    model.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 28 * 28, 10))
    probes = [c for c in cl.loop_arm("dlguard", normalised, 0).callbacks if hasattr(c, "preprocess")]
    assert len(probes) == 4
    with torch.no_grad():
        for callback in probes:
            seen = ModelAdapter(model, callback.preprocess, callback.output_transform).logits(x)
            torch.testing.assert_close(seen, model(x))


def test_options_reach_the_callbacks_and_combine_picks_the_loops(
    setting: cl.Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(cl.OPTIONS, "metamorphic", {"budget": None})
    monkeypatch.setitem(cl.OPTIONS, "bank", {"capacity": 1024})
    monkeypatch.setattr(cl, "COMBINED", ["metamorphic", "hda"])
    callbacks = cl.loop_arm("dlguard", setting, 0).callbacks
    probes = {type(c).__name__: c for c in callbacks if hasattr(c, "preprocess")}
    assert set(probes) == {"MetamorphicCallback", "HDACallback"}
    assert probes["MetamorphicCallback"].budget is None and probes["HDACallback"].budget == DEFAULT_BUDGET
    (replay,) = [c for c in callbacks if isinstance(c, cl.FailureReplay)]
    assert replay.bank.capacity == 1024 and replay.bank is probes["HDACallback"].bank


def test_properties_give_the_robustness_loop_its_guide_and_its_control_one_union_of_presets(
    setting: cl.Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cl, "PROPERTIES", ["framework", "label_preserving"])
    drawn: list[list[str]] = []
    monkeypatch.setattr(cl, "random_properties", lambda props: drawn.append([p.name for p in props]))
    (callback,) = [c for c in cl.loop_arm("robustness", setting, 0).callbacks if isinstance(c, cl.RobustnessCallback)]
    control = cl.open_arm("robustness-open", setting, 0, {"deposits": {}, "strength": [0.1]}).callbacks[0]
    # by hand: the trio, then label_preserving's transformations less its rotation and brightness (taken)
    union = ["noise", "rotation", "brightness", "translation", "scale", "shear", "contrast", "gaussian_blur"]
    union += ["fog", "rain"]
    for properties in (callback.properties, callback.guide.properties, control.guide.properties):
        assert [p.name for p in properties] == union
    assert drawn == [union]
    (brightness,) = [p for p in callback.properties if p.name == "brightness"]
    assert brightness.levels[-1] == 3.0  # the trio's multiplicative brightness, not the shift of label_preserving


@pytest.mark.parametrize("spread", cl.SPREADS)
def test_spread_says_what_the_guides_keep_of_a_proposal(
    setting: cl.Setting, monkeypatch: pytest.MonkeyPatch, spread: str
) -> None:
    monkeypatch.setattr(cl, "SPREAD", [spread])
    monkeypatch.setattr(cl, "VIOLATION_GUIDE", [True])
    monkeypatch.setattr(cl, "COMBINED", ["robustness", "metamorphic"])
    callbacks = cl.loop_arm("dlguard", setting, 0).callbacks
    guides = [c.guide for c in callbacks if type(c).__name__ in ("RobustnessCallback", "MetamorphicCallback")]
    assert len(guides) == 2 and all(isinstance(g, cl.SpreadGuide) == (spread != "cell") for g in guides)
    proposal = [[0.0, 1.0, 0.5], [0.5, 0.0, 0.25]]  # 2 classes x the robustness guide's 3 properties
    guides[0].set_proposal(proposal)
    expected = {  # by hand: the cells, the column means, the mean
        "cell": proposal,
        "property": [[0.25, 0.5, 0.375]] * 2,
        "even": [[0.375] * 3] * 2,
    }[spread]
    assert guides[0].proposal.tolist() == expected
    with pytest.raises(ValueError, match="proposal"):  # cells out of range are refused before any averaging
        guides[0].set_proposal([[-0.5, 1.0, 0.5], [1.5, 0.0, 0.5]])


def test_a_control_deposits_as_many_as_its_loop_even_beyond_the_split() -> None:
    # a loop measuring every epoch can deposit more failures than the validation split has inputs
    source = (torch.rand(10, 1, 8, 8), torch.arange(10))
    bank = cl.FailureBank(capacity=100)
    control = cl.OpenLoop(source, lambda x, y, model: x, {"0": 25}, bank)
    trainer = SimpleNamespace(current_epoch=0, sanity_checking=False)
    control.on_validation_epoch_end(trainer, torch.nn.Identity())
    assert control.deposited == {"0": 25} and len(bank) == 25
    # every input twice before any a third time: whole passes over the split, then part of one more
    assert sorted(torch.bincount(bank.labels("open-loop"), minlength=10).tolist()) == [2] * 5 + [3] * 5


def test_below_the_split_a_control_draws_one_permutation_of_it() -> None:
    source = (torch.rand(10, 1, 8, 8), torch.arange(10))
    bank = cl.FailureBank(capacity=100)
    control = cl.OpenLoop(source, lambda x, y, model: x, {"0": 6}, bank, seed=3)
    control.on_validation_epoch_end(SimpleNamespace(current_epoch=0, sanity_checking=False), torch.nn.Identity())
    rows = torch.randperm(10, generator=torch.Generator().manual_seed(3))[:6]
    assert torch.equal(bank.labels("open-loop"), rows) and torch.equal(bank.inputs("open-loop"), source[0][rows])


def test_the_judge_s_d_score_translates_pixels_before_the_normalisation(setting: cl.Setting) -> None:
    # the judged Classifier normalises in forward; D-Score must equal the one of its network behind
    # preprocess, with accuracies recomputed here from the run's logits and the functional formula
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(10))
    x, y = setting.test[0][:32].expand(-1, 3, -1, -1).contiguous(), setting.test[1][:32]
    model = cl.Classifier(net, cl.Normalize(), None).eval()
    model(x)  # materialise the lazy layer
    run = dscore_test(ModelAdapter(net, preprocess=cl.Normalize()), x, y)
    accuracy = lambda logits: (logits.argmax(-1) == run.target).double().mean(-1)  # noqa: E731
    expected = d_score(accuracy(run.logits), accuracy(run.mutant_logits), accuracy(run.translated_logits), 10)
    assert cl.d_score_of(model, x, y) == pytest.approx(float(expected.d_score), abs=1e-9)


def test_the_relevancy_control_puts_random_digits_on_fresh_backgrounds() -> None:
    # as many rows as the loop deposited: ceil(25 / 10) = 3 random scenes' digits, on 10 backgrounds each
    digits, labels = cl.embedded_mnist()
    scenes = cl.make_scenes(digits[:12], labels[:12], seed=0)
    bank = cl.FailureBank(capacity=100)
    control = cl.RelevancyOpenLoop((scenes.images, scenes.labels), scenes.masks, {"0": 25}, bank, fresh=10, seed=1)
    control.on_validation_epoch_end(SimpleNamespace(current_epoch=0, sanity_checking=False), torch.nn.Identity())
    assert control.deposited == {"0": 25} and len(bank) == 25
    rows = torch.randperm(12, generator=torch.Generator().manual_seed(1))[:3]
    assert torch.equal(bank.labels("open-loop"), scenes.labels[rows].repeat_interleave(10)[:25])
    cases, sources = bank.inputs("open-loop"), scenes.images[rows].repeat_interleave(10, 0)[:25]
    masks = scenes.masks[rows].repeat_interleave(10, 0)[:25, None].expand_as(cases)
    same = (cases - sources).abs() < 1e-6
    assert float(same[masks].float().mean()) > 0.5  # the digit stays (its seam is blurred)
    assert float(same[~masks].float().mean()) < 0.05  # the background is new
    assert not torch.equal(cases[0], cases[1])  # each copy of a digit on a background of its own


def test_object_relevancy_needs_scenes_with_masks(setting: cl.Setting, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match=r"--arms relevancy: needs scenes with object masks"):
        cl.loop_arm("relevancy", setting, 0)
    probes = [type(c).__name__ for c in cl.loop_arm("dlguard", setting, 0).callbacks]
    assert "ObjectRelevancyCallback" not in probes and "MetamorphicCallback" in probes
    # the default arms are the setting's; asking for relevancy without masks fails before any fit
    assert cl.arms_for(setting, None, []) == [arm for arm in cl.ARMS if not arm.startswith("relevancy")]
    with pytest.raises(SystemExit, match=r"^--arms relevancy-open, --combine relevancy: needs scenes"):
        cl.arms_for(setting, ["plain", "relevancy-open"], ["relevancy"])
    masked = cl.Setting(setting.train, setting.val, setting.test, setting.make_net, val_masks=torch.ones(300, 28, 28))
    assert cl.arms_for(masked, None, []) == list(cl.ARMS) and "relevancy-open" in cl.ARMS
    monkeypatch.setattr(cl, "COMBINED", ["relevancy"])
    with pytest.raises(SystemExit, match=r"--combine relevancy: needs scenes"):
        cl.loop_arm("dlguard", setting, 0)
    assert isinstance(
        cl.loop_arm("metamorphic", setting, 0).callbacks[0], cl.MetamorphicCallback
    )  # the others: as they were


@pytest.mark.slow
def test_the_spurious_scenes_plant_a_shortcut_the_shuffled_test_removes() -> None:
    spurious = cl.SETTINGS["spurious"]()
    images, labels = spurious.test
    assert spurious.shuffled is not None and spurious.shuffled.shape == images.shape == (500, 3, 32, 32)
    assert spurious.val_masks is not None and spurious.val_masks.shape == (1000, 32, 32)
    # a corner pixel of the background tells the label in the spurious scenes, not in the shuffled ones
    corner = lambda x: x[:, :, :3, :3].flatten(1).mean(1)  # noqa: E731

    def predictability(x: torch.Tensor) -> float:  # nearest class mean of the corner, on the same scenes
        means = torch.stack([corner(x)[labels == c].mean() for c in range(10)])
        return float(((corner(x)[:, None] - means).abs().argmin(1) == labels).float().mean())

    assert predictability(images) > 2 * predictability(spurious.shuffled)


@pytest.mark.slow
def test_the_relevancy_control_follows_its_loop_s_dose(monkeypatch: pytest.MonkeyPatch) -> None:
    from dlguard.zoo import mnist_b

    digits, labels, train_rows, val_rows, _ = cl._split()  # stratified (the embedded digits come sorted)
    train, val = (cl.make_scenes(digits[rows], labels[rows], spurious=1.0, seed=i)
                  for i, rows in enumerate((train_rows[:600], val_rows[:200])))  # fmt: skip
    small = cl.Setting((train.images, train.labels), (val.images, val.labels), (val.images[:50], val.labels[:50]),
                       lambda: mnist_b(in_channels=3, input_size=32), val_masks=val.masks)  # fmt: skip
    options = {"budget": None, "probe_size": 20, "fresh_backgrounds": 3, "p_high": 0.3, "min_accuracy": None}
    monkeypatch.setitem(cl.OPTIONS, "relevancy", options)  # a weak, barely confident model still deposits
    doses: dict = {}
    _, measured = cl.fit("relevancy", small, 0, 3, doses)
    _, control = cl.fit("relevancy-open", small, 0, 3, doses)
    deposits = measured["dose"]["deposits"]
    assert sum(deposits.values()) > 0 and all(n % 3 == 0 for n in deposits.values())  # 3 backgrounds per digit
    assert {e: n for e, n in deposits.items() if n} == control["dose"]["deposits"]
    assert control["replayed"] == measured["replayed"] > 0
    assert measured["options"] == control["options"] == {"relevancy": dict(sorted(options.items()))}  # recorded
    assert (measured["threads"], measured["accelerator"], measured["epochs"]) == (torch.get_num_threads(), "cpu", 3)
    assert measured["cpu_seconds"] > 0 and measured["seconds"] > 0
    assert measured["machine"] == cl.machine("cpu") and measured["machine"].endswith(f", torch {torch.__version__}")


def test_a_run_records_the_flags_other_than_the_defaults_that_changed_it(
    setting: cl.Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(cl.OPTIONS, "metamorphic", {"budget": None})
    monkeypatch.setitem(cl.OPTIONS, "bank", {"capacity": 1024})
    monkeypatch.setitem(cl.OPTIONS, "hda", {"radius": (0.1,)})  # a tuple, kept as JSON keeps it
    monkeypatch.setitem(cl.OPTIONS, "relevancy", {"budget": None})  # MNIST has no relevancy loop to take it
    monkeypatch.setitem(cl.OPTIONS, "oracle", {"fraction": 0.25})
    monkeypatch.setattr(cl, "SPREAD", ["even"])
    monkeypatch.setattr(cl, "CONTROL_DRAWS", ["global"])
    metamorphic, bank = {"metamorphic": {"budget": None}}, {"bank": {"capacity": 1024}}
    expected = {
        "plain": {},
        "augmix": {},
        "oracle": {"oracle": {"fraction": 0.25}},
        "metamorphic": {**metamorphic, **bank},  # no guide: --spread does not reach it
        "metamorphic-open": {**metamorphic, **bank},  # nor --control_draws its control
        "robustness": {"spread": "even", **bank},
        "robustness-open": {"spread": "even", **bank, "control_draws": "global"},
        "dscore": {},
        "dscore-open": {"control_draws": "global"},
        "hda-pgd": {"hda": {"radius": [0.1]}, **bank},
        "dlguard": {"spread": "even", **bank, "hda": {"radius": [0.1]}, **metamorphic},
    }
    assert {arm: cl.given_options(arm, setting) for arm in expected} == expected
    monkeypatch.setattr(cl, "VIOLATION_GUIDE", [True])  # the metamorphic loop's guide takes --spread, and draws
    assert cl.given_options("metamorphic-open", setting) == {
        **metamorphic, "violation_guide": {}, "spread": "even", **bank, "control_draws": "global"
    }  # fmt: skip
    monkeypatch.setattr(cl, "COMBINED", ["dscore"])
    assert cl.given_options("dlguard", setting) == {}
    monkeypatch.setitem(cl.OPTIONS, "hda", {"k": 50, "budget": None})  # keys sorted: either order labels alike
    assert cl._flags(cl.given_options("hda", setting)) == "--hda budget=None k=50 --bank capacity=1024"
    flags = "--spread even --bank capacity=1024 --hda radius=[0.1] --metamorphic budget=None"
    assert cl._flags(expected["dlguard"]) == flags  # as the command line gives them, so the tables name them


def test_runs_with_other_flags_merge_apart_and_each_loop_meets_the_control_that_took_its_flags() -> None:
    """docs/closed_loop.md's "Measuring every epoch, on the scenes": budget=None beside the default budget."""
    flagged = {"options": {"metamorphic": {"budget": None}}, "on": "augmix"}
    default = {
        "plain": [{"seed": 0, "mCA": 0.66, "pgd": 0.42}],
        "metamorphic": [{"seed": 0, "mCA": 0.72, "violation_rate": 0.03, "on": "augmix"}],
        "metamorphic-open": [{"seed": 0, "mCA": 0.70, "violation_rate": 0.05, "on": "augmix"}],
    }
    drawing = {"options": {**flagged["options"], "control_draws": "global"}}  # follows the same loop's dose
    every_epoch = {
        "plain": [{"seed": 0, "mCA": 0.66, "pgd": 0.42}],  # takes no flag: the same arm, run again
        "metamorphic": [{"seed": 0, "mCA": 0.75, "violation_rate": 0.02, **flagged}],
        "metamorphic-open": [{"seed": 0, "mCA": 0.71, "violation_rate": 0.06, **flagged, **drawing}],
        "hda": [{"seed": 0, "mCA": 0.60, "R_g": 0.5, "pgd": 0.47, "on": "augmix"}],
    }
    merged = cl.merge([default, every_epoch])
    assert list(merged) == [
        "plain",
        "hda on augmix",
        "metamorphic on augmix",
        "metamorphic on augmix [--metamorphic budget=None]",
        "metamorphic-open on augmix",
        "metamorphic-open on augmix [--metamorphic budget=None --control_draws global]",
    ]  # ARMS' order by name; a name's variants in the files' order
    assert cl.paired(merged)[2:] == [  # by hand: each loop against the control of its own flags only
        "| metamorphic on augmix − metamorphic-open on augmix | mCA | +0.020 ± nan | 1 of 1 |",
        "| metamorphic on augmix − metamorphic-open on augmix | violation_rate ↓ | -0.020 ± nan | 1 of 1 |",
        "| metamorphic on augmix [--metamorphic budget=None] − metamorphic-open on augmix [--metamorphic budget=None"
        " --control_draws global] | mCA | +0.040 ± nan | 1 of 1 |",
        "| metamorphic on augmix [--metamorphic budget=None] − metamorphic-open on augmix [--metamorphic budget=None"
        " --control_draws global] | violation_rate ↓ | -0.040 ± nan | 1 of 1 |",
        "| hda on augmix − plain | pgd | +0.050 ± nan | 1 of 1 |",  # the augmentation under it, named
    ]
    # one run's own file, keyed by the arms' names: both sides of a row named with their flags all the same
    assert cl.paired(every_epoch)[2:4] == cl.paired(merged)[4:6]


def test_the_paired_table_differences_each_seed_s_runs() -> None:
    results = {
        "plain": [{"clean": 0.90, "pgd": 0.50, "mCA": 0.80}, {"clean": 0.94, "pgd": 0.60, "mCA": 0.82}],
        "noise": [{"mCA": 0.80, "pgd": 0.70}, {"mCA": 0.81, "pgd": 0.70}],
        "augmix": [{"mCA": 0.85, "pgd": 0.55}, {"mCA": 0.83, "pgd": 0.50}],  # the better mean mCA: the reference
        "metamorphic": [{"mCA": 0.84, "violation_rate": 0.05}, {"mCA": 0.86, "violation_rate": 0.07}],
        "metamorphic-open": [{"mCA": 0.85, "violation_rate": 0.06}, {"mCA": 0.84, "violation_rate": 0.10}],
        "dlguard": [{"clean": 0.91, "mCA": 0.88, "pgd": 0.52}, {"clean": 0.92, "mCA": 0.82, "pgd": 0.58}],
        "hda": [{"mCA": 0.81, "R_g": 0.9, "pgd": 0.55}, {"mCA": 0.82, "R_g": 0.9, "pgd": 0.58}],  # no control here
        "oracle": [{"mCA": 0.95, "pgd": 0.9}, {"mCA": 0.90, "pgd": 0.9}],  # a reference, never the best standard one
    }
    rows = cl.paired(results)[2:]
    # per-seed differences (a, b): mean (a + b) / 2, standard error |a - b| / 2, seeds where the arm did better
    assert rows == [
        "| metamorphic − metamorphic-open | mCA | +0.005 ± 0.015 | 1 of 2 |",  # -0.01, +0.02
        "| metamorphic − metamorphic-open | violation_rate ↓ | -0.020 ± 0.010 | 2 of 2 |",  # -0.01, -0.03: lower
        "| hda − plain | pgd | +0.015 ± 0.035 | 1 of 2 |",  # +0.05, -0.02
        "| dlguard − augmix | mCA | +0.010 ± 0.020 | 1 of 2 |",  # +0.03, -0.01
        "| dlguard − augmix | pgd | +0.025 ± 0.055 | 1 of 2 |",  # -0.03, +0.08
        "| dlguard − plain | clean | -0.005 ± 0.015 | 1 of 2 |",  # +0.01, -0.02
        "| dlguard − plain | pgd | +0.000 ± 0.020 | 1 of 2 |",  # +0.02, -0.02
        "| dlguard − oracle | mCA | -0.075 ± 0.005 | 0 of 2 |",  # -0.07, -0.08
    ]
    # a --pair repeating a comparison adds no row (augmix records no clean accuracy: nothing new to add)
    assert cl.paired(results, [("dlguard", "augmix")])[2:] == rows
    plus_clean = {**results, "augmix": [{**run, "clean": 0.95} for run in results["augmix"]]}
    assert cl.paired(plus_clean, [("dlguard", "augmix")])[2:] == [
        *rows,
        "| dlguard − augmix | clean | -0.035 ± 0.005 | 0 of 2 |",
    ]


def test_the_paired_table_pairs_runs_by_seed_where_they_record_it() -> None:
    """A file merged from processes may hold an arm's seeds in another order or miss one."""
    results = {
        "hda": [{"seed": 2, "mCA": 0.90, "R_g": 0.5}, {"seed": 0, "mCA": 0.80, "R_g": 0.7}],
        "hda-open": [
            {"seed": 0, "mCA": 0.70, "R_g": 0.6},
            {"seed": 1, "mCA": 0.10, "R_g": 0.0},
            {"seed": 2, "mCA": 0.95, "R_g": 0.4},
        ],
    }
    # seed 2: -0.05 and +0.1; seed 0: +0.1 and +0.1; seed 1 has no loop run
    assert cl.paired(results)[2:] == [
        "| hda − hda-open | mCA | +0.025 ± 0.075 | 1 of 2 |",
        "| hda − hda-open | R_g | +0.100 ± 0.000 | 2 of 2 |",
    ]


def test_a_loop_s_guide_transforms_the_batch_before_the_replay_puts_its_failures_in(setting: cl.Setting) -> None:
    # Lightning calls on_train_batch_start in the trainer's callback order: guide first, then FailureReplay,
    # so replayed failures are not transformed again (docs/closed_loop.md, "Why does the robustness loop lose...")
    arm = cl.loop_arm("dlguard", setting, 0)
    trainer = cl.L.Trainer(callbacks=arm.callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    order = [type(c).__name__ for c in trainer.callbacks]
    replay = order.index("FailureReplay")
    assert all(order.index(name) < replay for name in ("RobustnessCallback", "DScoreCallback", "MetamorphicCallback"))


def test_d_score_s_padding_resamples_the_batch_before_the_photometric_guide_transforms_it(
    setting: cl.Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the padding first by default (docs/closed_loop.md, "D-Score's padding before the photometric guide");
    # --combine keeps the order it is given
    def order() -> list[str]:
        arm = cl.loop_arm("dlguard", setting, 0)
        trainer = cl.L.Trainer(callbacks=arm.callbacks, logger=False, enable_checkpointing=False)
        return [type(c).__name__ for c in trainer.callbacks if type(c).__name__.endswith("Callback")]

    assert cl.combined_loops(setting) == ["dscore", "robustness", "hda", "metamorphic"]  # MNIST: no objects
    assert order() == ["DScoreCallback", "RobustnessCallback", "HDACallback", "MetamorphicCallback"]
    monkeypatch.setattr(cl, "COMBINED", ["robustness", "dscore", "robustness"])
    assert cl.combined_loops(setting) == ["robustness", "dscore"]
    assert order() == ["RobustnessCallback", "DScoreCallback"]


def test_fixed_padding_pads_every_batch_from_the_first_from_d_score_s_guide_s_stream_without_measuring(
    setting: cl.Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --combine padding: D-Score's open-loop padding in its place among the loops (--padding p=...)
    monkeypatch.setattr(cl, "COMBINED", ["padding", "robustness"])
    monkeypatch.setitem(cl.OPTIONS, "padding", {"p": 0.4})
    callbacks = cl.loop_arm("dlguard", setting, 0).callbacks
    assert not any(isinstance(c, cl.DScoreCallback) for c in callbacks)  # nothing measures D-Score
    padding = callbacks[0]
    assert isinstance(padding, cl.OpenLoop) and padding.guide.p == pytest.approx(0.4)
    assert cl.given_options("dlguard", setting) == {"padding": {"p": 0.4}}
    # the reference: a measured D-Score loop whose guide holds the same p pads its batches with the same draws
    reference = cl.DScoreCallback(guide=cl.ScoreGuidedPadding(p=0.4), seed=0)
    monkeypatch.setattr(reference, "_guide_ready", lambda: True)
    images, labels = setting.train[0][:64], setting.train[1][:64]
    for step in range(2):  # from the first batch on, no validation before it
        ours, theirs = [images.clone(), labels], [images.clone(), labels]
        padding.on_train_batch_start(None, None, ours, step)  # type: ignore[arg-type]
        reference.on_train_batch_start(None, None, theirs, step)  # type: ignore[arg-type]
        assert not torch.equal(ours[0], images)
        torch.testing.assert_close(ours[0], theirs[0])
    monkeypatch.setattr(cl, "COMBINED", ["dscore", "padding"])
    with pytest.raises(SystemExit, match="give dscore or padding, not both"):
        cl.loop_arm("dlguard", setting, 0)
    with pytest.raises(SystemExit, match="give dscore or padding, not both"):  # before any arm has fitted
        cl.arms_for(setting, ["plain", "dlguard"], ["dscore", "padding"])


@pytest.mark.slow
def test_a_run_with_fixed_padding_records_the_dose_of_the_loops_beside_it(
    setting: cl.Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cl, "COMBINED", ["padding", "robustness"])
    monkeypatch.setitem(cl.OPTIONS, "padding", {"p": 0.3})
    _, record = cl.fit("dlguard", setting, 0, 3, {})  # the first validation is below min_accuracy: measured at 1
    assert len(record["dose"]["strength"]) == 3 and record["dose"]["strength"][2] > 0  # the robustness guide's
    assert sum(record["dose"]["deposits"].values()) > 0 and record["replayed"] > 0


def test_the_padding_flag_fills_alike_in_d_score_s_loop_its_control_and_the_fixed_padding(
    setting: cl.Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(cl.OPTIONS, "padding", {"padding_mode": "reflection"})
    (loop,) = [c for c in cl.loop_arm("dscore", setting, 0).callbacks if isinstance(c, cl.DScoreCallback)]
    control = cl.open_arm("dscore-open", setting, 0, {"deposits": {}, "strength": [0.0, 0.3, 0.4]}).callbacks[0]
    monkeypatch.setattr(cl, "COMBINED", ["padding"])
    fixed = cl.loop_arm("dlguard", setting, 0).callbacks[0]
    assert [guide.flags["padding_mode"] for guide in (loop.guide, control.guide, fixed.guide)] == ["reflection"] * 3
    assert control.guide.p == pytest.approx((0.25 / 3) ** 0.5)  # by hand: √((0 + 0.09 + 0.16) / 3)


def test_on_a_standard_augmentation_the_loader_s_rows_are_augmented_and_replayed_failures_are_not(
    setting: cl.Setting, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cl, "ON", ["noise"])
    assert not cl.make_arm("noise", setting, 0, {}).callbacks  # the standard arm itself: as without --on
    arm = cl.make_arm("metamorphic", setting, 0, {})
    assert isinstance(arm.callbacks[0], cl.Underneath) and arm.augment is None
    replay = next(c for c in arm.callbacks if isinstance(c, cl.FailureReplay))
    failures = torch.full((4, 1, 28, 28), 0.5)
    replay.bank.add(failures, torch.arange(4), "planted")
    trainer = cl.L.Trainer(callbacks=arm.callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    batch = [torch.zeros(20, 1, 28, 28), torch.zeros(20, dtype=torch.long)]
    torch.manual_seed(0)
    for callback in trainer.callbacks:  # in the order Lightning calls them
        callback.on_train_batch_start(trainer, None, batch, 0)
    replayed = (batch[0] == 0.5).flatten(1).all(1)  # a noised row is never exactly 0.5 everywhere
    # the replay's share of the 20 rows, exactly as deposited: not noised again
    assert int(replayed.sum()) == replay.replayed == round(replay.fraction * 20) > 0
    others = batch[0][~replayed]
    assert (others.flatten(1) > 0).any(1).all()  # every loader row went through the noise (σ ~ U(0, 0.3))
    # before a guide too: the robustness loop's ErrorGuidedAugmentation transforms what the noise left
    guided = cl.make_arm("robustness", setting, 0, {})
    order = [type(c).__name__ for c in cl.L.Trainer(callbacks=guided.callbacks, logger=False).callbacks]
    assert order.index("Underneath") < order.index("RobustnessCallback") < order.index("FailureReplay")
    # and a run records it, so the tables name it; the pair with the augmentation alone is added
    results = {
        "augmix": [{"seed": 0, "mCA": 0.9, "pgd": 0.5}],
        "noise": [{"seed": 0, "mCA": 0.8, "pgd": 0.6}],
        "dlguard": [{"seed": 0, "mCA": 0.85, "pgd": 0.7, "on": "noise", "seconds": 1.0}],
    }
    assert cl.paired(results)[2:] == [
        "| dlguard on noise − augmix | mCA | -0.050 ± nan | 0 of 1 |",
        "| dlguard on noise − augmix | pgd | +0.200 ± nan | 1 of 1 |",
        "| dlguard on noise − noise | mCA | +0.050 ± nan | 1 of 1 |",
        "| dlguard on noise − noise | pgd | +0.100 ± nan | 1 of 1 |",
    ]


def test_results_of_several_processes_merge_into_one_file_by_arm_and_seed() -> None:
    first = {"dlguard": [{"seed": 2, "mCA": 0.2}], "plain": [{"seed": 2, "mCA": 0.1}]}
    second = {"plain": [{"seed": 0, "mCA": 0.3}], "robustness-open": [{"seed": 0, "mCA": 0.4}]}
    merged = cl.merge([first, second])
    assert list(merged) == ["plain", "dlguard", "robustness-open"]  # ARMS' order, whatever the files'
    assert merged["plain"] == [{"seed": 0, "mCA": 0.3}, {"seed": 2, "mCA": 0.1}]
    assert cl.merge([{"plain": [{"mCA": 0.5}, {"mCA": 0.6}]}])["plain"] == [{"mCA": 0.5}, {"mCA": 0.6}]
    with pytest.raises(SystemExit, match="plain ran seed 2 in more than one file"):
        cl.merge([first, {"plain": [{"seed": 2, "mCA": 0.7}]}])
    runs = [
        {"seed": 1, "mCA": mca, "threads": n, "accelerator": "cpu", "seconds": n} for mca, n in ((0.66, 2), (0.67, 1))
    ]
    one, two = runs
    with pytest.raises(SystemExit, match=r"plain ran seed 1 .* judged otherwise \(the runs had 1 thread\(s\) on cpu "):
        cl.merge([{"plain": [one]}, {"plain": [two]}])  # CPU fits differ with the thread count: the message says so
    assert cl.merge([{"plain": [one]}, {"plain": [{**one, "threads": 1}]}])["plain"] == [one]  # alike: kept once
    elsewhere = {**one, "machine": "AMD EPYC, torch 2.14.1"}  # the same figures on another machine: kept once
    assert cl.merge([{"plain": [one]}, {"plain": [elsewhere]}])["plain"] == [one]
    where = r"\(the runs had 2 thread\(s\) on cpu and 2 thread\(s\) on cpu \(AMD EPYC, torch 2.14.1\)\)"
    with pytest.raises(SystemExit, match=where):  # judged otherwise: the message says where each ran
        cl.merge([{"plain": [one]}, {"plain": [{**elsewhere, "mCA": 0.69}]}])
    gpu = {**one, "mCA": 0.68, "accelerator": "gpu"}
    with pytest.raises(SystemExit, match=r"\(the runs had 2 thread\(s\) on cpu and 2 thread\(s\) on gpu\)"):
        cl.merge([{"plain": [one]}, {"plain": [gpu]}])
    with pytest.raises(SystemExit, match="the files' runs trained 3 and 6 epochs; merge one"):
        cl.merge([{"plain": [{**one, "epochs": 6}]}, {"noise": [{**one, "epochs": 3}]}])


def test_files_of_other_runs_merge_with_their_dlguard_arms_apart_and_pair_on_request() -> None:
    """docs/closed_loop.md's pairs across files: the loops on noise against the same loops without it."""
    every_loop = {
        "plain": [{"seed": 0, "seconds": 1.0, "clean": 0.90, "mCA": 0.80, "pgd": 0.50}],
        "augmix": [{"seed": 0, "seconds": 8.0, "clean": 0.91, "mCA": 0.84, "pgd": 0.52}],
        "noise": [{"seed": 0, "seconds": 1.0, "clean": 0.92, "mCA": 0.85, "pgd": 0.60}],
        "dlguard": [{"seed": 0, "seconds": 2.0, "clean": 0.88, "mCA": 0.83, "pgd": 0.45}],
    }
    two_loops = {  # plain rerun in another process: the same figures, another wall time
        "plain": [{"seed": 0, "seconds": 1.5, "clean": 0.90, "mCA": 0.80, "pgd": 0.50}],
        "dlguard": [
            {"seed": 0, "seconds": 1.5, "clean": 0.91, "mCA": 0.87, "pgd": 0.55, "combine": ["metamorphic", "hda"]}
        ],
    }
    both = {"combine": ["metamorphic", "hda"]}
    on_noise = {
        "dlguard": [{"seed": 0, "seconds": 1.7, "clean": 0.93, "mCA": 0.88, "pgd": 0.61, **both, "on": "noise"}]
    }
    merged = cl.merge([every_loop, two_loops, on_noise])
    assert list(merged) == [
        "plain", "augmix", "noise", "dlguard", "dlguard (metamorphic+hda)", "dlguard (metamorphic+hda) on noise"
    ]  # fmt: skip
    assert merged["plain"] == every_loop["plain"]  # the rerun, judged alike, kept once
    with pytest.raises(SystemExit, match="arm plain ran seed 0 in more than one file, judged otherwise"):
        cl.merge([every_loop, {"plain": [{**every_loop["plain"][0], "mCA": 0.81}]}])
    rows = cl.paired(merged, [("dlguard (metamorphic+hda) on noise", "dlguard (metamorphic+hda)")])[2:]
    # the loops alone and on noise each meet the best standard augmentation (noise), plain; then the pair asked for
    assert rows[-5:] == [
        "| dlguard (metamorphic+hda) on noise − plain | clean | +0.030 ± nan | 1 of 1 |",
        "| dlguard (metamorphic+hda) on noise − plain | pgd | +0.110 ± nan | 1 of 1 |",
        "| dlguard (metamorphic+hda) on noise − dlguard (metamorphic+hda) | clean | +0.020 ± nan | 1 of 1 |",
        "| dlguard (metamorphic+hda) on noise − dlguard (metamorphic+hda) | mCA | +0.010 ± nan | 1 of 1 |",
        "| dlguard (metamorphic+hda) on noise − dlguard (metamorphic+hda) | pgd | +0.060 ± nan | 1 of 1 |",
    ]
    assert "| dlguard (metamorphic+hda) − noise | mCA | +0.020 ± nan | 1 of 1 |" in rows
    assert "| dlguard (metamorphic+hda) on noise − noise | mCA | +0.030 ± nan | 1 of 1 |" in rows
    with pytest.raises(SystemExit, match="--pair: no arm 'dlguard on noise' in the results"):
        cl.paired(merged, [("dlguard on noise", "noise")])


def test_a_merge_with_a_mistyped_pair_leaves_its_out_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--results A B --out B --pair X Y``: ``--pair`` is checked before ``B`` is written over."""
    old = {"plain": [{"seed": 0, "seconds": 1.0, "clean": 0.90, "mCA": 0.80, "pgd": 0.50}]}
    new = {"augmix": [{"seed": 0, "seconds": 2.0, "clean": 0.91, "mCA": 0.84, "pgd": 0.52}]}
    (tmp_path / "new.json").write_text(json.dumps(new))
    out = tmp_path / "old.json"
    out.write_text(json.dumps(old))
    merge = ["closed_loop.py", "--results", str(tmp_path / "new.json"), str(out), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", [*merge, "--pair", "augmix", "plian"])
    with pytest.raises(SystemExit, match="--pair: no arm 'plian'"):
        cl.main()
    assert json.loads(out.read_text()) == old
    monkeypatch.setattr(sys, "argv", [*merge, "--pair", "augmix", "plain"])
    cl.main()
    assert json.loads(out.read_text()) == {**old, **new}


def test_the_tables_of_a_file_still_being_written_show_the_arms_that_ran() -> None:
    run = {"seed": 0, "seconds": 2.0, "clean": 0.5, "mCA": 0.25, "warnings": []}
    lines = cl.summarise({"plain": [run], "robustness": [{**run, "seconds": 3.0}], "robustness-open": []})
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| plain", "| robustness"]
    assert lines[3].endswith("| 1.5x |") and "0.250 ± 0.000" in lines[3]
    assert len(lines) == 4  # one thread count (or none recorded): no word on the fit times
    cpu = {**run, "accelerator": "cpu"}
    timed = {"plain": [{**cpu, "cpu_seconds": 1.0}], "noise": [{**cpu, "seconds": 8.0, "cpu_seconds": 1.5}]}
    assert cl.summarise(timed)[3].endswith("| 1.5x CPU |")  # by the CPU time both spent, not the wall's 4.0x
    on_gpu = {arm: [{**r, "accelerator": "gpu"} for r in runs] for arm, runs in timed.items()}
    assert cl.summarise(on_gpu)[3].endswith("| 4.0x |")  # a GPU fit's CPU time is the host's share alone
    timed["noise"].append({**cpu, "seconds": 6.0, "seed": 1})  # a run before CPU times were recorded
    assert cl.summarise(timed)[3].endswith("| 3.5x |")  # the wall's, for every run alike
    two = {arm: [{**run, "threads": n, "accelerator": "cpu"}] for arm, n in (("plain", 2), ("noise", 1))}
    assert cl.summarise(two)[-1] == (
        "(fit times from runs with 1 thread(s) on cpu and 2 thread(s) on cpu: their ratios compare only roughly)"
    )


def test_the_oracle_puts_a_fraction_of_the_images_through_the_judge_s_corruptions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import _corruptions
    import numpy as np

    albumentations = pytest.importorskip("albumentations")  # the bench extra, as the judge's corruptions

    def shift(sign: int) -> object:  # a planted table: the red channel 15 levels per severity up or down,
        def corrupt(img: np.ndarray, severity: int) -> np.ndarray:  # so 5 levels for a grey image's mean
            out = img.astype(int)
            out[..., 0] += sign * 15 * severity
            return np.clip(out, 0, 255).astype(np.uint8)

        return lambda s: albumentations.Lambda(image=lambda img, **_: corrupt(img, s))

    monkeypatch.setattr(_corruptions, "_table", lambda: {"brighten": shift(1), "darken": shift(-1)})
    monkeypatch.setitem(cl.OPTIONS, "oracle", {"fraction": 0.3})
    x = torch.full((2000, 1, 4, 4), 128 / 255)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    out = cl.REFERENCES["oracle"](0)(x)
    assert torch.equal(torch.get_rng_state(), torch_state)  # training's shuffles go on as plain's
    assert np.array_equal(np.random.get_state()[1], numpy_state)
    steps = ((out - x) * 255).round()[:, 0, 0, 0]
    assert torch.equal(((out - x) * 255).round(), steps[:, None, None, None].expand_as(x))  # one shift per image
    changed = steps != 0
    assert 0.27 < changed.float().mean() < 0.33  # the fraction, and the rest left exactly as they were
    assert torch.equal(out[~changed], x[~changed])
    # each corrupted image: one corruption at one severity 1-5, all ten drawn
    assert set(steps[changed].tolist()) == {float(5 * s * sign) for s in range(1, 6) for sign in (1, -1)}
    again = cl.REFERENCES["oracle"](0)(x)  # its own draws, seeded: the same seed corrupts alike, another not
    assert torch.equal(again, out) and not torch.equal(cl.REFERENCES["oracle"](1)(x), out)
    with pytest.raises(ValueError, match="fraction"):
        _corruptions.random_corruption(fraction=1.5)


def test_flags_json_cannot_keep_are_refused_before_any_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cl.OPTIONS, "hda", {})
    monkeypatch.setattr(sys, "argv", ["closed_loop.py", "--arms", "hda", "--hda", "k=50", "radius={0.1}"])
    monkeypatch.setattr(cl, "SETTINGS", {"mnist": lambda: pytest.fail("a setting was built")})
    with pytest.raises(SystemExit, match=r"--hda: Object of type set is not JSON serializable"):
        cl.main()


def test_the_loops_meet_the_oracle_of_any_flags() -> None:
    oracle = {"seed": 0, "mCA": 0.9, "options": {"oracle": {"fraction": 0.25}}}
    merged = cl.merge([{"dlguard": [{"seed": 0, "mCA": 0.8}]}, {"oracle": [oracle]}])
    assert cl.paired(merged)[2:] == ["| dlguard − oracle [--oracle fraction=0.25] | mCA | -0.100 ± nan | 0 of 1 |"]


def test_the_dose_records_every_guide_an_arm_combines(setting: cl.Setting, monkeypatch: pytest.MonkeyPatch) -> None:
    # all loops together: the robustness guide is the arm's dose, D-Score's padding is recorded beside it
    arm = cl.loop_arm("dlguard", setting, 0)
    dose = next(c for c in arm.callbacks if isinstance(c, cl.Dose))
    dscore = next(c for c in arm.callbacks if isinstance(c, cl.DScoreCallback))
    assert set(dose.others) == {"dscore"} and dose.others["dscore"][0] is dscore
    dose.on_train_epoch_start(None, None)  # type: ignore[arg-type]  # before any measurement: nothing applied
    padding = dose.others["dscore"][1]
    padding.p = 0.3
    monkeypatch.setattr(dscore, "_guide_ready", lambda: True)
    dose.on_train_epoch_start(None, None)  # type: ignore[arg-type]
    assert dose.record()["guides"] == {"dscore": [0.0, pytest.approx(0.3)]}
    assert dose.record()["strength"] == [0.0, 0.0]  # the robustness guide has not measured yet
    alone = next(c for c in cl.loop_arm("robustness", setting, 0).callbacks if isinstance(c, cl.Dose))
    assert "guides" not in alone.record()


def test_the_judge_s_contrast_is_a_gain_about_black_which_underexposure_draws_and_reduced_contrast_does_not() -> None:
    """albumentations' lowered contrast scales every pixel towards 0 (a darker picture), not towards the image's
    mean, so ``capture``'s ``reduced_contrast`` misses it and ``exposure``'s ``underexposure`` at ``r = c`` matches
    it to uint8 rounding (docs/closed_loop.md, "Darker pictures")."""
    pytest.importorskip("albumentations")
    import _corruptions

    from dlguard.augment import capture_properties, exposure_properties

    images = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.25
    contrast = _corruptions.corrupt(images)["contrast"]  # (5, N, C, H, W), severities 1-5
    (dark,) = exposure_properties()
    flat = next(p for p in capture_properties() if p.name == "reduced_contrast")
    for severity, c in zip(range(5), (0.3, 0.45, 0.6, 0.7, 0.8), strict=True):
        judged = contrast[severity]
        assert (judged - dark(images, c)).abs().max() < 3 / 255, severity
        assert (judged - flat(images, c)).abs().mean() > 0.15, severity  # about the mean: far brighter
