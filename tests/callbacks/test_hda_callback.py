"""HDACallback in a fit and in users' projects: numbers against an independent run of the generator, feedback,
normalised input, dict batches and outputs, several loaders, precisions, validate/test, resume, 1-D signals."""

from __future__ import annotations

import csv
import math
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from dlguard._random import content_keys, keyed_uniform
from dlguard.callbacks import FailureReplay, HDACallback
from dlguard.data import MNISTDataModule
from dlguard.generate import HOLDOUT_SALT, PCADistribution, VAEDistribution, hda_test
from dlguard.metrics.functional import empirical_global_robustness, prediction_loss
from dlguard.zoo import ClassifierModule, pretrained
from tests.callbacks.projects import DigitDicts, NormalizedDigits, normalize
from tests.callbacks.recompute import hda_logged
from tests.callbacks.test_projects import SignalClassifier, Signals
from tests.probes.fingerprint import assert_unchanged, fingerprint
from tests.quick import mnist_validation, quick_trainer

KEYS = ("image", "label")
LOGGED = {
    "hda/ae_proportion",
    "hda/prediction_loss",
    "hda/epsilon",
    "hda/seed_density",
    "hda/ssim",
    "hda/global_robustness",
    "hda/forward_passes",
}
# mutations larger than the SPEC's 0.003 find AEs in a dozen iterations: tests stay fast and meet AEs
FAST = {"mutation_std": 0.05, "init_std": 0.1}
# sizes of their own (budget=None): these tests are about the numbers, test_budget.py about the budget
SMALL = {"k": 6, "probe_size": 40, "population": 60, "iterations": 12, "holdout": 0.5, "budget": None, **FAST}


@pytest.fixture(scope="module")
def distribution() -> VAEDistribution:
    data = MNISTDataModule()
    data.setup()
    train = torch.stack([data.train_set[i][0] for i in range(400)])
    return VAEDistribution(pretrained("vae_mnist")).fit(train)


def logits_of(out: dict[str, torch.Tensor]) -> torch.Tensor:
    return out["logits"]


def test_a_measurement_equals_an_independent_run_and_feeds_the_bank(tmp_path: Path, distribution) -> None:
    replay = FailureReplay(fraction=0.25)
    callback = HDACallback(distribution=distribution, bank=replay.bank, radius=0.3, **SMALL)
    trainer = quick_trainer(tmp_path, [callback, replay], val_batches=2)
    module = ClassifierModule(pretrained("mnist_a"))
    trainer.validate(module, datamodule=MNISTDataModule(batch_size=50), verbose=False)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("hda/")}
    assert set(logged) == LOGGED

    # the selection equals a direct call's; every logged number is recomputed from the callback's own run
    probe, run = callback.probe_set(), callback.last_run
    assert probe.size == 40 and len(run.seeds) == 6
    net = module.net
    direct = hda_test(net, probe.inputs, probe.target, distribution, k=6, radius=0.3, keys=probe.keys,
                      population=60, iterations=12, gradient_start=True, **FAST)  # fmt: skip
    assert torch.equal(direct.keys, run.keys) and torch.equal(direct.selected_keys, run.selected_keys)
    assert torch.equal(direct.ga.found, run.ga.found)
    torch.testing.assert_close(direct.ga.examples, run.ga.examples)
    found = run.ga.found[:, 0]
    assert logged["hda/ae_proportion"] == pytest.approx(float(found.float().mean()), abs=1e-9)
    assert logged["hda/ae_proportion"] > 0
    with torch.no_grad():
        j = prediction_loss(net(run.ga.best), run.target)
    assert bool((j[found] >= -1e-4).all())  # AEs, up to the last bits of another batch size
    assert logged["hda/prediction_loss"] == pytest.approx(float(j[found].mean()), abs=1e-4)
    eps = (run.ga.best - run.seeds).flatten(1).abs().amax(1)
    assert logged["hda/epsilon"] == pytest.approx(float(eps[found].mean()), abs=1e-6)
    assert logged["hda/epsilon"] <= 0.3 + 1e-6
    # seed density: p_g of the selected seeds as a share of the candidates' total, written with plain exp in float64
    log_p = distribution.log_density(probe.inputs).double()
    share = (log_p[torch.isin(probe.keys, run.keys)] - log_p.logsumexp(0)).exp()
    assert logged["hda/seed_density"] == pytest.approx(float(share.mean()), rel=1e-5)
    assert logged["hda/seed_density"] > 1 / 40  # selected seeds are denser than a random draw's expectation

    # held out by content: their test cases are fixed; R̂_g at the first measurement weighs the seeds without an AE
    held = keyed_uniform(run.keys, (1,), salt=HOLDOUT_SALT).squeeze(1) <= 0.5
    assert torch.equal(callback.heldout["keys"], run.keys[held].sort().values)
    weights = run.log_density[held].exp()
    expected = float((weights * ~found[held]).sum() / weights.sum())
    assert logged["hda/global_robustness"] == pytest.approx(expected, abs=1e-6)
    tests = callback.heldout["inputs"]
    with torch.no_grad():
        predicted = net(tests).argmax(1)
    rg = empirical_global_robustness(predicted, callback.heldout["labels"], callback.heldout["log_density"])
    assert logged["hda/global_robustness"] == pytest.approx(float(rg), abs=1e-6)

    # the other seeds' AEs went to the bank with their seeds' labels; none of the held-out ones
    banked = (found & ~held).sum()
    assert replay.bank.origins() == ({"hda": int(banked)} if banked else {})
    if banked:
        stored, labels = replay.bank.inputs("hda"), replay.bank.labels("hda")
        assert torch.equal(labels, run.target[found & ~held])
        with torch.no_grad():
            assert bool((prediction_loss(net(stored), labels) >= -1e-4).all())
    assert (tmp_path / "hda" / "hda_gallery.png").is_file()
    # and all of them at once: the generator on the callback's probe set, fed to the same metrics
    assert logged == pytest.approx(hda_logged(callback, net), abs=1e-6)


