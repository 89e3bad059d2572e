"""torchmetrics metrics of dlguard; each delegates its maths to :mod:`dlguard.metrics.functional`.

A metric never runs a model: the neuron ranges KMNC, NBC and SNAC need come from
:func:`dlguard.probes.profile_neuron_ranges`.
"""

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
from dlguard.metrics.object_relevancy import ObjectRelevancy
from dlguard.metrics.robustness import AdderGlobalRobustness, LocalRobustness

__all__ = [
    "AEQuality",
    "AdderGlobalRobustness",
    "DScore",
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
]
