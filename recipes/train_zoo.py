"""Train the shipped weights of ``mnist_a``, ``mnist_b``, ``vae_mnist``, ``scene_digits`` and ``road_epoch``.

Run from the repository root::

    python recipes/train_zoo.py              # every model, writes dlguard/zoo/weights/*.pt
    python recipes/train_zoo.py mnist_a      # one model
    python recipes/train_zoo.py vae_mnist    # HDA's VAE (hidden 256, latent 32), the global distribution's encoder
    python recipes/train_zoo.py scene_digits # the proposal classifier of dlguard.zoo.detector.ProposalDetector
    python recipes/train_zoo.py road_epoch   # the Epoch-shaped steering CNN on procedural roads

Each model trains with a fixed seed on the 4,000-image training split of the embedded MNIST
(``dlguard.data.MNISTDataModule()``), is stored in float16 (< 1 MB), reloaded with
``dlguard.zoo.pretrained`` and evaluated on the 1,000-image validation split; the printed
accuracies are those README quotes. ``vae_mnist`` is trained the same way with the ELBO and reports
the validation reconstruction MSE per pixel of the reloaded float32 network.

``scene_digits`` classifies the proposals of :class:`~dlguard.zoo.detector.ProposalDetector` (R-CNN's
recipe): the training digits are laid out in detection scenes (``make_detection_scenes``) three times
(seed 0, DetectionSceneDataModule's training scenes, and two more layouts), each scene's OpenCV proposals
are cut out as 28x28 crops and labelled with the digit (``digit + 1``) of the object they overlap with IoU
0.5 or more, else background (0), and the network trains on the crops with Adam and a one-cycle schedule,
on one CPU thread (small convolutions run fastest there, and the weights do not depend on the machine's
core count). The reloaded detector is evaluated on the first 200 validation scenes (the held-out digits, laid
out as DetectionSceneDataModule's validation scenes): precision and recall at IoU 0.5 with the default
``score_threshold`` (0.5), and AP at IoU 0.5 over scores down to 0.05.

``road_epoch`` (:func:`~dlguard.zoo.steering.epoch_steering`) learns steering angles from the procedural roads
of ``dlguard.data.roads.RoadDataModule()`` (4,000 training, 1,000 validation images, seed 0) with
:class:`~dlguard.zoo.steering.SteeringModule`: mean squared error, Adam at ``3e-3`` annealed to 0 by a cosine
over 15 epochs, batch 64, on one deterministic CPU thread (the weights do not depend on the machine's core
count; two runs write byte-identical files, whose sha256 is printed). The reloaded float32 network is
evaluated on the validation images: its MSE is printed next to the mean predictor's (always predicting the
training set's mean angle) and the labels' variance, to set beside DeepTest's Table 3 (0.06-0.10 on Udacity).
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import time
from collections.abc import Iterator

import lightning as L
import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch.nn import functional as F
from torchvision.ops import box_iou

from dlguard.data import DetectionScenes, MNISTDataModule, embedded_mnist, make_detection_scenes
from dlguard.data.roads import RoadDataModule
from dlguard.zoo import ClassifierModule, mnist_a, mnist_b, pretrained, save_pretrained
from dlguard.zoo.detector import ProposalDetector
from dlguard.zoo.proposals import label_proposals
from dlguard.zoo.scene_classifier import scene_digits
from dlguard.zoo.steering import SteeringModule, epoch_steering
from dlguard.zoo.vae import VAE, VAEModule

RECIPES = {
    "mnist_a": (mnist_a, 15),
    "mnist_b": (mnist_b, 12),
    "vae_mnist": (VAE, 30),
    "scene_digits": (scene_digits, 4),
    "road_epoch": (epoch_steering, 15),
}
# name: (architecture, epochs)
SCENE_LAYOUT_SEEDS = (0, 1000, 1001)  # layouts of the training digits; seed 0 gives DetectionSceneDataModule's
SCENE_EVALUATION = 200  # validation scenes the detector is evaluated on
ROAD_LR = 3e-3  # road_epoch's peak learning rate (cosine-annealed to 0)


def validation_accuracy(net: torch.nn.Module, datamodule: MNISTDataModule) -> float:
    correct = total = 0
    with torch.no_grad():
        for images, labels in datamodule.val_dataloader():
            correct += (net(images).argmax(dim=1) == labels).sum().item()
            total += len(labels)
    return correct / total


def validation_reconstruction_mse(vae: VAE, datamodule: MNISTDataModule) -> float:
    total = count = 0.0
    with torch.no_grad():
        for images, _ in datamodule.val_dataloader():
            total += (vae(images)[0] - images).square().sum().item()
            count += images.numel()
    return total / count


def _embedded_split(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The embedded digits split 4000/1000 like MNISTDataModule (stratified, ``seed``): uint8 digits and labels."""
    digits, labels = embedded_mnist()
    train_idx, val_idx = train_test_split(
        np.arange(len(labels)), train_size=4000, stratify=labels.numpy(), random_state=seed
    )
    return digits[train_idx], labels[train_idx], digits[val_idx], labels[val_idx]


