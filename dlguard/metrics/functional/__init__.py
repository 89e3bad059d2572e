"""Pure tensor maths of every dlguard score: no state, no model."""

from dlguard.metrics.functional.ae_quality import AEQualityResult, ae_quality
from dlguard.metrics.functional.coverage import (
    NeuronRange,
    activation_jaccard_distance,
    k_multisection_coverage,
    neuron_boundary_coverage,
    neuron_coverage,
    neuron_values,
    output_impartiality,
    scaled_neuron_values,
    strong_neuron_activation_coverage,
    top_k_neuron_coverage,
)
from dlguard.metrics.functional.distribution import kde_log_density, kde_sample
from dlguard.metrics.functional.dscore import DScoreResult, d_score, g_bound
from dlguard.metrics.functional.hda import empirical_global_robustness, prediction_loss
from dlguard.metrics.functional.metamorphic import (
    MetamorphicRelation,
    check_outputs,
    classification_violations,
    is_filtered,
    passes_filter,
    regression_violations,
    squared_errors,
)
from dlguard.metrics.functional.object_relevancy import (
    OBJECT_MUTATION_FUNCTIONS,
    ObjectRelevancyScores,
    class_probability_and_rank,
    detection_relevancy,
    object_relevancy,
    preserving_score,
    relevancy_weights,
    removing_score,
    unreliable,
)
from dlguard.metrics.functional.perceptual import perceptual_quality
from dlguard.metrics.functional.robustness import (
    LocalRobustnessResult,
    adder_global_robustness,
    digit_sum,
    local_robustness,
)

__all__ = [
    "OBJECT_MUTATION_FUNCTIONS",
    "AEQualityResult",
    "DScoreResult",
    "LocalRobustnessResult",
    "MetamorphicRelation",
    "NeuronRange",
    "ObjectRelevancyScores",
    "activation_jaccard_distance",
    "adder_global_robustness",
    "ae_quality",
    "check_outputs",
    "class_probability_and_rank",
    "classification_violations",
    "d_score",
    "detection_relevancy",
    "digit_sum",
    "empirical_global_robustness",
    "g_bound",
    "is_filtered",
    "k_multisection_coverage",
    "kde_log_density",
    "kde_sample",
    "local_robustness",
    "neuron_boundary_coverage",
    "neuron_coverage",
    "neuron_values",
    "object_relevancy",
    "output_impartiality",
    "passes_filter",
    "perceptual_quality",
    "prediction_loss",
    "preserving_score",
    "regression_violations",
    "relevancy_weights",
    "removing_score",
    "scaled_neuron_values",
    "squared_errors",
    "strong_neuron_activation_coverage",
    "top_k_neuron_coverage",
    "unreliable",
]
