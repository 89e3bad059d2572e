"""torchmetrics metrics of dlguard; each delegates its maths to :mod:`dlguard.metrics.functional`.

``profile_neuron_ranges`` runs a model, so it lives in :mod:`dlguard.probes`; it is offered here
too, beside the criteria that need its ranges, and imported on first use (probes import the
functional maths, so a load-time import would be circular).
"""

from typing import Any

from dlguard.metrics.ae_quality import AEQuality
from dlguard.metrics.coverage import (
    KMultisectionCoverage,
    NeuronBoundaryCoverage,
    NeuronCoverage,
    OutputImpartiality,
    StrongNeuronActivationCoverage,
    TopKNeuronCoverage,
)
from dlguard.metrics.dscore import DScore
from dlguard.metrics.functional.coverage import NeuronRange
from dlguard.metrics.global_robustness import EmpiricalGlobalRobustness
from dlguard.metrics.latent_fid import LatentFeatures, LatentFrechetDistance, latent_frechet_distance
from dlguard.metrics.metamorphic import MetamorphicViolations
from dlguard.metrics.object_relevancy import DetectionObjectRelevancy, ObjectRelevancy
from dlguard.metrics.robustness import AdderGlobalRobustness, LocalRobustness

__all__ = [
    "AEQuality",
    "AdderGlobalRobustness",
    "DScore",
    "DetectionObjectRelevancy",
    "EmpiricalGlobalRobustness",
    "KMultisectionCoverage",
    "LatentFeatures",
    "LatentFrechetDistance",
    "LocalRobustness",
    "MetamorphicViolations",
    "NeuronBoundaryCoverage",
    "NeuronCoverage",
    "NeuronRange",
    "ObjectRelevancy",
    "OutputImpartiality",
    "StrongNeuronActivationCoverage",
    "TopKNeuronCoverage",
    "latent_frechet_distance",
    "profile_neuron_ranges",
]


def __getattr__(name: str) -> Any:
    if name == "profile_neuron_ranges":
        from dlguard.probes.neurons import profile_neuron_ranges

        return profile_neuron_ranges
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
