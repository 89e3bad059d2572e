"""Data: the embedded MNIST datamodule, scenes and roads, batch access, probe sets, the failure bank."""

from dlguard.data.backgrounds import BACKGROUND_KINDS, scene_backgrounds
from dlguard.data.batch import BatchAccessor, BatchKeys
from dlguard.data.detection_scenes import DetectionSceneDataModule, DetectionScenes, make_detection_scenes
from dlguard.data.failure_bank import FailureBank
from dlguard.data.images import LabelledImages
from dlguard.data.mnist import MNISTDataModule, embedded_mnist
from dlguard.data.probe_set import ProbeSet, ProbeSetDraw, ProbeSetPolicy
from dlguard.data.roads import ROAD_SIZE, RoadDataModule, Roads, make_roads, steering_angle
from dlguard.data.scenes import (
    SceneDataModule,
    Scenes,
    make_scenes,
)

__all__ = [
    "BACKGROUND_KINDS",
    "ROAD_SIZE",
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
    "embedded_mnist",
    "make_detection_scenes",
    "make_roads",
    "make_scenes",
    "scene_backgrounds",
    "steering_angle",
]
