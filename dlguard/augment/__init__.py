"""kornia-style augmentation modules (random, replayable parameters) over the functional ops."""

from dlguard.augment.region_translate import RegionTranslate
from dlguard.augment.score_guided_padding import ScoreGuidedPadding

__all__ = ["RegionTranslate", "ScoreGuidedPadding"]