def test_replay_of_hda_aes_raises_global_robustness(tmp_path: Path, distribution) -> None:
    """HDA adversarial fine-tuning inside an ordinary fit: R̂_g on the held-out AEs rises."""
    replay = FailureReplay(fraction=0.5)
    callback = HDACallback(distribution=distribution, k=20, probe_size=100, population=100, iterations=20,
                           radius=0.2, **FAST, holdout=0.3, bank=replay.bank, budget=None)  # fmt: skip
    trainer = quick_trainer(tmp_path, [callback, replay], epochs=4, train_batches=20, val_batches=2)
    trainer.fit(ClassifierModule(pretrained("mnist_a"), lr=1e-3), datamodule=MNISTDataModule(batch_size=50))
    curve = [record["logged"]["hda/global_robustness"] for record in callback.history]
    assert replay.replayed > 0 and len(curve) == 4
    assert curve[-1] > curve[0], curve


def test_the_model_is_left_as_found_and_bad_input_fails_before_any_work(tmp_path: Path, distribution) -> None:
    module = ClassifierModule(pretrained("mnist_a")).train()
    module.net.fc3.weight.requires_grad_(False)
    before = fingerprint(module)
    trainer = quick_trainer(tmp_path, [HDACallback(distribution=distribution, **SMALL)], val_batches=2)
    trainer.validate(module, datamodule=MNISTDataModule(batch_size=50), verbose=False)
    module.train()  # validate()'s own eval() is Lightning's
    assert_unchanged(module, before)

    with pytest.raises(ValueError, match="distribution: is not fitted"):
        quick_trainer(tmp_path, [HDACallback(distribution=PCADistribution(8), **SMALL)]).fit(
            module, datamodule=MNISTDataModule(batch_size=50)
        )
    module.train()
    assert_unchanged(module, before)
    for kwargs, message in (
        ({"radius": 0.0}, r"radius: expected a value in \(0, 1\]"),
        ({"radius": 1.5}, r"radius: expected a value in \(0, 1\]"),
        ({"population": 1}, "population: expected an integer of at least 2"),
        ({"population": 8, "num_best": 9}, "num_best: expected at most population"),
        ({"mutation_std": -0.1}, "mutation_std: expected a value of 0 or more"),
        ({"indicator": "fgsm"}, r"indicator: expected one of \('grad', 'sep'\), got 'fgsm'"),
        ({"indicator": ["grad"]}, r"indicator: expected one of \('grad', 'sep'\), got \['grad'\]"),
        ({"perceptual": "lpips"}, "perceptual: expected one of"),
        ({"holdout": 1.5}, "holdout"),
        ({"gradient_start": "yes"}, "gradient_start: expected True or False"),
    ):
        with pytest.raises(ValueError, match=message):
            HDACallback(distribution=distribution, **{**SMALL, **kwargs})
    with pytest.raises(ValueError, match="distribution: expected a GlobalDistribution"):
        HDACallback(distribution=pretrained("vae_mnist"))


