from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from dlguard.callbacks import NeuronCoverageCallback
from dlguard.data import MNISTDataModule
from dlguard.metrics import (
    KMultisectionCoverage,
    NeuronBoundaryCoverage,
    NeuronCoverage,
    NeuronRange,
    StrongNeuronActivationCoverage,
    TopKNeuronCoverage,
)
from dlguard.probes import capture_activations, neuron_layers, profile_neuron_ranges
from dlguard.zoo import ClassifierModule, mnist_a, pretrained
from tests.probes.fingerprint import fingerprint
from tests.quick import quick_trainer


class CountingModule(ClassifierModule):
    """Counts forward passes, and can fail in the middle of validation."""

    def __init__(self, net: nn.Module, fail_at_val_batch: int | None = None) -> None:
        super().__init__(net)
        self.forwards = 0
        self.fail_at_val_batch = fail_at_val_batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return super().forward(x)

    def validation_step(self, batch, batch_idx: int) -> None:
        if (
            self.fail_at_val_batch is not None
            and batch_idx == self.fail_at_val_batch
            and not self.trainer.sanity_checking
        ):
            raise RuntimeError("validation failed")
        super().validation_step(batch, batch_idx)


def trainer_for(tmp_path: Path, callback: L.Callback, epochs: int = 1, **kwargs) -> L.Trainer:
    return quick_trainer(tmp_path, [callback], epochs=epochs, num_sanity_val_steps=0, **kwargs)


def hook_counts(module: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in module.modules())


def test_fit_logs_every_criterion_and_removes_hooks(tmp_path: Path) -> None:
    callback = NeuronCoverageCallback(max_profile_batches=4)
    module = CountingModule(pretrained("mnist_a").train())
    trainer = trainer_for(tmp_path, callback, epochs=2)
    trainer.fit(module, datamodule=MNISTDataModule(batch_size=64))
    assert hook_counts(module) == 0
    assert [record["epoch"] for record in callback.history] == [0, 1]
    for criterion in ("nc", "kmnc", "nbc", "snac", "tknc"):
        value = float(trainer.callback_metrics[f"coverage/{criterion}"])
        assert 0.0 <= value <= 1.0 and value == pytest.approx(callback.history[-1][criterion])
    assert set(callback.ranges) == {"net.conv1", "net.conv2", "net.fc1", "net.fc2", "net.fc3"}
    assert (tmp_path / "coverage" / "coverage_by_layer.png").is_file()
    assert callback.history[-1]["per_layer"]["nc"].keys() == set(callback.ranges)


def test_no_second_forward_pass_and_same_nc_as_the_metric(tmp_path: Path) -> None:
    dm = MNISTDataModule(batch_size=50)
    plain = CountingModule(pretrained("mnist_a"))
    trainer_for(tmp_path, NeuronCoverageCallback(criteria=["tknc"])).validate(plain, datamodule=dm, verbose=False)
    watched = CountingModule(pretrained("mnist_a"))
    callback = NeuronCoverageCallback(criteria=["nc"], threshold=0.3)
    trainer_for(tmp_path, callback).validate(watched, datamodule=dm, verbose=False)
    assert watched.forwards == plain.forwards == 3  # 3 validation batches, one forward each
    # the callback's NC equals the metric fed raw activations of the same 150 images
    layers = neuron_layers(watched.net)
    images = torch.stack([dm.val_set[i][0] for i in range(150)])
    outputs = {}
    hooks = [m.register_forward_hook(lambda m, i, o, n=n: outputs.__setitem__(n, o)) for n, m in layers.items()]
    with torch.no_grad():
        watched.net(images)
    for h in hooks:
        h.remove()
    metric = NeuronCoverage({n: o.shape[1] for n, o in outputs.items()}, threshold=0.3)
    metric.update(outputs)
    assert callback.history[-1]["nc"] == pytest.approx(float(metric.compute()))


def test_hooks_removed_when_validation_fails(tmp_path: Path) -> None:
    module = CountingModule(mnist_a(), fail_at_val_batch=1)
    before = fingerprint(module)
    with pytest.raises(RuntimeError, match="validation failed"):
        trainer_for(tmp_path, NeuronCoverageCallback(criteria=["nc", "tknc"])).fit(
            module, datamodule=MNISTDataModule(batch_size=64)
        )
    assert hook_counts(module) == 0
    assert fingerprint(module)["hooks"] == before["hooks"]


def test_validate_without_ranges_or_training_data_fails_before_any_work(tmp_path: Path) -> None:
    module, dm = CountingModule(mnist_a()), MNISTDataModule()
    dm.setup()
    with pytest.raises(ValueError, match=r"need per-neuron ranges and validate has no training data.*ranges="):
        trainer_for(tmp_path, NeuronCoverageCallback(criteria=["kmnc"])).validate(
            module, dataloaders=dm.val_dataloader(), verbose=False
        )
    assert module.forwards == 0