def proposal_crops(detector: ProposalDetector, scenes: DetectionScenes) -> tuple[torch.Tensor, torch.Tensor]:
    """The crops of every scene's proposals and their labels (the object's ``digit + 1`` at IoU >= 0.5, else 0)."""
    proposals = detector.propose(scenes.images)
    labels = [
        label_proposals(boxes, scenes[i][1]["boxes"], scenes[i][1]["labels"]) for i, boxes in enumerate(proposals)
    ]
    return detector.crop(scenes.images, proposals), torch.cat(labels)


def detection_quality(
    detections: list[dict[str, torch.Tensor]], targets: list[dict[str, torch.Tensor]], iou_threshold: float = 0.5
) -> tuple[float, float, float]:
    """Precision, recall and average precision (all-point interpolated, VOC 2010+) at one IoU threshold.

    Detections are matched greedily by decreasing score to the unmatched object of the same label with
    the highest IoU, when it reaches ``iou_threshold``.
    """
    scores, hits, objects = [], [], 0
    for detection, target in zip(detections, targets, strict=True):
        objects += len(target["boxes"])
        order = detection["scores"].argsort(descending=True)
        boxes, labels = detection["boxes"][order], detection["labels"][order]
        iou = box_iou(boxes, target["boxes"]) if len(target["boxes"]) else torch.zeros(len(boxes), 0)
        iou[labels[:, None] != target["labels"][None, :]] = -1.0
        free = torch.ones(len(target["boxes"]), dtype=torch.bool)
        for k in range(len(boxes)):
            candidates = torch.where(free, iou[k], torch.full_like(iou[k], -1.0))
            best = int(candidates.argmax()) if len(candidates) else -1
            hit = best >= 0 and bool(candidates[best] >= iou_threshold)
            if hit:
                free[best] = False
            hits.append(hit)
        scores.append(detection["scores"][order].detach().cpu())
    hit = torch.tensor(hits, dtype=torch.float64)[torch.cat(scores).argsort(descending=True, stable=True)]
    true_positives = hit.cumsum(0)
    precision = true_positives / torch.arange(1, len(hit) + 1)
    recall = true_positives / max(objects, 1)
    envelope = precision.flip(0).cummax(0).values.flip(0)  # best precision at this recall or more
    steps = torch.diff(recall, prepend=torch.zeros(1))
    average_precision = float((steps * envelope).sum())
    return float(hit.mean()) if len(hit) else 1.0, float(hit.sum()) / max(objects, 1), average_precision


