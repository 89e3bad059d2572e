"""Small reference models, with shipped weights, for tests, the demo and recipes."""

from dlguard.zoo.detector import ProposalDetector
from dlguard.zoo.models import cifar_cnn, mnist_a, mnist_b
from dlguard.zoo.module import ClassifierModule
from dlguard.zoo.pretrained import pretrained, save_pretrained
from dlguard.zoo.scene_classifier import scene_digits
from dlguard.zoo.steering import SteeringModule, chauffeur_steering, epoch_steering
from dlguard.zoo.torchvision_detector import random_torchvision_detector
from dlguard.zoo.vae import VAE, VAEModule, elbo_loss

__all__ = [
    "VAE",
    "ClassifierModule",
    "ProposalDetector",
    "SteeringModule",
    "VAEModule",
    "chauffeur_steering",
    "cifar_cnn",
    "elbo_loss",
    "epoch_steering",
    "mnist_a",
    "mnist_b",
    "pretrained",
    "random_torchvision_detector",
    "save_pretrained",
    "scene_digits",
]
