"""Pure tensor maths of every dlguard score: no state, no model."""

from dlguard.metrics.functional.coverage import (
    NeuronRange,
    activation_jaccard_distance,
    k_multisection_coverage,
    neuron_boundary_coverage,
    neuron_coverage,
    neuron_values,
    output_impartiality,
    strong_neuron_activation_coverage,
    top_k_neuron_coverage,
)
from dlguard.metrics.functional.dscore import DScoreResult, d_score, g_bound

__all__ = [
    "DScoreResult",
    "NeuronRange",
    "activation_jaccard_distance",
    "d_score",
    "g_bound",
    "k_multisection_coverage",
    "neuron_boundary_coverage",
    "neuron_coverage",
    "neuron_values",
    "output_impartiality",
    "strong_neuron_activation_coverage",
    "top_k_neuron_coverage",
]
