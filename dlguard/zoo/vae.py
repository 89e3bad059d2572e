"""HDA's variational autoencoder (SPEC §4): the encoder whose posteriors make the global distribution.

For 28x28 MNIST the paper uses an MLP with one hidden layer of 256 units and a 32-dimensional
latent space: ``x → 256 → (μ, log σ²)`` and ``z → 256 → x̂`` with a sigmoid output, trained with the
ELBO (summed binary cross-entropy reconstruction plus the KL divergence to ``N(0, I)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import lightning as L
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from dlguard._validation import positive_int

__all__ = ["VAE", "VAEModule", "elbo_loss"]


class VAE(nn.Module):
    """MLP variational autoencoder: encoder ``input → hidden → (μ, log σ²)``, decoder ``latent → hidden → input``.

    Args:
        input_shape: shape of one input, e.g. ``(1, 28, 28)``; values in ``[0, 1]``.
        hidden: width of the hidden layer of encoder and decoder (paper: 256).
        latent: dimension ``D`` of the latent space (paper: 32).

    Attributes:
        input_shape: as given, a tuple.
        latent: ``D``.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> vae = VAE().eval()
        >>> x = torch.rand(2, 1, 28, 28)
        >>> reconstruction, mu, log_var = vae(x)
        >>> reconstruction.shape, mu.shape, log_var.shape
        (torch.Size([2, 1, 28, 28]), torch.Size([2, 32]), torch.Size([2, 32]))
        >>> bool(torch.equal(reconstruction, vae.decode(mu)))  # eval mode decodes the posterior mean
        True
    """

    def __init__(self, input_shape: Sequence[int] = (1, 28, 28), hidden: int = 256, latent: int = 32) -> None:
        super().__init__()
        if isinstance(input_shape, int | str) or not isinstance(input_shape, Sequence) or len(input_shape) == 0:
            raise ValueError(f"input_shape: expected a non-empty sequence of sizes, got {input_shape!r}")
        for size in input_shape:
            positive_int("input_shape", size)
        self.input_shape: tuple[int, ...] = tuple(int(size) for size in input_shape)
        self.latent = positive_int("latent", latent)
        hidden = positive_int("hidden", hidden)
        features = math.prod(self.input_shape)
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(features, hidden), nn.ReLU())
        self.fc_mu = nn.Linear(hidden, self.latent)
        self.fc_log_var = nn.Linear(hidden, self.latent)
        self.decoder = nn.Sequential(nn.Linear(self.latent, hidden), nn.ReLU(), nn.Linear(hidden, features))

    def _check_shape(self, x: Tensor) -> None:
        if x.ndim != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"x: expected shape (B, {', '.join(map(str, self.input_shape))}), got {tuple(x.shape)}")

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior parameters ``(μ, log σ²)``, each ``(B, latent)``, of inputs ``(B, *input_shape)``."""
        self._check_shape(x)
        hidden = self.encoder(x)
        return self.fc_mu(hidden), self.fc_log_var(hidden)

    def posterior(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior ``(μ, σ)``, each ``(B, latent)``: the Gaussian ``N(μ, diag σ²)`` each input maps to.

        Example:
            >>> _ = torch.manual_seed(0)
            >>> mu, sigma = VAE(input_shape=(4,), hidden=8, latent=2).posterior(torch.rand(3, 4))
            >>> mu.shape, bool((sigma > 0).all())
            (torch.Size([3, 2]), True)
        """
        mu, log_var = self.encode(x)
        return mu, torch.exp(0.5 * log_var)

    def decode(self, z: Tensor) -> Tensor:
        """Images ``(B, *input_shape)`` with values in ``[0, 1]`` from latent points ``(B, latent)``."""
        if z.ndim != 2 or z.shape[1] != self.latent:
            raise ValueError(f"z: expected shape (B, {self.latent}), got {tuple(z.shape)}")
        return torch.sigmoid(self.decoder(z)).reshape(z.shape[0], *self.input_shape)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(reconstruction, μ, log σ²)``: a reparameterised sample ``μ + σ·ε`` when training, ``μ`` in eval mode."""
        mu, log_var = self.encode(x)
        z = mu + torch.exp(0.5 * log_var) * torch.randn_like(mu) if self.training else mu
        return self.decode(z), mu, log_var


def elbo_loss(x: Tensor, reconstruction: Tensor, mu: Tensor, log_var: Tensor) -> Tensor:
    """Negative ELBO averaged over the batch: summed BCE reconstruction + ``KL(N(μ, σ²) ‖ N(0, I))``.

    ``KL = −½ Σ_d (1 + log σ_d² − μ_d² − σ_d²)`` per input.

    Example:
        >>> x = torch.full((1, 2), 0.5)
        >>> round(float(elbo_loss(x, x, torch.zeros(1, 3), torch.zeros(1, 3))), 4)  # 2·ln 2, KL 0
        1.3863
    """
    batch = x.shape[0]
    reconstruction_term = F.binary_cross_entropy(
        reconstruction.reshape(batch, -1), x.reshape(batch, -1), reduction="sum"
    )
    kl = -0.5 * torch.sum(1 + log_var - mu.square() - log_var.exp())
    return (reconstruction_term + kl) / batch


class VAEModule(L.LightningModule):
    """Train a :class:`VAE` on batches ``(images, labels)`` (labels unused) with the ELBO and Adam.

    Logged metrics:
        ``train_loss`` (negative ELBO per image, per step and epoch), ``val_loss`` (negative ELBO
        with the posterior mean as latent, per epoch) and ``val_recon_mse`` (mean squared error of
        the reconstruction per pixel, per epoch).

    Args:
        vae: the network; a default MNIST :class:`VAE` when ``None``.
        lr: Adam learning rate.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> module = VAEModule()
        >>> reconstruction, mu, log_var = module(torch.rand(4, 1, 28, 28))
        >>> reconstruction.shape, mu.shape
        (torch.Size([4, 1, 28, 28]), torch.Size([4, 32]))
    """

    def __init__(self, vae: VAE | None = None, lr: float = 1e-3) -> None:
        super().__init__()
        if vae is not None and not isinstance(vae, VAE):
            raise ValueError(f"vae: expected a dlguard VAE or None, got {type(vae).__name__}")
        if isinstance(lr, bool) or not isinstance(lr, int | float) or not lr > 0:
            raise ValueError(f"lr: expected a positive learning rate, got {lr!r}")
        self.save_hyperparameters(ignore=["vae"])
        self.vae = vae if vae is not None else VAE()

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.vae(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x = batch[0]
        loss = elbo_loss(x, *self.vae(x))
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x = batch[0]
        reconstruction, mu, log_var = self.vae(x)
        self.log("val_loss", elbo_loss(x, reconstruction, mu, log_var), prog_bar=True, sync_dist=True)
        self.log("val_recon_mse", F.mse_loss(reconstruction, x), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.vae.parameters(), lr=self.hparams.lr)
