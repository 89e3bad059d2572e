"""Test generators that run a model: the robustness sweep (later: GA, greedy coverage search, attacks)."""

from dlguard.generate.sweep import robustness_sweep

__all__ = ["robustness_sweep"]
