from __future__ import annotations

import math

import pytest
import torch

from dlguard.data import roads as roads_module
from dlguard.data.roads import ROAD_SIZE, RoadDataModule, Roads, make_roads, steering_angle


@pytest.fixture(scope="module")
def roads() -> Roads:
    return make_roads(1600, seed=5)


def held_out_r2(features: torch.Tensor, targets: torch.Tensor, train: int, ridge: float = 1.0) -> float:
    """R² on the rows after ``train`` of a ridge regression fitted (closed form, float64) on the first ``train``."""
    x = torch.cat([features, torch.ones(len(features), 1)], dim=1).double()
    y = targets.double()
    x_fit, y_fit, x_test, y_test = x[:train], y[:train], x[train:], y[train:]
    weights = torch.linalg.solve(x_fit.T @ x_fit + ridge * torch.eye(x.shape[1], dtype=x.dtype), x_fit.T @ y_fit)
    residual = ((x_test @ weights - y_test) ** 2).mean()
    return float(1 - residual / y_test.var(correction=0))


def test_shapes_dtypes_range_and_items(roads: Roads) -> None:
    assert ROAD_SIZE == (48, 64) and roads.size == (48, 64) and len(roads) == 1600
    assert roads.images.shape == (1600, 3, 48, 64) and roads.images.dtype == torch.float32
    assert roads.angles.shape == roads.curvature.shape == (1600,)
    assert roads.angles.dtype == roads.curvature.dtype == torch.float32
    assert float(roads.images.min()) >= 0.0 and float(roads.images.max()) <= 1.0
    image, angle = roads[7]
    assert torch.equal(image, roads.images[7])
    assert isinstance(angle, torch.Tensor) and angle.shape == () and angle.dtype == torch.float32
    assert float(angle) == float(roads.angles[7])
    assert make_roads(5, size=(20, 30), seed=0).images.shape == (5, 3, 20, 30)
    assert "Roads(n=1600, size=(48, 64)" in repr(roads)


def test_label_is_the_steering_angle_implied_by_the_curvature(roads: Roads) -> None:
    # an independent reference in plain Python: 12 · atan(2.7 m · κ)
    for i in range(0, 1600, 97):
        expected = 12.0 * math.atan(2.7 * float(roads.curvature[i]))
        assert float(roads.angles[i]) == pytest.approx(expected, abs=1e-6)
    assert float(steering_angle(torch.tensor(0.01))) == pytest.approx(12 * math.atan(0.027), abs=1e-6)


def test_angles_spread_like_udacity_steering(roads: Roads) -> None:
    angles = roads.angles
    assert 0.2 < float(angles.std()) < 0.4
    assert float(angles.abs().max()) <= 1.0 + 1e-6
    assert abs(float(angles.mean())) < 0.05  # left and right bends alike
    assert float((angles.abs() < 0.1).float().mean()) > 0.3  # peaked at straight roads, like driving data
    assert float((angles.abs() > 0.5).float().mean()) > 0.02  # with sharp bends too


