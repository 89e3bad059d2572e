"""Test generators and measurements that run a model, usable without Lightning; callbacks only schedule them."""

from dlguard.generate.attacks import fgsm, pgd
from dlguard.generate.deeptest_search import SearchResult, coverage_guided_search, first_increments, search_violations
from dlguard.generate.distribution import GlobalDistribution, PCADistribution, VAEDistribution
from dlguard.generate.dscore import DScoreRun, dscore_layers, dscore_test
from dlguard.generate.failures import Failures
from dlguard.generate.genetic import GAResult, two_step_ga
from dlguard.generate.gradients import input_gradients, loss_gradient
from dlguard.generate.hda import HOLDOUT_SALT, HDARun, HeldOut, hda_test, select_hda_seeds
from dlguard.generate.metamorphic import MetamorphicFailures, MetamorphicRun, metamorphic_test
from dlguard.generate.object_relevancy import ObjectRelevancyRun, object_relevancy_test, objects_on_fresh_backgrounds
from dlguard.generate.outputs import check_num_classes, correct_predictions, logit_width, model_outputs
from dlguard.generate.sampling import BalancedSubset, balanced_correct_subset
from dlguard.generate.seeds import gradient_indicator, seed_scores, select_seeds, separation_indicator
from dlguard.generate.sweep import RobustnessSweep, robustness_sweep
from dlguard.generate.transplant_attack import TRANSPLANT_STRATEGIES, TransplantAttackResult, transplant_attack

__all__ = [
    "HOLDOUT_SALT",
    "TRANSPLANT_STRATEGIES",
    "BalancedSubset",
    "DScoreRun",
    "Failures",
    "GAResult",
    "GlobalDistribution",
    "HDARun",
    "HeldOut",
    "MetamorphicFailures",
    "MetamorphicRun",
    "ObjectRelevancyRun",
    "PCADistribution",
    "RobustnessSweep",
    "SearchResult",
    "TransplantAttackResult",
    "VAEDistribution",
    "balanced_correct_subset",
    "check_num_classes",
    "correct_predictions",
    "coverage_guided_search",
    "dscore_layers",
    "dscore_test",
    "fgsm",
    "first_increments",
    "gradient_indicator",
    "hda_test",
    "input_gradients",
    "logit_width",
    "loss_gradient",
    "metamorphic_test",
    "model_outputs",
    "object_relevancy_test",
    "objects_on_fresh_backgrounds",
    "pgd",
    "robustness_sweep",
    "search_violations",
    "seed_scores",
    "select_hda_seeds",
    "select_seeds",
    "separation_indicator",
    "transplant_attack",
    "two_step_ga",
]
