"""kornia-style augmentation modules (random, replayable parameters) over the functional ops.

Also object relevancy's follow-ups (SPEC §3) and their cache: like every perturbation here they run no model
(what runs a model lives in :mod:`dlguard.generate`).
"""

from dlguard.augment.error_guided import ErrorGuidedAugmentation, guide_p, proposal_from_rates, rates_with_prior
from dlguard.augment.follow_up_cache import FollowUpCache
from dlguard.augment.follow_ups import (
    MUTATION_FUNCTIONS,
    FollowUps,
    MutationFunction,
    follow_up_layout,
    object_follow_ups,
)
from dlguard.augment.guide import Guide
from dlguard.augment.photometric import RandomBrightnessScale, RandomBrightnessShift, RandomNoise
from dlguard.augment.presets import (
    PROPERTY_PRESETS,
    capture_properties,
    exposure_properties,
    label_preserving_properties,
    property_preset,
)
from dlguard.augment.properties import Property, deeptest_properties, default_properties
from dlguard.augment.region_translate import RegionTranslate
from dlguard.augment.score_guided_padding import ScoreGuidedPadding
from dlguard.augment.weather import RandomFog, RandomRain

__all__ = [
    "MUTATION_FUNCTIONS",
    "PROPERTY_PRESETS",
    "ErrorGuidedAugmentation",
    "FollowUpCache",
    "FollowUps",
    "Guide",
    "MutationFunction",
    "Property",
    "RandomBrightnessScale",
    "RandomBrightnessShift",
    "RandomFog",
    "RandomNoise",
    "RandomRain",
    "RegionTranslate",
    "ScoreGuidedPadding",
    "capture_properties",
    "deeptest_properties",
    "default_properties",
    "exposure_properties",
    "follow_up_layout",
    "guide_p",
    "label_preserving_properties",
    "object_follow_ups",
    "property_preset",
    "proposal_from_rates",
    "rates_with_prior",
]
