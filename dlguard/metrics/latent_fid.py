r"""Fréchet distance between two sets of inputs in an encoder's latent space (HDA's FID for grey-scale data).

The HDA paper measures how far test cases drift from their seeds with FID, computed on InceptionV3
features for colour images and on VAE latent features for MNIST and Fashion-MNIST. This module
gives the latter, for any encoder: with ``(μ_r, Σ_r)`` and ``(μ_f, Σ_f)`` the mean and covariance
of the latent features of the real and the fake inputs,

.. math::
    d^2 = \lVert μ_r − μ_f \rVert^2 + \operatorname{Tr}\bigl(Σ_r + Σ_f − 2 (Σ_r Σ_f)^{1/2}\bigr).

The statistics and the formula are torchmetrics' :class:`~torchmetrics.image.fid.FrechetInceptionDistance`
with a custom feature extractor, :class:`LatentFeatures`; states are float64 sums reduced by ``sum``
across processes.

How torchmetrics hands inputs to a custom feature module (read in its ``image/fid.py``):

- 1.3.x: ``update`` converts the inputs to ``uint8`` (``(imgs * 255).byte()``) whenever
  ``normalize=True``, custom module or not; with ``normalize=False`` (the default) they pass
  unchanged. A module without an integer ``num_features`` attribute is probed with a
  ``(1, 3, 299, 299)`` uint8 image.
- 1.4.0 and later (1.9.0 installed): a custom module always gets the inputs unchanged
  (``normalize`` only picks the dtype of the probe image, sized by ``input_img_size``).

So this module always passes ``normalize=False`` and always sets ``num_features``: float inputs in
``[0, 1]`` reach the encoder unchanged on every supported version, and no probe image is made.
:class:`LatentFeatures` still accepts ``uint8`` inputs (divided by 255). Every version computes
``(Σ_r Σ_f)^{1/2}`` through ``torch.linalg.eigvals`` in float64 and needs at least 2 inputs per side;
rounding can leave identical sets at about −1e-17, which :meth:`LatentFrechetDistance.compute` clamps to 0.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics.image.fid import FrechetInceptionDistance

from dlguard._validation import check_tensor, check_values, positive_int

__all__ = ["LatentFeatures", "LatentFrechetDistance", "latent_frechet_distance"]

Encoder = Callable[[Tensor], Any]


def _infer_num_features(encoder: Encoder, num_features: int | None) -> int:
    """``num_features``, else the encoder's ``num_features`` or ``latent`` attribute (a VAE's latent size)."""
    if num_features is not None:
        return positive_int("num_features", num_features)
    for attribute in ("num_features", "latent"):
        value = getattr(encoder, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ValueError(
        f"num_features: {type(encoder).__name__} has no integer `num_features` or `latent` attribute; "
        "pass the feature size D of its (B, D) output"
    )


class LatentFeatures(nn.Module):
    """A frozen latent feature extractor ``(B, ...) → (B, D)`` for :class:`LatentFrechetDistance`.

    Wraps an encoder: a callable returning features ``(B, D)``, or a VAE-like module whose
    ``encode(x)`` returns ``(μ, log σ²)``, of which the posterior mean ``μ`` is the feature (a
    module with ``encode`` is always called through it). A module encoder is deep-copied, put in
    eval mode and frozen (``requires_grad`` off): later training of the original does not move the
    feature space, so distances stay comparable across epochs, and the original is left exactly as
    it was. The copy follows the metric to its device; inputs are moved to the encoder's device and
    dtype, ``uint8`` inputs are divided by 255.

    Args:
        encoder: the encoder (``nn.Module`` or any callable; a callable that is not a module is
            used as is, on the inputs' device).
        num_features: ``D``; default: the encoder's ``num_features`` or ``latent`` attribute.

    Example:
        >>> import torch
        >>> features = LatentFeatures(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2)), num_features=2)
        >>> features(torch.rand(3, 1, 2, 2)).shape
        torch.Size([3, 2])
    """

    def __init__(self, encoder: Encoder, num_features: int | None = None) -> None:
        super().__init__()
        if not callable(encoder):
            raise ValueError(f"encoder: expected a module or callable returning (B, D), got {type(encoder).__name__}")
        self.num_features = _infer_num_features(encoder, num_features)
        if isinstance(encoder, nn.Module):
            encoder = copy.deepcopy(encoder).requires_grad_(False)
        self.encoder = encoder
        self.train(False)

    def train(self, mode: bool = True) -> LatentFeatures:
        """Stay in eval mode whatever is asked (a parent's ``train()`` must not switch on dropout or BatchNorm)."""
        return super().train(False)

    def forward(self, imgs: Tensor) -> Tensor:
        """Latent features ``(B, D)`` of inputs ``(B, ...)`` (float, or uint8 in ``[0, 255]``)."""
        check_tensor("imgs", imgs)
        if imgs.dtype == torch.uint8:
            imgs = imgs.float() / 255
        elif not imgs.is_floating_point():
            raise ValueError(f"imgs: expected floating-point values in [0, 1] or uint8, got {imgs.dtype}")
        check_values("imgs", imgs, None)
        parameter = next(iter(self.parameters()), None)
        if parameter is not None:
            imgs = imgs.to(device=parameter.device, dtype=parameter.dtype)
        encode = getattr(self.encoder, "encode", None)
        with torch.no_grad():
            features = encode(imgs) if callable(encode) else self.encoder(imgs)
        if callable(encode) and isinstance(features, tuple | list):
            features = features[0]  # (μ, log σ²): the posterior mean
        if not isinstance(features, Tensor) or tuple(features.shape) != (len(imgs), self.num_features):
            shape = tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__
            raise ValueError(
                f"encoder: expected features of shape ({len(imgs)}, {self.num_features}) (num_features), got {shape}"
            )
        return features


class LatentFrechetDistance(FrechetInceptionDistance):
    """Fréchet distance between real and fake inputs in an encoder's latent space (FID on latent features).

    ``update(imgs, real)`` adds inputs ``(B, ...)`` (float in ``[0, 1]``, or uint8) to the real
    (``real=True``) or the fake set; ``compute()`` needs at least 2 of each. Everything else is
    torchmetrics' ``FrechetInceptionDistance``: the metric starts on the encoder's device and moves
    with it (``.to``), ``reset_real_features=False`` keeps the real
    statistics across resets (e.g. the seeds, fixed while the test cases change), states are sums
    reduced across processes, and the result has the encoder's output dtype.

    Args:
        encoder: the encoder, see :class:`LatentFeatures` (or a :class:`LatentFeatures`).
        num_features: ``D``; default: the encoder's ``num_features`` or ``latent`` attribute.
        reset_real_features: also reset the real statistics in :meth:`reset`.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
        >>> metric = LatentFrechetDistance(encoder, num_features=3)
        >>> seeds = torch.rand(64, 1, 4, 4)
        >>> metric.update(seeds, real=True)
        >>> metric.update(seeds, real=False)
        >>> round(float(metric.compute()), 3)  # the same set: 0
        0.0
    """

    def __init__(
        self,
        encoder: Encoder,
        num_features: int | None = None,
        reset_real_features: bool = True,
        **kwargs: Any,
    ) -> None:
        features = encoder if isinstance(encoder, LatentFeatures) else LatentFeatures(encoder, num_features)
        super().__init__(feature=features, reset_real_features=reset_real_features, normalize=False, **kwargs)
        parameter = next(iter(features.parameters()), None)
        if parameter is not None:  # states beside the encoder: features never cross devices
            self.to(parameter.device)

    def compute(self) -> Tensor:
        """``d²`` between the real and the fake inputs added (at least 2 of each)."""
        for side, samples in (("real", self.real_features_num_samples), ("fake", self.fake_features_num_samples)):
            if int(samples) < 2:
                raise ValueError(
                    f"{side}: the Fréchet distance needs at least 2 {side} inputs (a covariance), got {int(samples)}"
                )
        return super().compute().clamp_min(0.0)  # d² ≥ 0: identical sets may round to -1e-17


def latent_frechet_distance(real: Tensor, fake: Tensor, encoder: Encoder, num_features: int | None = None) -> Tensor:
    """Fréchet distance between ``real`` and ``fake`` inputs in ``encoder``'s latent space (see the module doc).

    Args:
        real: ``(N, ...)`` reference inputs (e.g. the seeds), ``N ≥ 2``, float in ``[0, 1]`` or uint8.
        fake: ``(M, ...)`` compared inputs (e.g. the test cases), ``M ≥ 2``, of the same per-input shape.
        encoder: a callable returning ``(B, D)`` features, or a VAE-like module whose ``encode``
            returns ``(μ, log σ²)`` (``μ`` is used), e.g. :class:`~dlguard.zoo.vae.VAE`.
        num_features: ``D``; default: the encoder's ``num_features`` or ``latent`` attribute.

    Returns:
        ``d²``, a scalar in the encoder's output dtype (≈ 0 for identical sets).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
        >>> seeds = torch.rand(64, 1, 4, 4)
        >>> shifted = latent_frechet_distance(seeds, (seeds + 0.2).clamp(0, 1), encoder, num_features=3)
        >>> bool(shifted > latent_frechet_distance(seeds, seeds, encoder, num_features=3))
        True
    """
    for name, value in (("real", real), ("fake", fake)):
        check_tensor(name, value)
        if len(value) < 2:
            raise ValueError(f"{name}: the Fréchet distance needs at least 2 inputs (a covariance), got {len(value)}")
    if real.shape[1:] != fake.shape[1:]:
        raise ValueError(
            f"fake: expected inputs of the shape of real's {tuple(real.shape[1:])}, got {tuple(fake.shape[1:])}"
        )
    metric = LatentFrechetDistance(encoder, num_features)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    return metric.compute()
