"""GaussianNoise: sigma ~ U(0, max_sigma) per input, keyed by content and epoch, first among the callbacks."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dlguard.callbacks import FailureReplay, GaussianNoise, KeepOriginals
from dlguard.data.failure_bank import FailureBank
from tests.quick import logged_by_epoch, quick_trainer


def rows(count: int, shape: tuple[int, ...] = (1, 16, 16), low: float = 0.3, high: float = 0.7) -> torch.Tensor:
    """Row i holds one value, spaced evenly in [low, high]: every row's content differs."""
    return torch.linspace(low, high, count).reshape(-1, *[1] * len(shape)).expand(-1, *shape).clone()


def noised(inputs: torch.Tensor, epoch: int = 0, **options) -> torch.Tensor:
    """What the callback makes of a list batch in ``epoch``, outside a Trainer."""
    batch = [inputs.clone(), torch.zeros(len(inputs), dtype=torch.long)]
    GaussianNoise(**options).on_train_batch_start(SimpleNamespace(current_epoch=epoch), None, batch, 0)
    return batch[0]


def test_each_input_gets_a_uniform_sigma_and_normal_noise() -> None:
    inputs = rows(2000)
    residual = (noised(inputs, max_sigma=0.05) - inputs).flatten(1)  # 4 sigma at most 0.2: nothing clamped
    sigma = residual.std(dim=1, correction=0)
    assert stats.kstest((sigma / 0.05).numpy(), "uniform").pvalue > 0.01  # sigma ~ U(0, max_sigma), input by input
    standard = (residual / sigma.unsqueeze(1)).flatten()
    assert abs(float(residual.mean())) < 1e-3 and abs(float(stats.kurtosis(standard.numpy()))) < 0.05  # normal
    assert abs(float(stats.skew(standard.numpy()))) < 0.05


def test_the_draw_is_fixed_by_content_seed_and_epoch_not_by_the_batch() -> None:
    inputs = rows(12)
    first = noised(inputs)
    order = torch.randperm(12)
    assert torch.equal(noised(inputs[order]), first[order])  # any order, any batch it comes in
    assert torch.equal(noised(inputs[:5]), first[:5])
    assert not torch.equal(noised(inputs, epoch=1), first)  # a new draw each epoch
    assert not torch.equal(noised(inputs, seed=1), first)
    assert torch.equal(noised(inputs, max_sigma=0.0), inputs)


def test_list_dict_tuple_callable_and_bare_batches_and_a_loader_of_views_that_stays_clean() -> None:
    inputs = rows(8)
    want = noised(inputs)
    dataset = inputs.clone()
    as_list = [dataset[:8], torch.zeros(8)]  # a view of the dataset, as a loader with batch_size=None hands out
    GaussianNoise().on_train_batch_start(None, None, as_list, 0)
    as_dict = {"image": dataset[:8], "label": torch.zeros(8)}
    GaussianNoise(batch_keys=("image", "label")).on_train_batch_start(None, None, as_dict, 0)
    assert torch.equal(as_list[0], want) and torch.equal(as_dict["image"], want)
    assert torch.equal(dataset, inputs)  # the dataset the views came from is as it was
    for batch, options in [
        ((inputs.clone(), torch.zeros(8)), {}),
        (inputs.clone(), {}),  # a bare tensor: its own inputs, no target needed
        ((inputs.clone(), [{"boxes": None}] * 8), {}),  # detection targets: the noise reads no target
        ({"x": inputs.clone(), "y": torch.zeros(8)}, {"batch_keys": lambda b: (b["x"], b["y"])}),
    ]:
        GaussianNoise(**options).on_train_batch_start(None, None, batch, 0)
        seen = batch if isinstance(batch, torch.Tensor) else batch["x"] if isinstance(batch, dict) else batch[0]
        assert torch.equal(seen, want)  # in place: a tuple cannot take a new tensor


