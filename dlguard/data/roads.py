"""Procedural dash-camera road images labelled with a steering angle: DeepTest's steering task, no download.

Each image ``(3, H, W)`` in ``[0, 1]`` is the view of a pinhole camera ``1.5 m`` above a flat ground,
looking along the car's heading: a sky (a vertical gradient from a blue or overcast top to a hazy
horizon colour), distant hills on the horizon, and a ground textured with crops of scikit-learn's two
sample photos (:func:`~dlguard.data.backgrounds.scene_backgrounds`, tinted like grass, dry grass or dirt)
mapped in perspective. On the ground lies a two-lane asphalt road that bends with a constant
curvature ``κ``: at distance ``Z`` ahead its centre is displaced sideways by ``κ·Z²/2`` (the circle's
parabolic approximation). The car drives in the right lane (off its centre by up to ``0.4 m``); the
road carries solid white edge lines and a dashed centre line (white or yellow). Distance fades into
the horizon colour (haze), and a random gain and colour cast change the lighting. Edges are
antialiased analytically (each pixel's coverage of the road, the lines and the dashes over its
footprint on the ground), so thin far-away markings blend instead of flickering. Drawing is
vectorised over images and pixels: 5,000 images take about 3 s on one CPU core.

The label is the steering angle that keeps the car on the road: a bicycle-model car with wheelbase
``L = 2.7 m`` follows curvature ``κ`` with its front wheels at ``atan(L·κ)``, recorded as the
steering-wheel angle ``angle = 12·atan(L·κ)`` radians (a steering ratio of 12, so that the angles
spread like those of Udacity's driving data). Positive angles turn right. Curvatures are Laplace
distributed (most roads nearly straight, some sharp bends, like driving data) with scale
``0.0065 /m`` and clipped to ``±0.0309 /m`` (radius 32 m), so angles spread with a standard deviation
of about 0.3 rad inside ``±1`` rad. Nothing else in the scene (horizon height, lane width,
position in the lane, scenery, lighting) depends on the label.

Every random choice comes from ``torch.Generator`` objects seeded from ``seed``: the same seed gives
identical tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral

import lightning as L
import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from dlguard._validation import positive_int
from dlguard.data.backgrounds import scene_backgrounds
from dlguard.data.images import make_loader

__all__ = ["ROAD_SIZE", "RoadDataModule", "Roads", "make_roads", "steering_angle"]

ROAD_SIZE: tuple[int, int] = (48, 64)
"""Default image size ``(H, W)``: small, so that training and tests run quickly on a CPU."""

MIN_ROAD_SIDE = 16
WHEELBASE = 2.7  # metres, a mid-size car
STEERING_RATIO = 12.0  # steering-wheel angle / front-wheel angle
CURVATURE_SCALE = 0.0065  # Laplace scale of the curvature (1/m)
MAX_ANGLE = 1.0  # radians: curvatures are clipped so that |angle| <= MAX_ANGLE
MAX_CURVATURE = math.tan(MAX_ANGLE / STEERING_RATIO) / WHEELBASE  # ≈ 0.0309 /m, a radius of 32 m

_CAMERA_HEIGHT = 1.5  # metres above the ground
_FOCAL = 0.875  # focal length in units of the image width (a horizontal field of view of about 60°)
_CHUNK = 256  # images drawn at once (bounds memory)
_TEXTURE_SIDE = 32  # side of the scenery textures
_TEXTURE_METRES = 6.0  # ground metres covered by one texture side
_MAX_DISTANCE = 400.0  # metres; farther ground (next to the horizon) is drawn as at this distance
_GROUND_TINTS = ((0.25, 0.42, 0.14), (0.52, 0.48, 0.28), (0.45, 0.34, 0.24))  # grass, dry grass, dirt


def steering_angle(curvature: Tensor) -> Tensor:
    """The steering-wheel angle (radians) that follows a road of the given curvature (1/m).

    ``angle = STEERING_RATIO · atan(WHEELBASE · curvature)`` with wheelbase 2.7 m and ratio 12: the
    bicycle model's front-wheel angle scaled to the wheel. Positive curvature (bending right) gives a
    positive angle (turning right).

    Example:
        >>> [round(v, 4) for v in steering_angle(torch.tensor([0.0, 0.01, -MAX_CURVATURE])).tolist()]
        [0.0, 0.3239, -1.0]
    """
    return STEERING_RATIO * torch.atan(WHEELBASE * curvature)


@dataclass(eq=False, repr=False)
class Roads(Dataset[tuple[Tensor, Tensor]]):
    """Road images with their steering angles; items ``(image, angle)`` with ``angle`` a 0-d float tensor.

    Build with :func:`make_roads`.

    Attributes:
        images: float32 ``(N, 3, H, W)`` in ``[0, 1]``.
        angles: float32 ``(N,)`` steering angles in radians (positive: turn right).
        curvature: float32 ``(N,)`` road curvature in 1/m (``angles == steering_angle(curvature)``).

    Example:
        >>> roads = make_roads(3, seed=0)
        >>> image, angle = roads[0]
        >>> tuple(image.shape), image.dtype, angle.shape, angle.dtype
        ((3, 48, 64), torch.float32, torch.Size([]), torch.float32)
        >>> len(roads), [round(v, 3) for v in roads.angles.tolist()]
        (3, [-0.144, -0.308, 0.02])
    """

    images: Tensor
    angles: Tensor
    curvature: Tensor

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        for name in ("angles", "curvature"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name}: expected shape ({n},) like images, got {tuple(getattr(self, name).shape)}")

    @property
    def size(self) -> tuple[int, int]:
        """The images' ``(H, W)``."""
        return tuple(self.images.shape[-2:])

    def __repr__(self) -> str:
        std = float(self.angles.std()) if len(self) > 1 else 0.0
        return f"Roads(n={len(self)}, size={self.size}, angle std {std:.3f} rad)"

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.angles[index]


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    return int(seed)


