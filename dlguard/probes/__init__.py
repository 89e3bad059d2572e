"""Model surgery as context managers that leave no trace (SPEC §0)."""

from dlguard.probes.adapter import ModelAdapter
from dlguard.probes.budget import ACTIVATION_BUDGET, default_max_batch
from dlguard.probes.capture import capture_activations
from dlguard.probes.counting import ForwardCount, batch_rows, count_forward_passes
from dlguard.probes.evaluation import evaluation, is_probing, model_device
from dlguard.probes.intervene import intervene
from dlguard.probes.layers import LayerSpec, resolve_layers, select_layers
from dlguard.probes.loop_outputs import LoopOutputs
from dlguard.probes.neurons import NEURON_LAYER_TYPES, neuron_layers, neuron_output, profile_neuron_ranges
from dlguard.probes.packing import packed_passes
from dlguard.probes.region_deletion import deletion_mutant_logits, region_keep_masks

__all__ = [
    "ACTIVATION_BUDGET",
    "NEURON_LAYER_TYPES",
    "ForwardCount",
    "LayerSpec",
    "LoopOutputs",
    "ModelAdapter",
    "batch_rows",
    "capture_activations",
    "count_forward_passes",
    "default_max_batch",
    "deletion_mutant_logits",
    "evaluation",
    "intervene",
    "is_probing",
    "model_device",
    "neuron_layers",
    "neuron_output",
    "packed_passes",
    "profile_neuron_ranges",
    "region_keep_masks",
    "resolve_layers",
    "select_layers",
]
