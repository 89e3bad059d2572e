"""kornia-style augmentation modules (random, replayable parameters) over the functional ops."""

from dlguard.augment.error_guided import ErrorGuidedAugmentation
from dlguard.augment.photometric import RandomBrightnessScale, RandomBrightnessShift, RandomNoise
from dlguard.augment.properties import Property, deeptest_properties, default_properties
from dlguard.augment.region_translate import RegionTranslate
from dlguard.augment.score_guided_padding import ScoreGuidedPadding
from dlguard.augment.weather import RandomFog, RandomRain

__all__ = [
    "ErrorGuidedAugmentation",
    "Property",
    "RandomBrightnessScale",
    "RandomBrightnessShift",
    "RandomFog",
    "RandomNoise",
    "RandomRain",
    "RegionTranslate",
    "ScoreGuidedPadding",
    "deeptest_properties",
    "default_properties",
]
