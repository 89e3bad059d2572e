"""Model surgery as context managers that leave no trace (SPEC §0)."""

from dlguard.probes.capture import capture_activations
from dlguard.probes.evaluation import evaluation
from dlguard.probes.intervene import intervene
from dlguard.probes.layers import LayerSpec, resolve_layers, select_layers

__all__ = [
    "LayerSpec",
    "capture_activations",
    "evaluation",
    "intervene",
    "resolve_layers",
    "select_layers",
]
