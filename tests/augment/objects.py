"""Objects to mutate and what the tests expect of them, computed independently of dlguard (SPEC §3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dlguard.augment import FollowUps, object_follow_ups

SIZE = 24
LUMA = torch.tensor([0.299, 0.587, 0.114])


def disk(cy: float, cx: float, r2: float, size: int = SIZE) -> Tensor:
    """A disk mask ``(size, size)``: the pixels within ``sqrt(r2)`` of ``(cy, cx)``."""
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    return (yy - cy) ** 2 + (xx - cx) ** 2 <= r2


def grow(mask: Tensor, steps: int = 1) -> Tensor:
    """``mask`` (..., H, W) dilated ``steps`` times by a 3×3 square."""
    grown = mask.float().reshape(-1, 1, *mask.shape[-2:])
    for _ in range(steps):
        grown = F.max_pool2d(grown, 3, 1, 1)
    return grown.reshape(mask.shape).bool()


def shrink(mask: Tensor) -> Tensor:
    """``mask`` eroded by a 3×3 square (pixels outside the image count as inside, as in ``cv2.erode``)."""
    return ~grow(~mask)


def box_of(mask: Tensor) -> Tensor:
    """The tight bounding box of a ``(H, W)`` mask, as a mask."""
    rows, cols = mask.nonzero().unbind(1)
    box = torch.zeros_like(mask)
    box[int(rows.min()) : int(rows.max()) + 1, int(cols.min()) : int(cols.max()) + 1] = True
    return box


def median3(image: Tensor) -> Tensor:
    """3×3 median of a (C, H, W) image, edges replicated (what ``cv2.medianBlur`` does)."""
    padded = F.pad(image[None], (1, 1, 1, 1), mode="replicate")[0]
    windows = padded.unfold(1, 3, 1).unfold(2, 3, 1)  # (C, H, W, 3, 3)
    return windows.reshape(*image.shape, 9).median(-1).values


def scene(seed: int = 0, background: tuple[float, float, float] = (0.2, 0.3, 0.4)) -> tuple[Tensor, Tensor]:
    """A textured disk (the object) on a constant-colour background, and its mask."""
    g = torch.Generator().manual_seed(seed)
    mask = disk(11.5, 12.0, 30.0)
    image = torch.tensor(background).view(3, 1, 1).expand(3, SIZE, SIZE)
    image = torch.where(mask, 0.3 + 0.4 * torch.rand(3, SIZE, SIZE, generator=g), image)
    return image[None].contiguous(), mask[None]


def index(follow_ups: FollowUps, name: str) -> int:
    return follow_ups.operation.index(name)


def textured_objects(removal: str = "box") -> tuple[Tensor, Tensor, Tensor, FollowUps]:
    """Three random images with round objects (one a ring), four random backgrounds, and the follow-ups."""
    g = torch.Generator().manual_seed(1)
    images = torch.rand(3, 3, SIZE, SIZE, generator=g)
    masks = torch.stack([disk(12, 12, 25), disk(8, 15, 12), disk(14, 9, 40) & ~disk(14, 9, 6)])
    backgrounds = torch.rand(4, 3, SIZE, SIZE, generator=g)
    return images, masks, backgrounds, object_follow_ups(images, masks, backgrounds, removal=removal, workers=1)


BAD_INPUTS = [
    (lambda x, m, bg: (x, m[:, :-1], bg), "masks: expected a bool tensor"),
    (lambda x, m, bg: (x, m.to(torch.uint8), bg), "masks: expected a bool tensor"),
    (lambda x, m, bg: (x, m[:1], bg), "masks: expected a bool tensor"),
    (lambda x, m, bg: (x, torch.cat([m[:1], torch.zeros_like(m[:1])]), bg), "masks: the mask of image 1 is empty"),
    (lambda x, m, bg: (x, m, bg[..., :-1]), "backgrounds: expected at least one background"),
    (lambda x, m, bg: (x, m, bg[:0]), "backgrounds: expected at least one background"),
    (lambda x, m, bg: (x, m, bg[:, :1]), "backgrounds: expected at least one background"),
    (lambda x, m, bg: (x, m, bg * 2), r"backgrounds: expected values in \[0, 1\]"),
    (lambda x, m, bg: (x, m, bg[0]), "backgrounds: expected at least one background"),
    (lambda x, m, bg: (x, m, (bg * 255).to(torch.uint8)), "backgrounds: expected floating-point"),
    (lambda x, m, bg: (x[:, :2], m, bg), "images: expected images"),
    (lambda x, m, bg: (x + 1, m, bg), r"images: expected values in \[0, 1\]"),
]
"""``(change, message)``: a change of good ``(images, masks, backgrounds)`` and the error it must raise."""


def good_inputs() -> tuple[Tensor, Tensor, Tensor]:
    """Two images with square objects and two backgrounds, all 8x8: what :data:`BAD_INPUTS` changes."""
    images, masks = torch.rand(2, 3, 8, 8), torch.zeros(2, 8, 8, dtype=torch.bool)
    masks[:, 2:5, 2:5] = True
    return images, masks, torch.rand(2, 3, 8, 8)