def test_same_seed_gives_identical_tensors_and_another_seed_differs() -> None:
    first, second, other = make_roads(300, seed=3), make_roads(300, seed=3), make_roads(300, seed=4)
    for name in ("images", "angles", "curvature"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
        assert not torch.equal(getattr(first, name), getattr(other, name)), name


def test_angle_is_recoverable_from_the_image_and_not_from_shuffled_labels(roads: Roads) -> None:
    """Planted defect: a linear model on the pixels predicts held-out angles; fitted to shuffled labels it cannot."""
    features = torch.nn.functional.avg_pool2d(roads.images.mean(dim=1, keepdim=True), 2).flatten(1)
    r2 = held_out_r2(features, roads.angles, train=1200)
    shuffled = roads.angles[torch.randperm(1600, generator=torch.Generator().manual_seed(0))]
    r2_shuffled = held_out_r2(features, shuffled, train=1200)
    assert r2 > 0.5  # measured 0.69
    assert r2_shuffled < 0.1  # the same fit with the labels' link to the images broken


def test_road_bends_the_way_the_angle_says() -> None:
    """With flat scenery and black asphalt, the road's pixels near the horizon lie right of centre for a right bend."""
    generator = torch.Generator().manual_seed(0)
    parameters = roads_module._parameters(3, generator)
    for name, value in parameters.items():  # three copies of the first road ...
        parameters[name] = value[:1].expand(3, *value.shape[1:]).clone()
    curvature = roads_module.MAX_CURVATURE / 2
    parameters["curvature"] = torch.tensor([-curvature, 0.0, curvature])  # ... bending left, straight, right
    parameters["asphalt"] = torch.zeros(3, 3)
    parameters["offset"] = torch.zeros(3)
    parameters["gain"], parameters["cast"] = torch.ones(3), torch.zeros(3, 3)
    parameters["horizon"] = torch.full((3,), 0.4)
    flat = torch.full((3, 3, 8, 8), 0.5)
    images = roads_module._draw(parameters, flat, ROAD_SIZE, generator)
    band = images[:, :, 21:28].mean(dim=1)  # the rows just below the horizon (row 19.2)
    weights = (band < 0.1).float()  # asphalt
    columns = torch.arange(64.0)
    centroid = (weights * columns).sum(dim=(1, 2)) / weights.sum(dim=(1, 2))
    left, straight, right = centroid.tolist()
    assert left < straight - 3 and right > straight + 3
    assert straight < 32  # the car drives in the right lane: the road's centre lies to its left
    assert steering_angle(parameters["curvature"]).tolist()[0] < 0 < steering_angle(parameters["curvature"])[2]


def test_bad_arguments_raise_before_any_work() -> None:
    with pytest.raises(ValueError, match="count: expected an integer of at least 1"):
        make_roads(0)
    with pytest.raises(ValueError, match=r"size: expected \(H, W\), two integers of at least 16"):
        make_roads(4, size=(8, 64))
    with pytest.raises(ValueError, match="size: expected"):
        make_roads(4, size=64)
    with pytest.raises(ValueError, match="seed: expected an integer"):
        make_roads(4, seed=1.5)
    with pytest.raises(ValueError, match="seed: expected an integer"):
        make_roads(4, seed=True)
    with pytest.raises(ValueError, match=r"angles: expected shape \(2,\)"):
        Roads(torch.zeros(2, 3, 16, 16), torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="batch_size"):
        RoadDataModule(batch_size=0)
    with pytest.raises(ValueError, match="val_size"):
        RoadDataModule(val_size=0)
    with pytest.raises(ValueError, match="num_workers"):
        RoadDataModule(num_workers=-1)
    with pytest.raises(ValueError, match="size"):
        RoadDataModule(size=(48,))


def test_datamodule_sets_seeds_and_loaders() -> None:
    dm = RoadDataModule(train_size=70, val_size=40, test_size=30, size=(24, 32), batch_size=16, seed=2)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (70, 40, 30)
    assert torch.equal(dm.train_set.images, make_roads(70, (24, 32), seed=6).images)
    assert torch.equal(dm.val_set.angles, make_roads(40, (24, 32), seed=7).angles)
    assert torch.equal(dm.test_set.angles, make_roads(30, (24, 32), seed=8).angles)
    train_set = dm.train_set
    dm.setup()
    assert dm.train_set is train_set  # setup runs once

    images, angles = next(iter(dm.val_dataloader()))  # in order
    assert images.shape == (16, 3, 24, 32) and angles.shape == (16,) and angles.dtype == torch.float32
    assert torch.equal(angles, dm.val_set.angles[:16])
    assert torch.equal(torch.cat([a for _, a in dm.test_dataloader()]), dm.test_set.angles)
    shuffled = torch.cat([a for _, a in dm.train_dataloader()])
    assert not torch.equal(shuffled, dm.train_set.angles)
    assert torch.equal(shuffled.sort().values, dm.train_set.angles.sort().values)
    assert torch.equal(shuffled, torch.cat([a for _, a in dm.train_dataloader()]))  # the shuffle is seeded
