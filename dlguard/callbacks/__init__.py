"""Lightning callbacks that measure models during validation and feed failures back into training."""

from dlguard.callbacks.base import ProbeCallback
from dlguard.callbacks.closed_loop import closed_loop_callbacks
from dlguard.callbacks.coverage import NeuronCoverageCallback
from dlguard.callbacks.dscore import DScoreCallback
from dlguard.callbacks.hda import HDACallback
from dlguard.callbacks.metamorphic import MetamorphicCallback
from dlguard.callbacks.noise import GaussianNoise
from dlguard.callbacks.object_relevancy import ObjectRelevancyCallback
from dlguard.callbacks.originals import KeepOriginals
from dlguard.callbacks.replay import FailureReplay
from dlguard.callbacks.robustness import RobustnessCallback

__all__ = [
    "DScoreCallback",
    "FailureReplay",
    "GaussianNoise",
    "HDACallback",
    "KeepOriginals",
    "MetamorphicCallback",
    "NeuronCoverageCallback",
    "ObjectRelevancyCallback",
    "ProbeCallback",
    "RobustnessCallback",
    "closed_loop_callbacks",
]
