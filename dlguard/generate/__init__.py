"""Test generators and measurements that run a model, usable without Lightning; callbacks only schedule them."""

from dlguard.generate.dscore import dscore_layers, logit_width, measure_dscore
from dlguard.generate.sweep import RobustnessSweep, robustness_sweep

__all__ = ["RobustnessSweep", "dscore_layers", "logit_width", "measure_dscore", "robustness_sweep"]