def test_a_population_below_the_paper_s_elite_iterates_with_all_but_one_individual_as_elite(
    tmp_path: Path, distribution
) -> None:
    # the budget's plan runs populations down to 2; a population asked for is allowed as small
    callback = HDACallback(distribution=distribution, **{**SMALL, "population": 8, "iterations": 3})
    trainer = quick_trainer(tmp_path, [callback], val_batches=1)
    trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50),
                     verbose=False)  # fmt: skip
    assert (callback.latest["population"], callback.latest["iterations"]) == (8, 3)
    assert 0.0 <= callback.latest["logged"]["hda/ae_proportion"] <= 1.0


def test_outputs_that_are_not_logits_are_refused_naming_output_transform(tmp_path: Path, distribution) -> None:
    trainer = quick_trainer(
        tmp_path, [HDACallback(distribution=distribution, preprocess=normalize, batch_keys=KEYS, **SMALL)]
    )
    with pytest.raises(ValueError, match="output_transform"):
        trainer.fit(NormalizedDigits(output_dict=True), datamodule=DigitDicts())


def test_k_larger_than_the_candidates_warns_and_uses_all(tmp_path: Path, distribution) -> None:
    callback = HDACallback(distribution=distribution, **{**SMALL, "k": 60})
    trainer = quick_trainer(tmp_path, [callback], val_batches=1)
    with pytest.warns(UserWarning, match=r"k = 60 seeds asked for but there are only 40 candidates"):
        trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50),
                         verbose=False)  # fmt: skip
    assert callback.latest["seeds"] == callback.probe_set("validation").size


def test_normalised_model_dict_batches_dict_outputs_equal_the_pixel_model(tmp_path: Path, distribution) -> None:
    callback = HDACallback(
        distribution=distribution, preprocess=normalize, output_transform=logits_of, batch_keys=KEYS, **SMALL
    )
    trainer = quick_trainer(tmp_path, [callback], train_batches=1, val_batches=2)
    module = NormalizedDigits(output_dict=True, lr=0.0)
    trainer.fit(module, datamodule=DigitDicts())
    probe = callback.probe_set()
    run = hda_test(module.backbone[1], probe.inputs, probe.target, distribution, k=6, keys=probe.keys,
                   population=60, iterations=12, gradient_start=True, **FAST)  # fmt: skip
    logged = float(trainer.callback_metrics["hda/ae_proportion"])
    assert logged == pytest.approx(float(run.ga.found.float().mean()), abs=1e-9)


def test_several_loaders_and_limit_val_batches(tmp_path: Path, distribution) -> None:
    callback = HDACallback(distribution=distribution, dataloader_idx=1, preprocess=normalize, batch_keys=KEYS, **SMALL)
    trainer = quick_trainer(tmp_path, [callback], train_batches=1, val_batches=1)
    datamodule = DigitDicts(val_splits=(200, 300))
    trainer.fit(NormalizedDigits(), datamodule=datamodule)
    loader_one = torch.stack([datamodule._mnist.val_set[i][0] for i in range(200, 250)])  # its one batch of 50
    assert callback.probe_set().size == 40
    assert torch.isin(callback.probe_set().all_keys, content_keys(loader_one, 0)).all()


