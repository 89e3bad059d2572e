"""torchmetrics metrics of dlguard; each delegates its maths to :mod:`dlguard.metrics.functional`."""

from dlguard.metrics.dscore import DScore

__all__ = ["DScore"]
