"""Lightning callbacks that schedule probes during validation and feed failures back to training."""

from dlguard.callbacks.coverage import NeuronCoverageCallback
from dlguard.callbacks.dscore import DScoreCallback
from dlguard.callbacks.robustness import RobustnessCallback

__all__ = ["DScoreCallback", "NeuronCoverageCallback", "RobustnessCallback"]
