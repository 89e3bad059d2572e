"""Seeds of the synthetic scenes: one integer ``seed`` gives independent random streams, one per purpose.

Every random choice of :mod:`~dlguard.data.backgrounds`, :mod:`~dlguard.data.scenes`,
:mod:`~dlguard.data.detection_scenes` comes from a ``torch.Generator`` seeded with
``_seed_for(seed, salt)``, with one salt per purpose: 0 background kinds, 1 background pixels,
2 classification scenes, 3 the shuffle of validation backgrounds of ``SceneDataModule``, 4 detection scenes.
"""

from __future__ import annotations

from numbers import Integral


def _seed_for(seed: int, salt: int) -> int:
    """A generator seed derived from ``seed`` and a salt, so different purposes draw independent streams."""
    return (int(seed) * 0x9E3779B97F4A7C15 + salt * 0xBF58476D1CE4E5B9) % (2**63 - 1)


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    return int(seed)