def _check_size(size: object) -> tuple[int, int]:
    if (
        not isinstance(size, tuple | list)
        or len(size) != 2
        or any(isinstance(s, bool) or not isinstance(s, Integral) or s < MIN_ROAD_SIDE for s in size)
    ):
        raise ValueError(f"size: expected (H, W), two integers of at least {MIN_ROAD_SIDE}, got {size!r}")
    return int(size[0]), int(size[1])


def _uniform(generator: torch.Generator, count: int, low: float, high: float, *shape: int) -> Tensor:
    return low + (high - low) * torch.rand(count, *shape, generator=generator)


def _parameters(count: int, generator: torch.Generator) -> dict[str, Tensor]:
    """Every per-image random choice, drawn up front in a fixed order."""
    g = generator
    # Laplace(0, b): a random sign times an exponential, drawn by inverting its CDF from uniforms
    # (Tensor.exponential_ changed its sampler between torch releases; torch.rand did not)
    magnitude = -CURVATURE_SCALE * torch.log1p(-torch.rand(count, generator=g))
    sign = torch.where(torch.rand(count, generator=g) < 0.5, -1.0, 1.0)
    overcast = torch.rand(count, 1, generator=g)
    blue = torch.tensor([[0.25, 0.45, 0.75]]) + _uniform(g, count, 0.0, 0.2, 1)
    grey = _uniform(g, count, 0.55, 0.8, 1).expand(count, 3)
    tints = torch.tensor(_GROUND_TINTS)[torch.randint(len(_GROUND_TINTS), (count,), generator=g)]
    yellow = torch.rand(count, generator=g) < 0.5
    return {
        "curvature": (sign * magnitude).clamp(-MAX_CURVATURE, MAX_CURVATURE),
        "horizon": _uniform(g, count, 0.34, 0.46),  # fraction of the height
        "lane": _uniform(g, count, 3.0, 3.8),  # lane width (m)
        "offset": _uniform(g, count, -0.4, 0.4),  # car's position right of its lane's centre (m)
        "shoulder": _uniform(g, count, 0.2, 0.8),  # asphalt beyond the edge lines (m)
        "line": _uniform(g, count, 0.2, 0.3),  # marking width (m)
        "period": _uniform(g, count, 9.0, 15.0),  # dash period (m)
        "duty": _uniform(g, count, 0.3, 0.5),  # painted fraction of a period
        "phase": _uniform(g, count, 0.0, 15.0),  # metres
        "asphalt": _uniform(g, count, 0.22, 0.5, 1) + _uniform(g, count, -0.03, 0.03, 3),
        "centre_colour": torch.where(
            yellow[:, None], torch.tensor([[0.9, 0.75, 0.2]]), torch.tensor([[0.9, 0.9, 0.9]])
        ),
        "sky_top": overcast * grey + (1 - overcast) * blue,
        "haze": _uniform(g, count, 0.7, 0.92, 1) + _uniform(g, count, -0.04, 0.04, 3),
        "visibility": _uniform(g, count, 60.0, 250.0),  # metres
        "tint": tints + _uniform(g, count, -0.05, 0.05, 3),
        "texture_mix": _uniform(g, count, 0.3, 0.7),  # weight of the photo texture against the tint
        "hills": _uniform(g, count, 0.0, 0.12),  # peak height, fraction of the image height
        "hill_waves": _uniform(g, count, 0.5, 4.0, 3),  # cycles across the image
        "hill_phase": _uniform(g, count, 0.0, 2 * math.pi, 3),
        "hill_colour": _uniform(g, count, 0.1, 0.35, 1) * torch.tensor([[0.8, 1.0, 0.8]]),
        "gain": _uniform(g, count, 0.65, 1.25),
        "cast": _uniform(g, count, -0.06, 0.06, 3),
    }