def test_the_output_is_clamped_to_the_value_range() -> None:
    inputs = torch.cat([torch.zeros(4, 1, 8, 8), torch.ones(4, 1, 8, 8)])
    out = noised(inputs)
    assert out.min() >= 0 and out.max() <= 1 and not torch.equal(out, inputs)
    wide = noised(inputs * 2 - 1, value_range=(-1.0, 1.0), max_sigma=0.6)
    assert wide.min() >= -1 and wide.max() <= 1 and (wide < 0).any()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_sigma": -0.1}, "max_sigma: expected a non-negative standard deviation"),
        ({"max_sigma": float("nan")}, "max_sigma"),
        ({"seed": 1.5}, "seed: expected an integer"),
        ({"value_range": None}, "value_range: expected \\(low, high\\)"),
        ({"value_range": (1.0, 0.0)}, "value_range: expected low < high"),
    ],
)
def test_bad_settings_are_refused_naming_the_argument(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GaussianNoise(**options)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ((rows(4) - 0.5) / 0.25, r"inputs: expected values in \[0, 1\].*before the network's normalisation"),
        (torch.full((4, 1, 4, 4), float("nan")), "inputs: contains NaN"),
    ],
)
def test_inputs_outside_the_range_or_nan_are_refused_before_the_batch_changes(
    inputs: torch.Tensor, message: str
) -> None:
    batch = [inputs.clone(), torch.zeros(4, dtype=torch.long)]
    noise = GaussianNoise()
    with pytest.raises(ValueError, match=message):
        noise.on_train_batch_start(None, None, batch, 0)
    with pytest.raises(ValueError, match=message):  # and again: a batch that failed the check did not pass it
        noise.on_train_batch_start(None, None, batch, 0)
    torch.testing.assert_close(batch[0], inputs, rtol=0, atol=0, equal_nan=True)  # the batch as it was


class Recording(L.LightningModule):
    """Records every training and validation batch; logs the sum of the training inputs over the processes."""

    def __init__(self, features: int = 256) -> None:
        super().__init__()
        self.layer = nn.Linear(features, 4)
        self.trained: list[torch.Tensor] = []
        self.validated: list[torch.Tensor] = []

    def _inputs(self, batch):
        return batch["image"] if isinstance(batch, dict) else batch[0]

    def training_step(self, batch, batch_idx):
        x = self._inputs(batch)
        self.trained.append(x.clone())
        self.log("trained/sum", x.double().sum(), on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True)
        return self.layer(x.flatten(1).to(self.layer.weight.dtype)).sum()

    def validation_step(self, batch, batch_idx):
        self.validated.append(self._inputs(batch).clone())

    def test_step(self, batch, batch_idx):
        self.validated.append(self._inputs(batch).clone())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Dicts(Dataset):
    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"image": self.images[index], "label": torch.tensor(index % 4)}


def test_a_fit_on_dict_batches_trains_on_what_the_callback_draws_and_validates_on_clean_inputs(tmp_path: Path) -> None:
    inputs = rows(16)
    model = Recording()
    trainer = quick_trainer(tmp_path, [GaussianNoise(batch_keys=("image", "label"))], epochs=2, train_batches=2,
                            val_batches=2)  # fmt: skip
    trainer.fit(model, DataLoader(Dicts(inputs), batch_size=8), DataLoader(Dicts(inputs), batch_size=8))
    expected = [noised(inputs[start : start + 8], epoch) for epoch in (0, 1) for start in (0, 8)]
    assert all(torch.equal(seen, want) for seen, want in zip(model.trained, expected, strict=True))
    assert all(torch.equal(seen, inputs[(i % 2) * 8 : (i % 2) * 8 + 8]) for i, seen in enumerate(model.validated))
    model.validated.clear()
    trainer.validate(model, DataLoader(Dicts(inputs), batch_size=8), verbose=False)
    trainer.test(model, DataLoader(Dicts(inputs), batch_size=8), verbose=False)
    assert len(model.validated) == 4 and all(torch.equal(seen, inputs[(i % 2) * 8 : (i % 2) * 8 + 8])
                                             for i, seen in enumerate(model.validated))  # fmt: skip


def test_one_dimensional_signals(tmp_path: Path) -> None:
    signals = rows(16, shape=(2, 32))
    model = Recording(features=64)
    quick_trainer(tmp_path, [GaussianNoise()], train_batches=2, val_batches=0).fit(
        model, DataLoader(TensorDataset(signals, torch.zeros(16, dtype=torch.long)), batch_size=8)
    )
    assert torch.equal(model.trained[1], noised(signals[8:])) and not torch.equal(model.trained[1], signals[8:])