@contextlib.contextmanager
def _one_deterministic_thread() -> Iterator[None]:
    """One CPU thread and deterministic algorithms inside, the caller's settings restored after."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def train_scene_digits(seed: int = 0) -> float:
    """Train ``scene_digits`` on proposal crops of the training digits' scenes; returns the detection recall."""
    epochs = RECIPES["scene_digits"][1]
    train_x, train_y, val_x, val_y = _embedded_split(seed)
    with _one_deterministic_thread():
        torch.manual_seed(seed)
        net = scene_digits()
        detector = ProposalDetector(net)  # proposals and crops do not depend on the classifier
        parts = [proposal_crops(detector, make_detection_scenes(train_x, train_y, seed=s)) for s in SCENE_LAYOUT_SEEDS]
        crops, labels = torch.cat([part[0] for part in parts]), torch.cat([part[1] for part in parts])
        batch_size = 128
        optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
        steps = epochs * -(-len(crops) // batch_size)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
        generator = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            for batch in torch.randperm(len(crops), generator=generator).split(batch_size):
                loss = F.cross_entropy(net(crops[batch]), labels[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
        path = save_pretrained("scene_digits", net)

        scenes = make_detection_scenes(val_x, val_y, seed=seed + 1)  # DetectionSceneDataModule(seed=seed).val_set
        images, targets = DetectionScenes.collate_fn([scenes[i] for i in range(SCENE_EVALUATION)])
        with torch.no_grad():
            precision, recall, _ = detection_quality(ProposalDetector.pretrained()(images), targets)
            # AP over the whole score range: boxes down to torchvision's default box_score_thresh
            detections = ProposalDetector.pretrained(score_threshold=0.05)(images)
            average_precision = detection_quality(detections, targets)[2]
    print(
        f"scene_digits: {epochs} epochs on {len(crops)} crops ({int((labels > 0).sum())} of them digits), "
        f"{path.stat().st_size / 1024:.0f} KiB; detector on {SCENE_EVALUATION} validation scenes: "
        f"precision {precision:.4f}, recall {recall:.4f}, AP50 {average_precision:.4f}"
    )
    return recall


def validation_steering_mse(net: torch.nn.Module, datamodule: RoadDataModule) -> float:
    total = count = 0.0
    with torch.no_grad():
        for images, angles in datamodule.val_dataloader():
            total += (net(images).squeeze(-1) - angles).square().sum().item()
            count += len(angles)
    return total / count


def train_road_epoch(seed: int = 0) -> float:
    """Train ``road_epoch`` on the procedural roads; returns the reloaded network's validation MSE."""
    epochs = RECIPES["road_epoch"][1]
    start = time.perf_counter()
    with _one_deterministic_thread():
        L.seed_everything(seed, workers=True, verbose=False)
        datamodule = RoadDataModule(batch_size=64, seed=seed)
        module = SteeringModule(epoch_steering(), lr=ROAD_LR, cosine_decay=True)
        trainer = L.Trainer(
            max_epochs=epochs,
            deterministic=True,
            logger=False,
            enable_checkpointing=False,
            devices=1,
            accelerator="cpu",
        )
        trainer.fit(module, datamodule=datamodule)
        path = save_pretrained("road_epoch", module.net)
        seconds = time.perf_counter() - start
        mse = validation_steering_mse(pretrained("road_epoch"), datamodule)
    angles = datamodule.val_set.angles.double()
    mean_predictor = float((angles - datamodule.train_set.angles.double().mean()).square().mean())
    variance = float(angles.var(correction=0))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    print(
        f"road_epoch: {epochs} epochs on {len(datamodule.train_set)} roads in {seconds:.0f} s, "
        f"{path.stat().st_size / 1024:.0f} KiB, sha256 {digest}; validation MSE {mse:.4f} "
        f"(mean predictor {mean_predictor:.4f}, label variance {variance:.4f}; DeepTest Table 3: 0.06-0.10 on Udacity)"
    )
    return mse


def train(name: str, seed: int = 0) -> float:
    if name == "scene_digits":
        return train_scene_digits(seed)
    if name == "road_epoch":
        return train_road_epoch(seed)
    architecture, epochs = RECIPES[name]
    L.seed_everything(seed, workers=True, verbose=False)
    datamodule = MNISTDataModule(batch_size=64, seed=seed)
    if name == "vae_mnist":
        module = VAEModule(architecture(), lr=1e-3)
    else:
        module = ClassifierModule(architecture(), num_classes=10, lr=1e-3)
    trainer = L.Trainer(
        max_epochs=epochs,
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        devices=1,
        accelerator="cpu",
    )
    trainer.fit(module, datamodule=datamodule)
    if name == "vae_mnist":
        path = save_pretrained(name, module.vae)
        mse = validation_reconstruction_mse(pretrained(name), datamodule)
        print(f"{name}: {epochs} epochs, {path.stat().st_size / 1024:.0f} KiB, validation reconstruction MSE {mse:.5f}")
        return mse
    path = save_pretrained(name, module.net)
    accuracy = validation_accuracy(pretrained(name), datamodule)
    print(f"{name}: {epochs} epochs, {path.stat().st_size / 1024:.0f} KiB, validation accuracy {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    for model_name in sys.argv[1:] or list(RECIPES):
        train(model_name)
