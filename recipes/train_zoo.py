"""Train the shipped reference weights of ``mnist_a``, ``mnist_b`` and ``vae_mnist`` on the embedded MNIST.

Run from the repository root::

    python recipes/train_zoo.py              # every model, writes dlguard/zoo/weights/*.pt
    python recipes/train_zoo.py mnist_a      # one model
    python recipes/train_zoo.py vae_mnist    # HDA's VAE (hidden 256, latent 32), the global distribution's encoder

Each model trains with a fixed seed on the 4,000-image training split of the embedded MNIST
(``dlguard.data.MNISTDataModule()``), is stored in float16 (< 1 MB), reloaded with
``dlguard.zoo.pretrained`` and evaluated on the 1,000-image validation split; the printed
accuracies are those README quotes. ``vae_mnist`` is trained the same way with the ELBO and reports
the validation reconstruction MSE per pixel of the reloaded float32 network.
"""

from __future__ import annotations

import sys

import lightning as L
import torch

from dlguard.data import MNISTDataModule
from dlguard.zoo import ClassifierModule, mnist_a, mnist_b, pretrained, save_pretrained
from dlguard.zoo.vae import VAE, VAEModule

RECIPES = {"mnist_a": (mnist_a, 15), "mnist_b": (mnist_b, 12), "vae_mnist": (VAE, 30)}
# name: (architecture, epochs)


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


def train(name: str, seed: int = 0) -> float:
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
