"""Data: the embedded MNIST datamodule, batch access, probe sets, balanced sampling, the failure bank."""

from dlguard.data.backgrounds import BACKGROUND_KINDS, scene_backgrounds
from dlguard.data.batch import BatchAccessor, BatchKeys
from dlguard.data.detection_scenes import DetectionSceneDataModule, DetectionScenes, make_detection_scenes
from dlguard.data.failure_bank import FailureBank
from dlguard.data.images import LabelledImages
from dlguard.data.mnist import MNISTDataModule, embedded_mnist
from dlguard.data.probe_set import ProbeSet, ProbeSetDraw, ProbeSetPolicy
from dlguard.data.roads import ROAD_SIZE, RoadDataModule, Roads, make_roads, steering_angle
from dlguard.data.sampling import BalancedSubset, balanced_correct_subset
from dlguard.data.scenes import (
    SceneDataModule,
    Scenes,
    make_scenes,
)
from dlguard.probes import model_device  # re-exported: the data helpers and the demo use it

__all__ = [
    "BACKGROUND_KINDS",
    "ROAD_SIZE",
    "BalancedSubset",
    "BatchAccessor",
    "BatchKeys",
    "DetectionSceneDataModule",
    "DetectionScenes",
    "FailureBank",
    "LabelledImages",
    "MNISTDataModule",
    "ProbeSet",
    "ProbeSetDraw",
    "ProbeSetPolicy",
    "RoadDataModule",
    "Roads",
    "SceneDataModule",
    "Scenes",
    "balanced_correct_subset",
    "embedded_mnist",
    "make_detection_scenes",
    "make_roads",
    "make_scenes",
    "model_device",
    "scene_backgrounds",
    "steering_angle",
]
