"""Trained weights shipped inside the package (made by ``recipes/train_zoo.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from dlguard.zoo.models import mnist_a, mnist_b
from dlguard.zoo.scene_classifier import scene_digits
from dlguard.zoo.steering import epoch_steering
from dlguard.zoo.vae import VAE

__all__ = ["WEIGHTS_DIR", "pretrained", "save_pretrained"]

WEIGHTS_DIR = Path(__file__).parent / "weights"
_ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "mnist_a": mnist_a,
    "mnist_b": mnist_b,
    "vae_mnist": VAE,
    "scene_digits": scene_digits,
    "road_epoch": epoch_steering,
}


def _weights_path(name: str) -> Path:
    if name not in _ARCHITECTURES:
        raise ValueError(f"name: unknown pretrained model {name!r}; available: {sorted(_ARCHITECTURES)}")
    return WEIGHTS_DIR / f"{name}.pt"


def pretrained(name: str, map_location: str | torch.device = "cpu") -> nn.Module:
    """Return a reference network with its shipped weights, in eval mode.

    Weights are stored in float16 to stay under 1 MB and loaded as float32; the accuracies in
    README are measured on the loaded float32 networks.

    Args:
        name: ``"mnist_a"`` or ``"mnist_b"`` (classifiers of 28x28 inputs in ``[0, 1]``, 10 classes), or
            ``"vae_mnist"`` (HDA's MNIST :class:`~dlguard.zoo.vae.VAE`: hidden 256, latent 32), or
            ``"scene_digits"`` (:func:`~dlguard.zoo.scene_classifier.scene_digits`, the proposal classifier of
            :class:`~dlguard.zoo.detector.ProposalDetector`: RGB 28x28 crops, background + 10 digits), or
            ``"road_epoch"`` (:func:`~dlguard.zoo.steering.epoch_steering`: RGB 48x64 road images from
            :func:`~dlguard.data.roads.make_roads` to a steering angle ``(B, 1)`` in radians).
        map_location: device to load onto.

    Example:
        >>> import torch
        >>> net = pretrained("mnist_a")
        >>> net(torch.zeros(1, 1, 28, 28)).shape, net.training
        (torch.Size([1, 10]), False)
        >>> pretrained("vae_mnist").posterior(torch.zeros(1, 1, 28, 28))[0].shape
        torch.Size([1, 32])
    """
    path = _weights_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `python recipes/train_zoo.py` to make it")
    state = torch.load(path, map_location=map_location, weights_only=True)
    net = _ARCHITECTURES[name]().to(map_location)
    net.load_state_dict({key: value.float() for key, value in state.items()})
    return net.eval()


def save_pretrained(name: str, net: nn.Module) -> Path:
    """Store ``net``'s weights as the shipped float16 weights of ``name``; returns the path."""
    path = _weights_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({key: value.detach().cpu().half() for key, value in net.state_dict().items()}, path)
    return path