def test_validate_profiles_ranges_on_the_datamodules_training_data(tmp_path: Path) -> None:
    callback = NeuronCoverageCallback(criteria=["kmnc", "nbc"], max_profile_batches=2)
    module, dm = CountingModule(pretrained("mnist_a")), MNISTDataModule(batch_size=50)
    trainer_for(tmp_path, callback).validate(module, datamodule=dm, verbose=False)
    dm.setup()
    unshuffled = torch.utils.data.DataLoader(dm.train_set, batch_size=50)  # the training data, in dataset order
    reference = profile_neuron_ranges(module, unshuffled, max_batches=2)
    assert callback.ranges.keys() == reference.keys()
    for name, (low, high) in reference.items():
        assert torch.equal(callback.ranges[name].low, low) and torch.equal(callback.ranges[name].high, high)


def test_unknown_layer_lists_available(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\['net.conv9'\] not found in CountingModule; available layers: net"):
        trainer_for(tmp_path, NeuronCoverageCallback(layers=["net.conv9"])).fit(
            CountingModule(mnist_a()), datamodule=MNISTDataModule()
        )


def test_state_round_trip_keeps_ranges() -> None:
    source = NeuronCoverageCallback()
    source.ranges = {"fc": NeuronRange(torch.zeros(3), torch.ones(3))}
    source.history.append({"epoch": 0, "nc": 0.5})
    target = NeuronCoverageCallback()
    target.load_state_dict(source.state_dict())
    assert torch.equal(target.ranges["fc"].high, torch.ones(3)) and target.history == source.history
    target.load_state_dict({})
    assert target.history == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"criteria": ["nc", "lscov"]}, "criteria: unknown \\['lscov'\\]"),
        ({"threshold": -0.1}, "threshold"),
        ({"sections": 0}, "sections"),
        ({"top_k": 0}, "top_k"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NeuronCoverageCallback(**kwargs)


def test_profiling_leaves_the_training_batches_unchanged(tmp_path: Path) -> None:
    """The same fit with and without the callback: same batches, same global RNG at every step."""

    class BatchRecorder(L.Callback):
        def __init__(self) -> None:
            self.labels: list[torch.Tensor] = []
            self.rng: list[torch.Tensor] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.labels.append(batch[1].clone())
            self.rng.append(torch.random.get_rng_state())

    runs = []
    for callbacks in ([], [NeuronCoverageCallback(criteria=["kmnc", "nbc"])]):
        recorder = BatchRecorder()
        trainer = trainer_for(tmp_path, recorder, epochs=2)
        trainer.callbacks.extend(callbacks)
        trainer.fit(CountingModule(mnist_a()), datamodule=MNISTDataModule(batch_size=64))
        runs.append((torch.cat(recorder.labels), torch.stack(recorder.rng)))
    assert torch.equal(runs[0][0], runs[1][0])
    assert torch.equal(runs[0][1], runs[1][1])


def coverage_numbers(callback: NeuronCoverageCallback) -> dict:
    record = callback.history[-1]
    return {key: record[key] for key in ("nc", "kmnc", "nbc", "snac", "tknc", "per_layer")}


def mnist_a_ranges(dm: MNISTDataModule) -> dict[str, NeuronRange]:
    """Ranges of mnist_a inside a module (layer names ``net.*``) over 100 training digits."""
    dm.setup()
    images = torch.stack([dm.train_set[i][0] for i in range(100)])
    return profile_neuron_ranges(ClassifierModule(pretrained("mnist_a")), [images])


def test_other_callbacks_probes_are_neither_counted_nor_paid_for(tmp_path: Path, monkeypatch) -> None:
    """DScore runs the model on its mutants at the epoch's end, listed first: coverage's hooks are still there."""
    import dlguard.callbacks.coverage as coverage_module
    from dlguard.callbacks import DScoreCallback

    reads: list[int] = []
    read = coverage_module.neuron_values
    monkeypatch.setattr(coverage_module, "neuron_values", lambda a: reads.append(a.shape[0]) or read(a))
    dm = MNISTDataModule(batch_size=50)
    ranges = mnist_a_ranges(dm)
    runs = {}
    for order in ("alone", "dscore first"):
        reads.clear()
        coverage, dscore = NeuronCoverageCallback(ranges=ranges), DScoreCallback(n=2, probe_size=20)
        callbacks = {"alone": [coverage], "dscore first": [dscore, coverage]}
        module = CountingModule(pretrained("mnist_a"))
        trainer = quick_trainer(tmp_path, callbacks[order], num_sanity_val_steps=0)
        trainer.validate(module, datamodule=dm, verbose=False)
        assert order == "alone" or dscore.latest is not None  # DScore measured in that epoch
        runs[order] = coverage_numbers(coverage), list(reads), module.forwards
    numbers, reads_alone, forwards_alone = runs["alone"]
    assert reads_alone == [50] * 15  # 3 validation batches x 5 layers, each output read once
    assert runs["dscore first"][0] == numbers  # exactly the same counts
    assert runs["dscore first"][1] == reads_alone  # no layer output of DScore's passes was read
    assert runs["dscore first"][2] > forwards_alone  # though DScore ran the model in the same epoch


def test_counts_held_over_the_epoch_equal_counts_per_batch(tmp_path: Path, monkeypatch) -> None:
    import dlguard.callbacks.coverage as coverage_module

    dm = MNISTDataModule(batch_size=50)
    ranges = mnist_a_ranges(dm)
    records = []
    for held in (coverage_module._HELD_VALUES, 1):  # one update per metric at the epoch's end, or one per batch
        monkeypatch.setattr(coverage_module, "_HELD_VALUES", held)
        callback = NeuronCoverageCallback(ranges=ranges, threshold=0.3)
        trainer_for(tmp_path, callback).validate(CountingModule(pretrained("mnist_a")), datamodule=dm, verbose=False)
        records.append(coverage_numbers(callback))
    assert records[0] == records[1]
    # both equal the metrics fed, at once, the raw layer outputs of the loop's 3 batches of 50
    module = ClassifierModule(pretrained("mnist_a")).eval()
    images = torch.stack([dm.val_set[i][0] for i in range(150)])
    with torch.no_grad(), capture_activations(module, neuron_layers(module)) as acts:
        for batch in images.split(50):
            module(batch)
    outputs = {name: torch.cat(out) for name, out in acts.items()}
    assert_counts_equal_the_metrics(records[0], outputs, ranges, top_k=2)


def assert_counts_equal_the_metrics(
    record: dict[str, float], outputs: dict[str, torch.Tensor], ranges: dict[str, NeuronRange], top_k: int
) -> None:
    """Each criterion in ``record`` equals its metric fed the raw layer ``outputs`` at once (NC threshold 0.3)."""
    sizes = {name: out.shape[1] for name, out in outputs.items()}
    metrics = {
        "nc": NeuronCoverage(sizes, threshold=0.3),
        "kmnc": KMultisectionCoverage(ranges, k=10),
        "nbc": NeuronBoundaryCoverage(ranges),
        "snac": StrongNeuronActivationCoverage(ranges),
        "tknc": TopKNeuronCoverage(sizes, k=top_k),
    }
    for criterion, metric in metrics.items():
        metric.update(outputs)
        assert record[criterion] == float(metric.compute()), criterion


def test_in_place_ops_after_a_layer_do_not_change_what_it_counts(tmp_path: Path) -> None:
    """A planted defect: ReLU(inplace=True) after a Linear overwrites the output the hook read."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 12), nn.ReLU(inplace=True), nn.Linear(12, 10))
    dm = MNISTDataModule(batch_size=50)
    dm.setup()
    images = torch.stack([dm.val_set[i][0] for i in range(150)])
    with torch.no_grad():  # batches of 50, as the loop runs them
        hidden = torch.cat([net[1](net[0](batch)) for batch in images.split(50)])  # before the ReLU overwrites it
        logits = torch.cat([net[3](batch.relu()) for batch in hidden.split(50)])
    assert (hidden < 0).any()  # the ReLU does change it
    outputs = {"net.1": hidden, "net.3": logits}
    ranges = {name: NeuronRange(out.quantile(0.2, dim=0), out.quantile(0.8, dim=0)) for name, out in outputs.items()}
    callback = NeuronCoverageCallback(ranges=ranges, threshold=0.3, top_k=3)
    trainer_for(tmp_path, callback).validate(CountingModule(net), datamodule=dm, verbose=False)
    assert_counts_equal_the_metrics(callback.history[-1], outputs, ranges, top_k=3)


def test_a_saturated_criterion_is_named_with_its_layers_and_what_to_change(tmp_path: Path) -> None:
    # planted: at threshold 0 every scaled neuron value counts, and top_k 4096 is every neuron of every layer
    callback = NeuronCoverageCallback(criteria=["nc", "tknc"], threshold=0.0, top_k=4096)
    with pytest.warns(UserWarning) as caught:
        trainer_for(tmp_path, callback).validate(
            ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50), verbose=False
        )
    said = [str(w.message) for w in caught if "is saturated" in str(w.message)]
    assert len(said) == 2
    nc, tknc = sorted(said, key=lambda text: "tknc" in text)
    assert "nc is saturated at epoch 0 (1.000; every neuron covered in 5 of 5 layers: net.conv1" in nc
    assert "raise threshold (now 0.0" in nc and "lower top_k (now 4096)" in tknc
    assert callback.history[-1]["nc"] == 1.0  # still logged: the number is right, it just says nothing


def test_an_unsaturated_criterion_says_nothing(tmp_path: Path) -> None:
    callback = NeuronCoverageCallback(criteria=["nc", "tknc"], threshold=0.75)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        trainer_for(tmp_path, callback).validate(
            ClassifierModule(pretrained("mnist_a")), datamodule=MNISTDataModule(batch_size=50), verbose=False
        )
    assert callback.history[-1]["nc"] < 0.99
