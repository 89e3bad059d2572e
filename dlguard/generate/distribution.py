"""HDA's global distribution (SPEC §4): a density over inputs, from a KDE in a latent space.

Each training input ``x_i`` is embedded as a Gaussian ``N(μ_i, diag σ_i²)`` and the density of an
input ``x`` is the mixture ``p_g(z) = (1/n)·Σ_i Π_d N(z_d; μ_id, σ_id)`` at its embedding ``z``
(:func:`~dlguard.metrics.functional.kde_log_density`, in log space):

- :class:`VAEDistribution`: ``z`` is a VAE encoder's posterior mean and the bandwidths are the
  posterior σ of each training input (the paper's adaptive KDE).
- :class:`PCADistribution`: ``z`` is the input's principal-component scores; the bandwidth of each
  component is its standard deviation times Scott's factor ``n^(−1/(D+4))`` (when no encoder is trained).

A query that *is* a fitted training input (same content key, :func:`dlguard._random.content_keys`)
is scored against the others, leave-one-out: HDA's reference code scores such points against a KDE
that contains them, which inflates the density of training inputs.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Self

import numpy as np
import torch
from torch import Tensor

from dlguard._random import content_keys
from dlguard._validation import check_tensor, check_values, positive_int
from dlguard.metrics.functional.distribution import kde_log_density, kde_sample
from dlguard.probes.evaluation import evaluation
from dlguard.zoo.vae import VAE

__all__ = ["GlobalDistribution", "PCADistribution", "VAEDistribution"]


class GlobalDistribution(ABC):
    """A KDE over the embeddings of fitted (training) inputs: one interface, several embeddings.

    Args:
        max_batch: inputs embedded at once by :meth:`fit` and :meth:`embed`.
    """

    def __init__(self, max_batch: int = 1024) -> None:
        self.max_batch = positive_int("max_batch", max_batch)
        self._mu: Tensor | None = None
        self._sigma: Tensor | None = None
        self._keys: Tensor | None = None  # content keys of the fitted inputs, sorted
        self._order: Tensor | None = None  # fitted point index of each sorted key

    # ---- what an embedding supplies ------------------------------------------------------------
    @abstractmethod
    def _check_shape(self, inputs: Tensor) -> None:
        """Raise ``ValueError`` when ``inputs`` ``(n, ...)`` do not have the embedding's input shape."""

    @abstractmethod
    def _fit_embedding(self, inputs: Tensor) -> None:
        """Fit the embedding itself on the (validated) training inputs (nothing for a trained encoder)."""

    @abstractmethod
    def _embed_batch(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        """``(μ, σ)`` of a validated batch, under ``no_grad``."""

    @abstractmethod
    def _decode(self, z: Tensor) -> Tensor:
        """Inputs in ``[0, 1]`` from latent points, under ``no_grad``."""

    # ---- shared --------------------------------------------------------------------------------
    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` (or :meth:`load_state_dict`) has run."""
        return self._mu is not None

    def _require_fitted(self) -> None:
        if self._mu is None:
            raise RuntimeError(f"{type(self).__name__}: not fitted; call fit(training inputs) first")

    @property
    def mu(self) -> Tensor:
        """``(n, D)`` embeddings (posterior means) of the fitted inputs."""
        self._require_fitted()
        return self._mu

    @property
    def sigma(self) -> Tensor:
        """``(n, D)`` bandwidths of the fitted inputs' kernels, all ``> 0``."""
        self._require_fitted()
        return self._sigma

    def _check_inputs(self, inputs: object, name: str = "inputs", values: bool = True) -> Tensor:
        check_tensor(name, inputs, floating=True)
        if inputs.shape[0] == 0:
            raise ValueError(f"{name}: expected at least one input, got shape {tuple(inputs.shape)}")
        self._check_shape(inputs)
        if values:
            check_values(name, inputs, (0.0, 1.0), hint="the global distribution works in pixel space (SPEC §0)")
        return inputs

    def _embed_checked(self, inputs: Tensor, max_batch: int) -> tuple[Tensor, Tensor]:
        # inference_mode(False): tensors made inside a caller's inference_mode (trainer.validate) are
        # ordinary tensors that can be stored, checkpointed and used later; no_grad: no graph either way
        with torch.inference_mode(False), torch.no_grad():
            parts = [self._embed_batch(inputs[i : i + max_batch]) for i in range(0, inputs.shape[0], max_batch)]
            return torch.cat([mu for mu, _ in parts]), torch.cat([sigma for _, sigma in parts])

    def fit(self, inputs: Tensor, max_batch: int | None = None) -> Self:
        """Embed the training inputs ``(n, ...)`` in ``[0, 1]`` as the KDE's points; returns ``self``.

        Refitting replaces the points. The points stay on the device the embedding runs on.
        """
        batch = self.max_batch if max_batch is None else positive_int("max_batch", max_batch)
        self._check_inputs(inputs)
        with torch.inference_mode(False):  # fitted state made under trainer.validate is ordinary tensors too
            self._fit_embedding(inputs)
            mu, sigma = self._embed_checked(inputs, batch)
            self._keys, self._order = torch.sort(content_keys(inputs).to(mu.device))
        self._mu, self._sigma = mu, sigma
        return self

    def embed(self, inputs: Tensor, max_batch: int | None = None) -> tuple[Tensor, Tensor]:
        """``(μ, σ)``, each ``(B, D)``, of inputs ``(B, ...)`` in ``[0, 1]``, in batches of ``max_batch``."""
        batch = self.max_batch if max_batch is None else positive_int("max_batch", max_batch)
        self._require_fitted()
        return self._embed_checked(self._check_inputs(inputs), batch)

    def fitted_index(self, inputs: Tensor, keys: Tensor | None = None, validate_args: bool = True) -> Tensor:
        """``(B,)`` index of the fitted point each input is (same content key), ``-1`` for none.

        ``keys`` are the inputs' :func:`~dlguard._random.content_keys` with the default seed 0, when the
        caller has them; ``validate_args=False`` skips the value check (range, NaN).
        """
        self._require_fitted()
        self._check_inputs(inputs, values=validate_args)
        keys = (content_keys(inputs) if keys is None else keys).to(self._keys.device)
        position = torch.searchsorted(self._keys, keys).clamp_max(self._keys.numel() - 1)
        found = self._keys[position] == keys
        return torch.where(found, self._order[position], torch.full_like(position, -1))

    def log_density(
        self, inputs: Tensor, max_elements: int = 2**24, *, keys: Tensor | None = None, validate_args: bool = True
    ) -> Tensor:
        """``log p_g(z)`` ``(B,)`` of each input's embedding; fitted inputs are scored leave-one-out.

        Computed in log space on the device of the fitted points, in blocks of at most
        ``max_elements`` elements. ``keys`` and ``validate_args`` as in :meth:`fitted_index`.
        """
        self._require_fitted()
        positive_int("max_elements", max_elements)
        exclude = self.fitted_index(inputs, keys, validate_args)
        if self._mu.shape[0] == 1 and bool((exclude >= 0).any()):
            raise ValueError("inputs: a query is the only fitted point; fit at least 2 inputs to score fitted points")
        z, _ = self._embed_checked(inputs, self.max_batch)
        return kde_log_density(
            z, self._mu, self._sigma, max_elements=max_elements, exclude=exclude, validate_args=validate_args
        )

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        """``(num_samples, D)`` latent points drawn from the KDE (``generator`` on the points' device)."""
        self._require_fitted()
        return kde_sample(self._mu, self._sigma, num_samples, generator)

    def decode(self, z: Tensor) -> Tensor:
        """Inputs in ``[0, 1]`` from latent points ``(B, D)``."""
        self._require_fitted()
        check_tensor("z", z, floating=True)
        if z.ndim != 2 or z.shape[1] != self._mu.shape[1]:
            raise ValueError(f"z: expected shape (B, {self._mu.shape[1]}), got {tuple(z.shape)}")
        with torch.inference_mode(False), torch.no_grad():
            return self._decode(z)

    def sample_images(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        """``num_samples`` inputs decoded from KDE draws: what the global distribution looks like."""
        return self.decode(self.sample(num_samples, generator))

    def to(self, device: str | torch.device) -> Self:
        """Move the fitted points (and the embedding) to ``device``; returns ``self``."""
        for name in ("_mu", "_sigma", "_keys", "_order"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.to(device))
        return self

    def state_dict(self) -> dict[str, Any]:
        """The fitted points, their bandwidths and content keys (empty before :meth:`fit`)."""
        if self._mu is None:
            return {}
        return {"mu": self._mu, "sigma": self._sigma, "keys": self._keys, "order": self._order}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (an empty state leaves the distribution unfitted)."""
        if not state:
            self._mu = self._sigma = self._keys = self._order = None
            return
        missing = {"mu", "sigma", "keys", "order"} - state.keys()
        if missing:
            raise ValueError(f"state: missing {sorted(missing)}; expected what state_dict() returned")
        mu, sigma = state["mu"], state["sigma"]
        if mu.ndim != 2 or sigma.shape != mu.shape or state["keys"].shape != (mu.shape[0],):
            raise ValueError(f"state: inconsistent shapes mu {tuple(mu.shape)}, sigma {tuple(sigma.shape)}")
        self._mu, self._sigma = mu, sigma
        self._keys, self._order = state["keys"].to(mu.device), state["order"].to(mu.device)


class VAEDistribution(GlobalDistribution):
    """The paper's global distribution: a VAE encoder's posteriors, bandwidth = posterior σ.

    The encoder runs in eval mode without parameter gradients and is left exactly as found.

    Args:
        vae: a trained :class:`~dlguard.zoo.vae.VAE` (e.g. ``pretrained("vae_mnist")``).
        max_batch: inputs encoded at once.

    Example:
        >>> from dlguard.zoo.pretrained import pretrained
        >>> from dlguard.data import MNISTDataModule
        >>> dm = MNISTDataModule()
        >>> dm.setup()
        >>> train = torch.stack([dm.train_set[i][0] for i in range(500)])
        >>> digits = torch.stack([dm.val_set[i][0] for i in range(50)])
        >>> g = VAEDistribution(pretrained("vae_mnist")).fit(train)
        >>> noise = torch.rand(50, 1, 28, 28, generator=torch.Generator().manual_seed(0))
        >>> bool(g.log_density(digits).mean() > g.log_density(noise).mean() + 100)
        True
        >>> g.sample_images(4, torch.Generator().manual_seed(0)).shape
        torch.Size([4, 1, 28, 28])
    """

    def __init__(self, vae: VAE, max_batch: int = 1024) -> None:
        super().__init__(max_batch)
        if not isinstance(vae, VAE):
            raise ValueError(f"vae: expected a dlguard.zoo.vae.VAE, got {type(vae).__name__}")
        self.vae = vae

    def _check_shape(self, inputs: Tensor) -> None:
        if tuple(inputs.shape[1:]) != self.vae.input_shape:
            shape = ", ".join(map(str, self.vae.input_shape))
            raise ValueError(f"inputs: expected shape (n, {shape}) for this VAE, got {tuple(inputs.shape)}")

    def _fit_embedding(self, inputs: Tensor) -> None:
        return None

    def _embed_batch(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        with evaluation(self.vae):
            parameter = next(self.vae.parameters())
            mu, sigma = self.vae.posterior(inputs.to(device=parameter.device, dtype=parameter.dtype))
        return mu, sigma.clamp_min(torch.finfo(sigma.dtype).tiny)

    def _decode(self, z: Tensor) -> Tensor:
        with evaluation(self.vae):
            parameter = next(self.vae.parameters())
            return self.vae.decode(z.to(device=parameter.device, dtype=parameter.dtype))

    def to(self, device: str | torch.device) -> Self:
        """Move the fitted points and the VAE to ``device``; returns ``self``."""
        self.vae.to(device)
        return super().to(device)


def _pca_solver(n: int, features: int, components: int) -> str:
    """A PCA solver exact (to ARPACK's tolerance) and deterministic, chosen by cost.

    ARPACK's Lanczos iteration (from scikit-learn's seeded start vector) finds the leading ``components``
    alone: 2,000 of dlguard's RGB 32x32 scenes (3,072 features) in 1.7 s on one CPU thread, where the
    covariance's eigendecomposition took 5.6 s and grows with the cube of the features; the same scenes at
    64x64 in 6.2 s (``benchmarks/pca_distribution.py``). Its components match the eigendecomposition's to
    about ``1e-8`` (``1 − |cos|``). It
    needs ``components < min(n, features)``; at that bound, and for inputs ARPACK cannot start on (no
    variance at all), :func:`_exact_solver`.
    """
    return "arpack" if components < min(n, features) else _exact_solver()


def _exact_solver() -> str:
    """The covariance's eigendecomposition when scikit-learn has it (1.5+), else the full SVD."""
    import sklearn

    major, minor = (int(part) for part in sklearn.__version__.split(".")[:2])
    return "covariance_eigh" if (major, minor) >= (1, 5) else "full"


class PCADistribution(GlobalDistribution):
    """A global distribution without a trained encoder: PCA scores, Scott's-rule bandwidth per component.

    scikit-learn's ``PCA`` (exact and deterministic) is fitted once on the flattened training
    inputs; embedding then runs on the device as ``(x − mean)·componentsᵀ`` and decoding as the
    inverse transform clipped to ``[0, 1]``. Every point's kernel has bandwidth
    ``σ_d = std_d · n^(−1/(D+4))`` for component ``d``.

    Args:
        n_components: ``D``, at most ``min(n, features)`` of the fitted inputs.
        max_batch: inputs embedded at once.

    Example:
        >>> blobs = torch.cat([torch.full((20, 6), 0.2), torch.full((20, 6), 0.8)])
        >>> blobs = blobs + 0.05 * torch.rand(40, 6, generator=torch.Generator().manual_seed(0))
        >>> g = PCADistribution(n_components=2).fit(blobs)
        >>> g.mu.shape, g.sigma.shape
        (torch.Size([40, 2]), torch.Size([40, 2]))
        >>> bool(g.log_density(torch.full((1, 6), 0.22)) > g.log_density(torch.full((1, 6), 0.5)))
        True
    """

    def __init__(self, n_components: int = 32, max_batch: int = 1024) -> None:
        super().__init__(max_batch)
        self.n_components = positive_int("n_components", n_components)
        self._feature_shape: tuple[int, ...] | None = None
        self._mean: Tensor | None = None
        self._components: Tensor | None = None
        self._bandwidth: Tensor | None = None

    def _check_shape(self, inputs: Tensor) -> None:
        if inputs.ndim < 2:
            raise ValueError(f"inputs: expected a batch of inputs (n, ...), got shape {tuple(inputs.shape)}")
        if self._feature_shape is not None and tuple(inputs.shape[1:]) != self._feature_shape:
            shape = ", ".join(map(str, self._feature_shape))
            raise ValueError(f"inputs: expected shape (n, {shape}) as fitted, got {tuple(inputs.shape)}")

    def fit(self, inputs: Tensor, max_batch: int | None = None) -> Self:
        previous, self._feature_shape = self._feature_shape, None  # a refit may change the input shape
        try:
            return super().fit(inputs, max_batch)
        except Exception:
            self._feature_shape = previous  # a refused refit leaves the old fit whole, its shape check on
            raise

    def _fit_embedding(self, inputs: Tensor) -> None:
        from sklearn.decomposition import PCA

        n, features = inputs.shape[0], math.prod(inputs.shape[1:])
        if n < 2:
            raise ValueError(f"inputs: expected at least 2 inputs to fit a PCA, got {n}")
        if self.n_components > min(n, features):
            raise ValueError(
                f"n_components: {self.n_components} is larger than possible, min(inputs, features) = "
                f"min({n}, {features}) = {min(n, features)}"
            )
        flat = inputs.detach().reshape(n, -1).cpu().to(torch.float64).numpy()
        from scipy.sparse.linalg import ArpackError

        try:
            pca = PCA(self.n_components, svd_solver=_pca_solver(n, features, self.n_components), random_state=0)
            pca.fit(flat)
        except ArpackError:  # no variance to start the iteration on (constant inputs): the exact solver copes
            pca = PCA(self.n_components, svd_solver=_exact_solver()).fit(flat)
        dtype = inputs.dtype
        self._feature_shape = tuple(inputs.shape[1:])
        array = np.ascontiguousarray  # ARPACK's components and variances come in reversed views
        self._mean = torch.from_numpy(array(pca.mean_)).to(device=inputs.device, dtype=dtype)
        self._components = torch.from_numpy(array(pca.components_)).to(device=inputs.device, dtype=dtype)
        scott = n ** (-1.0 / (self.n_components + 4))
        std = torch.from_numpy(array(np.sqrt(pca.explained_variance_))).to(device=inputs.device, dtype=dtype)
        self._bandwidth = (std * scott).clamp_min(torch.finfo(dtype).eps)

    def _embed_batch(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        flat = inputs.reshape(inputs.shape[0], -1).to(device=self._mean.device, dtype=self._mean.dtype)
        z = (flat - self._mean) @ self._components.T
        return z, self._bandwidth.expand_as(z).clone()

    def _decode(self, z: Tensor) -> Tensor:
        z = z.to(device=self._mean.device, dtype=self._mean.dtype)
        return (z @ self._components + self._mean).clamp(0.0, 1.0).reshape(z.shape[0], *self._feature_shape)

    def to(self, device: str | torch.device) -> Self:
        for name in ("_mean", "_components", "_bandwidth"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        return super().to(device)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if state:
            state |= {"mean": self._mean, "components": self._components, "feature_shape": self._feature_shape}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if not state:
            self._mean = self._components = self._feature_shape = None
            return
        if not {"mean", "components", "feature_shape"} <= state.keys():
            raise ValueError(
                "state: missing the PCA (mean, components, feature_shape); expected what state_dict() returned"
            )
        device = self._mu.device
        self._mean, self._components = state["mean"].to(device), state["components"].to(device)
        self._feature_shape = tuple(state["feature_shape"])
        self._bandwidth = self._sigma[0]
        self.n_components = self._mu.shape[1]
