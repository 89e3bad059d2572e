from __future__ import annotations

import pytest
import torch
from torch import nn

from dlguard.metrics.latent_fid import LatentFeatures, LatentFrechetDistance, latent_frechet_distance

D = 3


def linear_encoder() -> nn.Module:
    """A fixed linear map of 1x4x4 inputs to 3 features."""
    encoder = nn.Sequential(nn.Flatten(), nn.Linear(16, D))
    with torch.no_grad():
        encoder[1].weight.copy_(torch.linspace(-1, 1, 16 * D).view(D, 16).sin())
        encoder[1].bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    return encoder


class TinyVAE(nn.Module):
    """VAE-like: ``encode`` gives ``(μ, log σ²)``, ``forward`` a reconstruction triple; ``latent`` is ``D``."""

    def __init__(self) -> None:
        super().__init__()
        self.latent = D
        self.mu = linear_encoder()
        self.log_var = nn.Sequential(nn.Flatten(), nn.Linear(16, D))
        self.dropout = nn.Dropout(0.5)  # must be off when features are taken

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mu(self.dropout(x)), self.log_var(x)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, log_var = self.encode(x)
        return x, mu, log_var


def reference_frechet(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖μa − μb‖² + Tr(Σa + Σb − 2(Σa Σb)^{1/2}) in float64, the square root through symmetric eigendecompositions.

    Tr((Σa Σb)^{1/2}) = Tr((Σa^{1/2} Σb Σa^{1/2})^{1/2}) (similar matrices), a symmetric PSD form.
    """
    a, b = a.double(), b.double()
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = torch.cov(a.T), torch.cov(b.T)
    values, vectors = torch.linalg.eigh(cov_a)
    root_a = vectors @ torch.diag(values.clamp_min(0).sqrt()) @ vectors.T
    middle = torch.linalg.eigvalsh(root_a @ cov_b @ root_a).clamp_min(0).sqrt().sum()
    return float((mu_a - mu_b).square().sum() + cov_a.trace() + cov_b.trace() - 2 * middle)


def images(n: int, seed: int, high: float = 0.7) -> torch.Tensor:
    return torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(seed)) * high


def test_matches_independent_reference() -> None:
    encoder = linear_encoder()
    real, fake = images(50, 0), images(40, 1) ** 2 + 0.1  # another distribution, another size
    with torch.no_grad():
        expected = reference_frechet(encoder(real), encoder(fake))
    assert expected > 0.05
    got = latent_frechet_distance(real, fake, encoder, num_features=D)
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_identical_sets_zero_and_shift_is_the_mean_term() -> None:
    encoder = linear_encoder()
    real = images(64, 2)
    assert 0.0 <= float(latent_frechet_distance(real, real, encoder, num_features=D)) < 1e-5
    # a constant shift c moves every feature by c·W·1 and leaves the covariance: d² = ‖c·W·1‖²
    shift = 0.3
    expected = float((shift * encoder[1].weight.detach().double().sum(dim=1)).square().sum())
    got = latent_frechet_distance(real, real + shift, encoder, num_features=D)
    assert float(got) == pytest.approx(expected, rel=1e-4)
    assert float(latent_frechet_distance(real, real + 0.1, encoder, num_features=D)) < float(got)


def test_vae_encoder_uses_mu_in_eval_mode_and_stays_untouched() -> None:
    vae = TinyVAE().train()
    real, fake = images(30, 3), images(30, 4, high=1.0)
    with torch.no_grad():
        expected = reference_frechet(vae.mu(real), vae.mu(fake))
    got = latent_frechet_distance(real, fake, vae)  # num_features from `latent`
    assert float(got) == pytest.approx(expected, rel=1e-5)  # dropout was off, μ was used
    assert vae.training and vae.dropout.training  # the caller's model keeps its mode ...
    assert all(p.requires_grad for p in vae.parameters())  # ... and its requires_grad flags
    metric = LatentFrechetDistance(vae)
    metric.train()  # a parent's train() does not switch dropout on in the copy
    assert not metric.inception.training and not metric.inception.encoder.dropout.training
    with torch.no_grad():
        vae.mu[1].weight.mul_(3.0)  # training the original later does not move the feature space
    metric.update(real, real=True)
    metric.update(fake, real=False)
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-5)


class Recorder(nn.Module):
    """Flatten + linear map that keeps the inputs it was given."""

    num_features = D

    def __init__(self) -> None:
        super().__init__()
        self.encoder = linear_encoder()
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.clone())
        return self.encoder(x)


def test_float_inputs_reach_the_encoder_unchanged_and_uint8_is_scaled() -> None:
    real = images(20, 5)
    metric = LatentFrechetDistance(Recorder())
    metric.update(real, real=True)
    seen = metric.inception.encoder.seen
    assert torch.equal(seen[0], real)  # not quantised to uint8 (torchmetrics 1.3 would with normalize=True)
    as_bytes = (real * 255).round().to(torch.uint8)
    metric.update(as_bytes, real=False)
    torch.testing.assert_close(seen[1], as_bytes.float() / 255)


def test_metric_batches_and_kept_real_features() -> None:
    encoder = linear_encoder()
    real, fake = images(25, 6), images(31, 7, high=0.9)
    expected = float(latent_frechet_distance(real, fake, encoder, num_features=D))
    metric = LatentFrechetDistance(encoder, num_features=D, reset_real_features=False)
    for part in (slice(0, 3), slice(3, 25)):
        metric.update(real[part], real=True)
    for part in (slice(0, 30), slice(30, 31)):
        metric.update(fake[part], real=False)
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-6)
    metric.reset()  # keeps the real statistics
    metric.update(fake, real=False)
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-6)


def test_bad_input_names_the_argument() -> None:
    encoder = linear_encoder()
    real = images(10, 8)
    with pytest.raises(ValueError, match=r"^real:.*at least 2"):
        latent_frechet_distance(real[:1], real, encoder, num_features=D)
    with pytest.raises(ValueError, match=r"^fake:.*at least 2"):
        latent_frechet_distance(real, real[:1], encoder, num_features=D)
    with pytest.raises(ValueError, match=r"^fake:.*shape"):
        latent_frechet_distance(real, torch.rand(10, 1, 5, 5), encoder, num_features=D)
    with pytest.raises(ValueError, match=r"^imgs: contains NaN"):
        latent_frechet_distance(real, torch.full((10, 1, 4, 4), float("nan")), encoder, num_features=D)
    with pytest.raises(ValueError, match=r"^num_features:"):
        LatentFrechetDistance(encoder)  # nothing says D
    with pytest.raises(ValueError, match=r"^encoder:.*\(10, 4\)"):
        latent_frechet_distance(real, real, encoder, num_features=4)
    with pytest.raises(ValueError, match=r"^encoder:"):
        LatentFeatures("not an encoder", num_features=D)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^imgs:"):
        LatentFeatures(encoder, num_features=D)(torch.ones(2, 1, 4, 4, dtype=torch.long))
    metric = LatentFrechetDistance(encoder, num_features=D)
    metric.update(real, real=True)
    metric.update(real[:1], real=False)
    with pytest.raises(ValueError, match=r"^fake:.*got 1"):
        metric.compute()


def test_plain_callable_encoder() -> None:
    weight = torch.randn(16, D, generator=torch.Generator().manual_seed(9))
    real, fake = images(30, 10), images(30, 11, high=0.5)
    expected = reference_frechet(real.flatten(1) @ weight, fake.flatten(1) @ weight)
    got = latent_frechet_distance(real, fake, lambda x: x.flatten(1) @ weight, num_features=D)
    assert float(got) == pytest.approx(expected, rel=1e-5)