def _band(position: Tensor, low: Tensor, high: Tensor, footprint: Tensor) -> Tensor:
    """The fraction of each pixel inside ``low < x < high``, the pixel spanning ``position ± footprint/2``."""
    inside = torch.minimum(position + footprint / 2, high) - torch.maximum(position - footprint / 2, low)
    return (inside / footprint).clamp_(0.0, 1.0)


def _painted(t: Tensor, duty: Tensor) -> Tensor:
    """Painted length of a dash pattern (period 1, painted ``[0, duty)`` of each period) from 0 to ``t``."""
    return torch.floor(t) * duty + torch.minimum(torch.remainder(t, 1.0), duty)


def _draw(p: dict[str, Tensor], textures: Tensor, size: tuple[int, int], generator: torch.Generator) -> Tensor:
    """Images ``(n, 3, H, W)`` of the roads whose parameters are ``p`` (each entry's first dimension ``n``).

    Every edge is antialiased by box-filtering over the pixel's footprint on the ground: across the road
    for the road's sides and the lines (the pixel's extent in metres across the road at its distance),
    along the road for the dashes (the pixel's depth in metres), and over the pixel's height for the
    horizon and the hills.
    """
    height, width = size
    n = textures.shape[0]
    column = lambda name: p[name][:, None, None]  # noqa: E731 - (n,) -> (n, 1, 1) against (n, H, W)
    colour = lambda name: p[name][:, :, None, None]  # noqa: E731 - (n, 3) -> (n, 3, 1, 1)
    ys = (torch.arange(height) + 0.5)[None, :, None]  # pixel centres, (1, H, 1)
    xs = (torch.arange(width) + 0.5)[None, None, :]  # (1, 1, W)
    focal = _FOCAL * width
    depth = ys - column("horizon") * height  # rows below the horizon, (n, H, 1)
    ground = (depth + 0.5).clamp(0.0, 1.0)  # the part of each pixel below the horizon
    middle = ((depth - 0.5).clamp(min=0.0) + (depth + 0.5).clamp(min=1e-3)) / 2  # centre of that part
    distance = (focal * _CAMERA_HEIGHT / middle).clamp(max=_MAX_DISTANCE)  # Z (m)
    lateral = (xs - width / 2) * distance / focal  # X (m), (n, H, W)

    # the road: signed distance from its centre line, measured across the curved road
    curvature = column("curvature")
    centre = 0.5 * curvature * distance**2 - 0.5 * column("lane") - column("offset")
    slant = torch.rsqrt(1.0 + (curvature * distance) ** 2)  # cos of the road's heading at distance Z
    across = (lateral - centre) * slant
    # a pixel's extent across the road (m): its width, plus its height where the road runs slanted in the image
    sideways = (lateral / distance - curvature * distance).abs() * distance / _CAMERA_HEIGHT
    footprint = distance / focal * slant * (1.0 + sideways)
    lane, half_line = column("lane"), 0.5 * column("line")
    road = _band(across, -lane - column("shoulder"), lane + column("shoulder"), footprint)
    edges = _band(across, lane - half_line, lane + half_line, footprint)
    edges = edges + _band(across, -lane - half_line, -lane + half_line, footprint)
    depth_step = distance**2 / (focal * _CAMERA_HEIGHT)  # a pixel row's depth on the ground (m)
    period, duty = column("period"), column("duty")
    start = (distance - depth_step / 2 + column("phase")) / period
    stop = (distance + depth_step / 2 + column("phase")) / period
    dashes = (_painted(stop, duty) - _painted(start, duty)) / (stop - start)
    centre_line = _band(across, -half_line, half_line, footprint) * dashes

    # the ground: scenery textures in perspective, tinted, under the road
    grid = torch.stack((lateral / _TEXTURE_METRES, distance.expand_as(lateral) / _TEXTURE_METRES - 1.0), dim=-1)
    scenery = F.grid_sample(textures, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    mix = p["texture_mix"][:, None, None, None]
    shade = scenery.mean(dim=1, keepdim=True) / 0.3  # the photo's light and shade, about 1 on average
    surface = mix * scenery + (1 - mix) * shade * colour("tint")
    grain = 0.03 * (torch.rand(n, 1, height, width, generator=generator) - 0.5)
    surface = torch.lerp(surface, colour("asphalt") + grain, road[:, None])
    surface = torch.lerp(surface, torch.full_like(surface, 0.92), edges[:, None])
    surface = torch.lerp(surface, colour("centre_colour").expand_as(surface), centre_line[:, None])
    clear = torch.exp(-distance / column("visibility"))[:, None]  # haze: far ground fades to the horizon colour
    surface = torch.lerp(colour("haze").expand_as(surface), surface, clear)

    # the sky: top colour to horizon colour, hills in front of it
    above = (-depth / (column("horizon") * height)).clamp(0.0, 1.0)[:, None]  # 0 at the horizon, 1 at the top
    sky = torch.lerp(colour("haze").expand(n, 3, height, 1), colour("sky_top").expand(n, 3, height, 1), above)
    phases = xs[..., None] / width * 2 * math.pi * p["hill_waves"][:, None, None, :] + p["hill_phase"][:, None, None, :]
    profile = 0.5 + torch.sin(phases).mean(dim=-1) / 2  # (n, 1, W) in [0, 1]
    hill = (profile * column("hills") * height + depth + 0.5).clamp(0.0, 1.0)[:, None]
    hill_colour = 0.5 * colour("hill_colour") + 0.5 * colour("haze")
    sky = torch.lerp(sky.expand(n, 3, height, width), hill_colour.expand(n, 3, height, width), hill)

    image = torch.lerp(sky, surface, ground[:, None])
    lighting = p["gain"][:, None] * (1 + p["cast"])
    return (image * lighting[:, :, None, None]).clamp_(0.0, 1.0)


def make_roads(count: int, size: tuple[int, int] = ROAD_SIZE, seed: int = 0) -> Roads:
    """Draw ``count`` road images with their steering angles (see the module's description).

    Args:
        count: number of images.
        size: ``(H, W)``, each at least 16.
        seed: seed of every random choice; the same seed gives identical tensors.

    Returns:
        :class:`Roads` with float32 images ``(count, 3, H, W)`` in ``[0, 1]``, angles and curvatures ``(count,)``.

    Example:
        >>> roads = make_roads(200, seed=1)
        >>> tuple(roads.images.shape), round(float(roads.angles.std()), 2), round(float(roads.angles.abs().max()), 2)
        ((200, 3, 48, 64), 0.31, 1.0)
        >>> torch.equal(roads.images, make_roads(200, seed=1).images)
        True
    """
    count = positive_int("count", count)
    size = _check_size(size)
    seed = _check_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    p = _parameters(count, generator)
    images = torch.empty(count, 3, *size)
    for start in range(0, count, _CHUNK):
        stop = min(start + _CHUNK, count)
        chunk = {name: value[start:stop] for name, value in p.items()}
        kinds = torch.randint(2, (stop - start,), generator=generator)  # crops of the two photos
        texture_seed = int(torch.randint(2**62, (1,), generator=generator))
        textures, _ = scene_backgrounds(stop - start, _TEXTURE_SIDE, kinds=kinds, seed=texture_seed)
        images[start:stop] = _draw(chunk, textures, size, generator)
    curvature = p["curvature"].float()
    return Roads(images, steering_angle(curvature), curvature)


class RoadDataModule(L.LightningDataModule):
    """Road images (:func:`make_roads`) for training, validation and testing a steering model.

    The three sets are drawn with seeds ``3·seed``, ``3·seed + 1`` and ``3·seed + 2``; batches are
    ``[images, angles]`` (float ``(B, 3, H, W)`` and ``(B,)``).

    Args:
        train_size: training images.
        val_size: validation images.
        test_size: test images.
        size: ``(H, W)``.
        batch_size: loader batch size.
        seed: seed of the three sets and of the training shuffle.
        num_workers: loader worker processes.

    Example:
        >>> dm = RoadDataModule(train_size=100, val_size=50, test_size=50, batch_size=32)
        >>> dm.setup()
        >>> images, angles = next(iter(dm.train_dataloader()))
        >>> tuple(images.shape), tuple(angles.shape), angles.dtype
        ((32, 3, 48, 64), (32,), torch.float32)
    """

    def __init__(
        self,
        train_size: int = 4000,
        val_size: int = 1000,
        test_size: int = 1000,
        size: tuple[int, int] = ROAD_SIZE,
        batch_size: int = 64,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.train_size = positive_int("train_size", train_size)
        self.val_size = positive_int("val_size", val_size)
        self.test_size = positive_int("test_size", test_size)
        self.size = _check_size(size)
        self.batch_size = positive_int("batch_size", batch_size)
        self.seed = _check_seed(seed)
        self.num_workers = positive_int("num_workers", num_workers, minimum=0)
        self.train_set: Roads | None = None
        self.val_set: Roads | None = None
        self.test_set: Roads | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.train_set = make_roads(self.train_size, self.size, seed=3 * self.seed)
        self.val_set = make_roads(self.val_size, self.size, seed=3 * self.seed + 1)
        self.test_set = make_roads(self.test_size, self.size, seed=3 * self.seed + 2)

    def train_dataloader(self) -> DataLoader:
        return make_loader(self.train_set, self.batch_size, self.num_workers, shuffle_seed=self.seed)

    def val_dataloader(self) -> DataLoader:
        return make_loader(self.val_set, self.batch_size, self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return make_loader(self.test_set, self.batch_size, self.num_workers)
