"""Score-guided padding: random pad-and-resize whose strength follows D-Score's ``v_robust``."""

from __future__ import annotations

from typing import Any

import torch
from kornia.augmentation import GeometricAugmentationBase2D
from kornia.geometry.transform import warp_affine
from torch import Tensor
from torch.distributions import Bernoulli

from dlguard._validation import check_tensor, check_values, probability
from dlguard.augment.functional.padding import check_padding_mode, pad_resize_matrix

__all__ = ["ScoreGuidedPadding"]


class ScoreGuidedPadding(GeometricAugmentationBase2D):
    """With probability ``p``, pad an image of side ``d̂`` to ``(1 + p)·d̂`` and resize it back.

    The horizontal total ``p·W`` is split at random, ``d_l ~ U(0, p·W)``, ``d_r = p·W − d_l``, the
    vertical total likewise (SPEC §1); one ``p`` is both the probability and the padding ratio.
    :class:`~dlguard.callbacks.DScoreCallback` sets ``p = clip(v_robust / g(n), 0, 1)`` from each
    measurement; standalone, set ``p`` yourself (or from
    :func:`~dlguard.metrics.functional.d_score`'s ``augment_probability``). Batched and
    differentiable: one affine warp per batch.

    It follows the guide protocol (:class:`~dlguard.augment.Guide`): ``aug(images, labels)`` pads
    whatever the labels; ``aug(images)`` works as well. Replay parameters by keyword,
    ``aug(x, params=aug._params)``.

    ``p`` may change at any time (it is validated, and every kornia version's gate follows it).
    The first call after a change checks that the images are floats in ``[0, 1]`` without NaN;
    later calls do not (the check is a host sync, too much for every training batch).

    Args:
        p: probability and padding ratio in ``[0, 1]``.
        same_on_batch: one split for the whole batch.
        keepdim: keep a ``(C, H, W)`` input unbatched.
        padding_mode: what fills the padding: ``"zeros"`` (the paper's empty values), ``"border"`` (the
            edge pixels repeated) or ``"reflection"`` (the image mirrored at its edge), for images whose
            test inputs never show a black frame (photos).

    Example:
        >>> import torch
        >>> aug = ScoreGuidedPadding(p=1.0)
        >>> _ = torch.manual_seed(0)
        >>> out = aug(torch.ones(2, 1, 8, 8))
        >>> out.shape, bool((out < 0.5).any())  # shrunk by half, zero border somewhere
        (torch.Size([2, 1, 8, 8]), True)
    """

    def __init__(
        self, p: float = 0.5, same_on_batch: bool = False, keepdim: bool = False, padding_mode: str = "zeros"
    ) -> None:
        probability("p", p)
        padding_mode = check_padding_mode(padding_mode)
        super().__init__(p=p, same_on_batch=same_on_batch, keepdim=keepdim)
        self.flags = {"padding_mode": padding_mode}

    @property
    def p(self) -> float:
        """Probability of padding an image, and its padding ratio, in ``[0, 1]``."""
        return self._guide_p

    @p.setter
    def p(self, value: float) -> None:
        value = probability("p", value)
        self._guide_p = value
        self._check_pending = True
        # kornia derives state from p at construction in some versions (a Bernoulli sampler `_p_gen`,
        # created only for 0 < p < 1, and an `_always_apply` flag for p == 1); keep it in step so
        # that a new p changes how often images are padded whatever kornia is installed
        if 0.0 < value < 1.0:
            self._p_gen = Bernoulli(value)
        if "_always_apply" in self.__dict__:
            self._always_apply = value == 1.0 and getattr(self, "p_batch", 1.0) == 1.0

    def forward(
        self, input: Tensor, labels: Tensor | None = None, params: dict[str, Tensor] | None = None, **kwargs: Any
    ) -> Tensor:
        """Pad ``input`` ``(B, C, H, W)``; ``labels`` (the guide protocol's) are not read."""
        if self._check_pending:
            check_tensor("images", input, floating=True)
            check_values("images", input)
            self._check_pending = False
        return super().forward(input, params, **kwargs)

    def generate_parameters(self, batch_shape: tuple[int, ...]) -> dict[str, Tensor]:
        batch, height, width = batch_shape[0], batch_shape[-2], batch_shape[-1]
        draws = torch.rand(1 if self.same_on_batch else batch, 2, device=self.device, dtype=self.dtype)
        draws = draws.expand(batch, 2)
        ratio = torch.full((batch,), float(self.p), device=self.device, dtype=self.dtype)
        return {"ratio": ratio, "left": draws[:, 0] * ratio * width, "top": draws[:, 1] * ratio * height}

    def compute_transformation(self, input: Tensor, params: dict[str, Tensor], flags: dict[str, Any]) -> Tensor:
        height, width = input.shape[-2:]
        ratio = params["ratio"].to(input)
        return pad_resize_matrix(
            height, width, ratio * width, ratio * height, params["left"].to(input), params["top"].to(input)
        )

    def apply_transform(
        self, input: Tensor, params: dict[str, Tensor], flags: dict[str, Any], transform: Tensor | None = None
    ) -> Tensor:
        if transform is None:
            transform = self.compute_transformation(input, params, flags)
        return warp_affine(
            input,
            transform[:, :2].to(input),
            input.shape[-2:],
            padding_mode=flags.get("padding_mode", "zeros"),
            align_corners=False,
        )