@pytest.mark.parametrize("precision", ["64-true", "bf16-mixed"])
def test_precisions_draw_the_float32_noise(tmp_path: Path, precision: str) -> None:
    inputs = rows(8)
    model = Recording()
    trainer = quick_trainer(tmp_path, [GaussianNoise()], train_batches=1, val_batches=0, precision=precision)
    trainer.fit(model.double() if precision == "64-true" else model,
                DataLoader(TensorDataset(inputs, torch.zeros(8, dtype=torch.long)), batch_size=8))  # fmt: skip
    (seen,) = model.trained
    assert seen.dtype == (torch.float64 if precision == "64-true" else torch.float32)
    torch.testing.assert_close(seen.float(), noised(inputs), atol=1e-6, rtol=0)


def test_listed_after_a_loop_that_changes_batches_it_warns(tmp_path: Path) -> None:
    replay = FailureReplay()
    with pytest.warns(UserWarning, match="GaussianNoise: listed after FailureReplay"):
        quick_trainer(tmp_path, [replay, GaussianNoise()], train_batches=1, val_batches=0).fit(
            Recording(), DataLoader(TensorDataset(rows(8), torch.zeros(8, dtype=torch.long)), batch_size=8)
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="GaussianNoise")
        quick_trainer(tmp_path, [GaussianNoise(), FailureReplay()], train_batches=1, val_batches=0).fit(
            Recording(), DataLoader(TensorDataset(rows(8), torch.zeros(8, dtype=torch.long)), batch_size=8)
        )


def test_keep_originals_keeps_the_rows_as_the_noise_left_them(tmp_path: Path) -> None:
    bank = FailureBank()
    bank.add(torch.ones(2, 1, 16, 16), torch.tensor([3, 3]), origin="robustness")
    inputs, model = rows(8), Recording()
    callbacks = [GaussianNoise(), FailureReplay(bank, fraction=0.25, repeats=None), KeepOriginals()]
    quick_trainer(tmp_path, callbacks, train_batches=1, val_batches=0).fit(
        model, DataLoader(TensorDataset(inputs, torch.zeros(8, dtype=torch.long)), batch_size=8)
    )
    (seen,) = model.trained
    replaced = (seen[:8] == 1).flatten(1).all(1)
    assert int(replaced.sum()) == 2 and len(seen) == 10  # two failures in, their two originals appended
    noisy = noised(inputs)
    assert torch.equal(seen[:8][~replaced], noisy[~replaced]) and torch.equal(seen[8:], noisy[replaced])


def test_a_resumed_run_trains_on_what_an_uninterrupted_run_does(tmp_path: Path) -> None:
    def fit(path: Path, extra: list[L.Callback], ckpt: Path | None = None) -> Recording:
        model = Recording()
        quick_trainer(path, [GaussianNoise(), *extra], epochs=2, train_batches=2, val_batches=0).fit(
            model, DataLoader(TensorDataset(rows(16), torch.zeros(16, dtype=torch.long)), batch_size=8), ckpt_path=ckpt
        )
        return model

    whole = fit(tmp_path / "whole", [])
    fit(tmp_path / "first", [L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpt", every_n_epochs=1, save_top_k=-1)])
    (checkpoint,) = (tmp_path / "ckpt").glob("*epoch=0-step=2.ckpt")
    resumed = fit(tmp_path / "resumed", [], checkpoint)
    assert len(resumed.trained) == 2
    assert all(torch.equal(a, b) for a, b in zip(resumed.trained, whole.trained[2:], strict=True))


def _summed_on(tmp_path: Path, devices: int) -> float:
    extra = {"strategy": "ddp_spawn"} if devices > 1 else {}
    trainer = quick_trainer(tmp_path, [GaussianNoise()], train_batches=1.0, val_batches=0, accelerator="cpu",
                            devices=devices, **extra)  # fmt: skip
    trainer.fit(Recording(), DataLoader(TensorDataset(rows(16), torch.zeros(16, dtype=torch.long)), batch_size=8))
    return logged_by_epoch(tmp_path / "metrics.csv")[0]["trained/sum"]


@pytest.mark.ddp
@pytest.mark.slow
def test_two_processes_draw_what_one_process_draws(tmp_path: Path) -> None:
    one, two = _summed_on(tmp_path / "one", 1), _summed_on(tmp_path / "two", 2)
    assert one == pytest.approx(two, abs=1e-6) and one == pytest.approx(float(noised(rows(16)).double().sum()))
