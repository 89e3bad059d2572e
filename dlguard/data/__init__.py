"""Data: the embedded MNIST datamodule and balanced sampling of correct predictions."""

from dlguard.data.images import LabelledImages
from dlguard.data.mnist import MNISTDataModule, embedded_mnist
from dlguard.data.sampling import BalancedSubset, balanced_correct_subset
from dlguard.probes import model_device  # re-exported: the data helpers and the demo use it

__all__ = [
    "BalancedSubset",
    "LabelledImages",
    "MNISTDataModule",
    "balanced_correct_subset",
    "embedded_mnist",
    "model_device",
]
