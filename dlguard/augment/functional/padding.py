"""Random padding then resize, as an affine map (score-guided padding, SPEC §1)."""

from __future__ import annotations

import torch
from kornia.geometry.transform import warp_affine
from torch import Tensor

from dlguard._validation import one_of
from dlguard.augment.functional._inputs import check_image_input

__all__ = ["PADDING_MODES", "pad_resize", "pad_resize_matrix"]

PADDING_MODES = ("zeros", "border", "reflection")
"""What fills the padding: zeros (the paper's empty values, SPEC §1), the edge pixels repeated, or the image
mirrored at its edge (``warp_affine``'s and ``grid_sample``'s ``padding_mode``)."""


def check_padding_mode(padding_mode: object) -> str:
    """``padding_mode`` if it is one of :data:`PADDING_MODES`; a ``ValueError`` naming it otherwise."""
    return one_of("padding_mode", padding_mode, PADDING_MODES)


def pad_resize_matrix(height: int, width: int, pad_x: Tensor, pad_y: Tensor, left: Tensor, top: Tensor) -> Tensor:
    """``(B, 3, 3)`` pixel-coordinate matrices of "zero-pad, then resize back to ``(H, W)``".

    Padding ``pad_x`` pixels in total horizontally (``left`` of them before the image) and
    ``pad_y`` vertically (``top`` before) and resizing back is the affine map
    ``x' = (x + 0.5 + left)·W/(W + pad_x) − 0.5`` (likewise ``y``), pixel centres at integers.
    """
    scale_x = width / (width + pad_x)
    scale_y = height / (height + pad_y)
    matrix = torch.zeros(len(pad_x), 3, 3, device=pad_x.device, dtype=pad_x.dtype)
    matrix[:, 0, 0] = scale_x
    matrix[:, 1, 1] = scale_y
    matrix[:, 0, 2] = (0.5 + left) * scale_x - 0.5
    matrix[:, 1, 2] = (0.5 + top) * scale_y - 0.5
    matrix[:, 2, 2] = 1
    return matrix


def pad_resize(images: Tensor, ratio: Tensor, left: Tensor, top: Tensor, padding_mode: str = "zeros") -> Tensor:
    """Pad each image by ``ratio·side`` in total (``left``/``top`` pixels before it), resize back.

    Batched and differentiable (one ``warp_affine``); per-sample ``ratio``, ``left``, ``top`` of
    shape ``(B,)``, with ``0 <= left <= ratio·W`` and ``0 <= top <= ratio·H``. ``padding_mode``
    (:data:`PADDING_MODES`) fills the padding: ``"zeros"`` as the paper pads, ``"border"`` or
    ``"reflection"`` where a black frame is something the test images never show (photos).

    Example:
        >>> import torch
        >>> x = torch.ones(1, 1, 8, 8)
        >>> out = pad_resize(x, torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.0]))
        >>> out[0, 0, :4, :4].mean().item() > 0.9, out[0, 0, 5:, 5:].max().item() < 0.1
        (True, True)
    """
    check_image_input(images)
    padding_mode = check_padding_mode(padding_mode)
    batch, _, height, width = images.shape
    for name, value in (("ratio", ratio), ("left", left), ("top", top)):
        if value.shape != (batch,):
            raise ValueError(f"{name}: expected shape ({batch},), got {tuple(value.shape)}")
    ratio = ratio.to(images)
    matrix = pad_resize_matrix(height, width, ratio * width, ratio * height, left.to(images), top.to(images))
    warped = warp_affine(images, matrix[:, :2], (height, width), padding_mode=padding_mode, align_corners=False)
    return warped.clamp(0, 1)
