"""Small reference models, with shipped weights, for tests, the demo and recipes."""

from dlguard.zoo.models import cifar_cnn, mnist_a, mnist_b
from dlguard.zoo.module import ClassifierModule
from dlguard.zoo.pretrained import pretrained, save_pretrained

__all__ = ["ClassifierModule", "cifar_cnn", "mnist_a", "mnist_b", "pretrained", "save_pretrained"]
