"""A callback's own random numbers: seeded per process, kept in its checkpoint, off the global RNG.

Lightning checkpoints neither the global RNG nor a callback's draws. A callback that draws from the
global RNG on the training path therefore trains a resumed run on other numbers than an
uninterrupted one, and moves the numbers that dropout and the user's own augmentations draw.

- :class:`RankGenerator` is a CPU generator seeded ``seed + rank`` whose state goes into the
  callback's checkpoint. A checkpoint holds rank zero's state; after a restart the processes above
  rank zero reseed, so that they keep drawing apart.
- :meth:`RankGenerator.named` gives each named stream (a callback class's guide) a seed of its own,
  so two guides seeded alike do not draw the same numbers, and a benchmark's open-loop control can
  draw exactly the numbers a loop's guide draws.
- :func:`drawing_from` runs code that draws from the global RNG (kornia's parameter sampling, a
  property's noise) on numbers seeded from such a generator, on the CPU and on the batch's device,
  and puts both global generators back as they were. Devices whose module keeps
  ``default_generators`` (CUDA, XPU) are covered; on others (MPS) only the CPU's draws are.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

__all__ = ["RankGenerator", "drawing_from"]

_RESTART_STRIDE = 1_000_003  # a restarted rank's seed moves by this per draw made before the restart


class RankGenerator:
    """A seeded CPU generator of a callback's own, one stream per process, restorable from a checkpoint.

    Args:
        seed: the seed of rank zero; rank ``r`` starts from ``seed + r``.

    Example:
        >>> own = RankGenerator(seed=3)
        >>> own.setup(rank=0)
        >>> state = own.state()
        >>> first = torch.rand(2, generator=own.generator)
        >>> restored = RankGenerator(seed=3)
        >>> restored.load(state)
        >>> bool(torch.equal(torch.rand(2, generator=restored.generator), first))
        True
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._generator: torch.Generator | None = None
        self._restored = False

    @classmethod
    def named(cls, seed: int, name: str) -> RankGenerator:
        """The stream ``name`` of ``seed``: seeded ``seed + crc32(name)``, the same in every process and run.

        Example:
            >>> RankGenerator.named(0, "RobustnessCallback").seed == RankGenerator.named(0, "RobustnessCallback").seed
            True
            >>> RankGenerator.named(0, "RobustnessCallback").seed == RankGenerator.named(0, "DScoreCallback").seed
            False
        """
        return cls(seed + zlib.crc32(name.encode()))

    @property
    def generator(self) -> torch.Generator:
        """The generator (seeded ``seed`` when used before :meth:`setup`, as outside a ``Trainer``)."""
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed)
        return self._generator

    def setup(self, rank: int) -> None:
        """Seed ``seed + rank``, unless a checkpoint's state or an earlier fit's draws are already here."""
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed + rank)

    def start(self, rank: int, drawn: int) -> None:
        """At the start of training: a restored process above rank zero reseeds from the ``drawn`` count."""
        if self._restored and rank > 0:
            self._generator = torch.Generator().manual_seed(self.seed + rank + _RESTART_STRIDE * drawn)
        self._restored = False

    def state(self) -> Tensor | None:
        """The generator's state for a checkpoint (``None`` before the first draw or set-up)."""
        return None if self._generator is None else self._generator.get_state()

    def load(self, state: Tensor | None) -> None:
        """Continue from a checkpoint's state (``None``, as in older checkpoints: keep the seed)."""
        if state is not None:
            self._generator = torch.Generator()
            self._generator.set_state(state)
            self._restored = True


def _device_generator(device: torch.device) -> torch.Generator | None:
    """The default generator of an accelerator ``device`` (CUDA and anything shaped like it), or ``None``."""
    module = getattr(torch, device.type, None)
    generators = getattr(module, "default_generators", None)
    if device.type == "cpu" or not generators:
        return None
    index = device.index if device.index is not None else module.current_device()
    return generators[index]


@contextmanager
def drawing_from(generator: torch.Generator, device: torch.device | str = "cpu") -> Iterator[None]:
    """Run the block with the global RNG (CPU and ``device``) seeded from ``generator``; restore it after.

    One draw from ``generator`` per call seeds both, so the block's numbers follow the generator's state
    and nothing outside the block sees a difference, also when the block raises. Getting and setting a
    CUDA generator's state reads no value from the device.

    Example:
        >>> own = torch.Generator().manual_seed(0)
        >>> _ = torch.manual_seed(1)
        >>> with drawing_from(own):
        ...     inside = torch.rand(1)
        >>> after = torch.rand(1)
        >>> _ = torch.manual_seed(1)
        >>> bool(torch.equal(torch.rand(1), after)), bool(torch.equal(inside, after))
        (True, False)
    """
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    generators = [torch.default_generator]
    accelerator = _device_generator(torch.device(device))
    if accelerator is not None:
        generators.append(accelerator)
    states = [g.get_state() for g in generators]
    try:
        for g in generators:
            g.manual_seed(seed)
        yield
    finally:
        for g, state in zip(generators, states, strict=True):
            g.set_state(state)
