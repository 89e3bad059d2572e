"""dlguard: deep-learning testing research as torchmetrics, Lightning callbacks and augmentations."""

__version__ = "0.1.0"

__all__ = ["__version__"]
