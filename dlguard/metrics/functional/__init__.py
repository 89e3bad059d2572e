"""Pure tensor maths of every dlguard score: no state, no model."""

from dlguard.metrics.functional.dscore import DScoreResult, d_score, g_bound

__all__ = ["DScoreResult", "d_score", "g_bound"]