def test_validate_and_test_measure_on_their_own_loaders(tmp_path: Path, distribution) -> None:
    callback = HDACallback(distribution=distribution, preprocess=normalize, batch_keys=KEYS, **SMALL)
    trainer = quick_trainer(tmp_path, [callback], val_batches=1, limit_test_batches=1)
    module, datamodule = NormalizedDigits(), DigitDicts()
    validated = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    tested = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    assert [record["stage"] for record in callback.history] == ["validation", "test"]
    assert "hda/ae_proportion" in validated and "hda/ae_proportion" in tested
    test_images = torch.stack([datamodule._mnist.val_set[i][0] for i in range(500, 550)])
    assert torch.isin(callback.probe_set("test").all_keys, content_keys(test_images, 0)).all()
    # R̂_g's held-out cases come from validation inputs: a test figure it is not, so the test logs none
    assert "hda/global_robustness" in validated and "hda/global_robustness" not in tested
    from dlguard.probes import ModelAdapter

    recomputed = hda_logged(callback, ModelAdapter(module, preprocess=normalize), "test")
    assert {k: v for k, v in tested.items() if k.startswith("hda/")} == pytest.approx(recomputed, abs=1e-6)


def test_a_global_robustness_of_zero_by_construction_is_explained(tmp_path: Path, distribution) -> None:
    # a radius no digit survives: the gradient start finds an AE around every seed, the held-out ones too
    callback = HDACallback(distribution=distribution, **{**SMALL, "radius": 0.5})
    trainer = quick_trainer(tmp_path, [callback], val_batches=2)
    module = ClassifierModule(pretrained("mnist_a"))
    said = r"hda/global_robustness reads 0.0 at epoch 0 by construction: .* of \d+ seeds"
    with pytest.warns(UserWarning, match=said):
        logged = trainer.validate(module, datamodule=MNISTDataModule(batch_size=50), verbose=False)[0]
    assert logged["hda/global_robustness"] == 0.0 and logged["hda/ae_proportion"] == 1.0
    with warnings.catch_warnings():  # the next measurement reads the same cases, found at an earlier one: no word
        warnings.filterwarnings("error", message=".*by construction.*")
        again = trainer.validate(module, datamodule=MNISTDataModule(batch_size=50), verbose=False)[0]
    assert again["hda/global_robustness"] == 0.0  # the same model: nothing closed them


@pytest.mark.parametrize("precision", ["64-true", "bf16-mixed"])
def test_precisions_give_the_float32_numbers(tmp_path: Path, precision: str, distribution) -> None:
    runs = {}
    for name in ("32-true", precision):
        callback = HDACallback(distribution=distribution, preprocess=normalize, batch_keys=KEYS, **SMALL)
        trainer = quick_trainer(tmp_path / name, [callback], train_batches=1, val_batches=2, precision=name)
        trainer.fit(NormalizedDigits(lr=0.0), datamodule=DigitDicts())
        runs[name] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("hda/")}
    assert runs[precision].keys() == runs["32-true"].keys()
    # 64-true probes in float64 and bf16-mixed in float32 outside autocast: the GA may take other paths
    for key in ("hda/ae_proportion", "hda/global_robustness"):
        assert runs[precision][key] == pytest.approx(runs["32-true"][key], abs=0.34), key
    assert runs[precision]["hda/seed_density"] == pytest.approx(runs["32-true"]["hda/seed_density"], rel=0.05)


def _hda_rows(path: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if value and key.startswith("hda/"):
                    rows.setdefault(int(row["epoch"]), {})[key] = float(value)
    return rows


def _resumable(tmp_path: Path, distribution) -> list[L.Callback]:
    replay = FailureReplay(fraction=0.25, batch_keys=KEYS)
    return [
        HDACallback(distribution=distribution, bank=replay.bank, preprocess=normalize, batch_keys=KEYS, **SMALL),
        replay,
        ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_top_k=-1, every_n_epochs=1),
    ]


def test_a_resumed_run_measures_what_an_uninterrupted_run_measures(tmp_path: Path, distribution) -> None:
    whole = quick_trainer(tmp_path / "whole", _resumable(tmp_path / "whole", distribution), epochs=3, val_batches=2)
    whole.fit(NormalizedDigits(), datamodule=DigitDicts())
    first_epoch = next((tmp_path / "whole" / "checkpoints").glob("epoch=0*.ckpt"))
    callbacks = _resumable(tmp_path / "resumed", distribution)
    resumed = quick_trainer(tmp_path / "resumed", callbacks, epochs=3, val_batches=2)
    resumed.fit(NormalizedDigits(), datamodule=DigitDicts(), ckpt_path=first_epoch)
    expected, got = _hda_rows(tmp_path / "whole" / "metrics.csv"), _hda_rows(tmp_path / "resumed" / "metrics.csv")
    assert sorted(got) == [1, 2] and callbacks[0].heldout is not None
    for epoch in (1, 2):  # NaN (no AE found) equals NaN here
        assert got[epoch].keys() == expected[epoch].keys()
        for key, value in expected[epoch].items():
            assert got[epoch][key] == value or (math.isnan(value) and math.isnan(got[epoch][key])), (epoch, key)


class UnitSignals(Signals):
    """The project's signals mapped into [0, 1]: the GA projects test cases into the pixel range."""

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        signals, labels = self.data.tensors
        self.data = torch.utils.data.TensorDataset(((signals + 2) / 4).clamp(0, 1), labels)


def test_signals_get_hda_with_a_pca_distribution(tmp_path: Path) -> None:
    data = UnitSignals()
    data.setup()
    distribution = PCADistribution(n_components=4).fit(data.data.tensors[0][:480])
    callback = HDACallback(
        distribution=distribution, k=4, probe_size=30, population=40, iterations=5, radius=0.2, **FAST
    )
    trainer = quick_trainer(tmp_path, [callback], epochs=2, train_batches=10, val_batches=3)
    trainer.fit(SignalClassifier(), datamodule=UnitSignals())
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("hda/")}
    assert "hda/ssim" not in logged and 0 <= logged["hda/ae_proportion"] <= 1
    assert callback.probe_set().inputs.shape[1:] == (2, 64)


def test_no_held_out_seeds_logs_no_global_robustness(tmp_path: Path, distribution) -> None:
    callback = HDACallback(distribution=distribution, **{**SMALL, "holdout": 0.0})
    trainer = quick_trainer(tmp_path, [callback], val_batches=1)
    logged = trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50),
                              verbose=False)[0]  # fmt: skip
    assert "hda/ae_proportion" in logged and "hda/global_robustness" not in logged
    assert len(callback.heldout["labels"]) == 0


def test_a_measurement_reads_no_value_twice(tmp_path: Path, distribution, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe draw checked the candidates and made their keys: the measurement checks and hashes nothing again."""
    import sys

    import dlguard._random
    import dlguard._validation

    calls: list[str] = []
    measuring = HDACallback._measure

    def counted(name, original):
        def call(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        return call

    def measure(self, *args, **kwargs):
        with pytest.MonkeyPatch.context() as patch:  # every dlguard module's reference, during the measurement only
            for name, module in (("check_values", dlguard._validation), ("content_keys", dlguard._random)):
                original = getattr(module, name)
                for loaded in list(sys.modules.values()):
                    if (
                        getattr(loaded, "__name__", "").startswith("dlguard")
                        and getattr(loaded, name, None) is original
                    ):
                        patch.setattr(loaded, name, counted(name, original))
            return measuring(self, *args, **kwargs)

    monkeypatch.setattr(HDACallback, "_measure", measure)
    callback = HDACallback(distribution=distribution, **SMALL)
    trainer = quick_trainer(tmp_path, [callback], val_batches=2)
    trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50), verbose=False)
    assert len(callback.history) == 1 and calls == []


def test_a_measurement_without_an_adversarial_example_logs_no_undefined_mean(tmp_path: Path, distribution) -> None:
    # a tiny radius and two GA iterations around confidently classified digits: no AE can be found
    settings = {**SMALL, "radius": 1e-3, "iterations": 2, "population": 24, "mutation_std": 1e-4, "init_std": 1e-4}
    callback = HDACallback(distribution=distribution, **settings)
    trainer = quick_trainer(tmp_path, [callback], val_batches=2)
    with pytest.warns(UserWarning) as caught:
        trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50))
    said = " | ".join(str(w.message) for w in caught)
    assert "HDACallback: epoch 0 found no adversarial example among 6 test cases" in said
    # the held-out seeds hold no AE either: R̂_g is their accuracy, and the warning says so rather than a silent 1.0
    assert "found no AE around any of the 1 held-out seeds at epoch 0" in said
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("hda/")}
    assert set(logged) == {"hda/ae_proportion", "hda/seed_density", "hda/global_robustness", "hda/forward_passes"}
    assert logged["hda/ae_proportion"] == 0.0 and all(math.isfinite(v) for v in logged.values())
    assert logged == pytest.approx(hda_logged(callback, pretrained("mnist_a")), abs=1e-5)


def test_without_a_distribution_a_pca_is_fitted_on_the_training_data(tmp_path: Path) -> None:
    from dlguard.generate.distribution import PCADistribution

    callback = HDACallback(fit_inputs=300, **SMALL)
    trainer = quick_trainer(tmp_path, [callback], train_batches=2, val_batches=2)
    datamodule = MNISTDataModule(batch_size=50)
    trainer.fit(ClassifierModule(pretrained("mnist_a")), datamodule=datamodule)
    assert isinstance(callback.distribution, PCADistribution) and callback.distribution.n_components == 32
    # the same PCA as one fitted by hand on the training set's first 300 inputs, in its order
    first = torch.stack([datamodule.train_set[i][0] for i in range(300)])
    reference = PCADistribution(n_components=32).fit(first)
    probe = callback.probe_set()
    torch.testing.assert_close(callback.distribution.log_density(probe.inputs), reference.log_density(probe.inputs))
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("hda/")}
    assert logged == pytest.approx(hda_logged(callback, trainer.lightning_module), abs=1e-5)


def test_without_a_distribution_or_training_data_validate_fails_naming_distribution(tmp_path: Path) -> None:
    class ValidationOnly(L.LightningDataModule):
        def val_dataloader(self) -> torch.utils.data.DataLoader:
            data = MNISTDataModule()
            data.setup()
            return torch.utils.data.DataLoader(data.val_set, batch_size=50)

    trainer = quick_trainer(tmp_path, [HDACallback(**SMALL)])
    with pytest.raises(ValueError, match="distribution: none given and validate has no training data"):
        trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=ValidationOnly(), verbose=False)


def test_noise_scaled_to_the_radius_finds_what_the_spec_s_noise_does_not() -> None:
    """Why the callback departs from SPEC §4's GA noise: at a budget that fits in training it finds AEs."""
    from dlguard.callbacks.hda import INIT_STD_PER_RADIUS, MUTATION_STD_PER_RADIUS
    from dlguard.generate import two_step_ga

    images, labels = mnist_validation(100)
    net = pretrained("mnist_a")
    with torch.no_grad():
        right = net(images).argmax(1) == labels
    seeds, target = images[right][:20], labels[right][:20]
    budget = {"population": 100, "iterations": 20, "seed": 0}
    spec = two_step_ga(net, seeds, target, 0.1, mutation_std=0.003, init_std=0.01, **budget)
    scaled = two_step_ga(net, seeds, target, 0.1, mutation_std=0.01, init_std=0.05, **budget)
    assert int(spec.found[:, 0].sum()) == 0 and int(scaled.found[:, 0].sum()) >= 2
    callback = HDACallback(radius=0.2)
    assert callback.ga["mutation_std"] == pytest.approx(0.2 * MUTATION_STD_PER_RADIUS) == pytest.approx(0.02)
    assert callback.ga["init_std"] == pytest.approx(0.2 * INIT_STD_PER_RADIUS) == pytest.approx(0.1)
    assert HDACallback(mutation_std=0.003).ga["mutation_std"] == 0.003


class BatchSizeDependent(ClassifierModule):
    """Class 0 on batches of 50 (the validation loop's), class 1 on any other: a prediction another pass flips."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = x.flatten(1)[:, :10] * 0.0  # depends on x, so input gradients exist
        return logits + 5.0 * torch.nn.functional.one_hot(torch.tensor(0 if len(x) == 50 else 1), 10).to(logits)


def test_a_probe_set_the_model_no_longer_gets_right_is_skipped_not_crashed(tmp_path: Path, distribution) -> None:
    # the draw keeps the digits the loop's own pass (batches of 50) predicts right: the zeros; HDA's own pass
    # on the 40 candidates predicts class 1 for all of them, so no seed is correct: no numbers, a warning
    callback = HDACallback(distribution=distribution, min_accuracy=None, **SMALL)
    trainer = quick_trainer(tmp_path, [callback], val_batches=4)
    with pytest.warns(UserWarning, match="classifies none correctly now, so there is no seed and nothing is logged"):
        trainer.validate(BatchSizeDependent(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50))
    assert callback.probe_set().size > 0 and set(callback.probe_set().target.tolist()) == {0}
    assert callback.latest["seeds"] == 0 and set(callback.latest["logged"]) == {"hda/forward_passes"}


def test_the_gradient_start_is_the_fast_gradient_sign_point_of_each_seed_alone() -> None:
    from dlguard.generate.hda import _gradient_step
    from dlguard.probes.adapter import ModelAdapter

    class AloneOrNot(torch.nn.Module):  # the linear map on one input, its negation on a batch of several
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.linear(x.flatten(1))
            return out if len(x) == 1 else -out

    net = AloneOrNot()
    with torch.no_grad():
        net.linear.weight.copy_(torch.tensor([[1.0, -1.0, 0.0, 2.0], [0.0, 1.0, -2.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))
        net.linear.bias.zero_()
    weight = net.linear.weight
    seeds, labels = torch.full((2, 1, 2, 2), 0.5), torch.tensor([0, 1], dtype=torch.int32)  # any integer labels
    # ∇_x CE = Wᵀ(p − e_y): its sign, by hand from the softmax of z = W·0.5 = (1, 0, 0)
    p = torch.softmax(torch.tensor([1.0, 0.0, 0.0]), 0)
    expected = torch.stack([0.5 + 0.1 * (weight.T @ (p - torch.eye(3)[y])).sign() for y in (0, 1)]).view(2, 1, 1, 2, 2)
    start = _gradient_step(ModelAdapter(net), seeds, labels, 0.1)
    torch.testing.assert_close(start, expected)
    assert all(not p.requires_grad or p.grad is None for p in net.parameters())


def test_the_gradient_start_finds_what_the_black_box_ga_does_not_at_the_default_budget(tmp_path: Path) -> None:
    found = {}
    for gradient_start in (True, False):
        callback = HDACallback(gradient_start=gradient_start)  # budget 0.15 of 1,000 digits: no GA iteration
        trainer = quick_trainer(tmp_path / str(gradient_start), [callback], val_batches=10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.validate(ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=100),
                             verbose=False)  # fmt: skip
        spent = callback.latest["budget"]
        assert callback.latest["iterations"] == 0 and spent["forward_passes"] <= spent["allowed"] == 150
        found[gradient_start] = callback.latest["logged"]["hda/ae_proportion"]
    assert found[True] >= 0.2 and found[False] == 0.0


def test_hda_test_refuses_a_bad_gradient_start_or_a_start_of_its_own_before_any_work(distribution) -> None:
    images, labels = torch.rand(4, 1, 28, 28), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="gradient_start: expected True or False, got 'yes'"):
        hda_test(pretrained("mnist_a"), images, labels, distribution, k=2, gradient_start="yes")
    with pytest.raises(ValueError, match=r"ga: unknown two_step_ga arguments \['start'\]"):
        hda_test(pretrained("mnist_a"), images, labels, distribution, k=2, start=images[:, None])
