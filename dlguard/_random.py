"""Randomness that depends on *what* an input is, not on where or when it is processed.

Under DDP each rank sees its own shard, in its own order. Draws made from a generator would then
depend on the number of processes; draws keyed by the input's content do not:

- :func:`content_keys` hashes each input's bits (with a seed) to an integer key in
  ``[0, 2**62)``: a uniform pseudo-random number fixed by the input itself. The inputs with the
  smallest keys are a uniform random draw, identical for 1 or N processes and any batch order.
- :func:`keyed_uniform` and :func:`keyed_normal` are counter-based generators: element ``j`` of the
  draw for key ``k`` and salt ``s`` is a fixed function of ``(k, j, s)`` (a 32-bit integer hash),
  so an input's noise is the same whatever batch or process it is in.

All arithmetic is on ``int64`` tensors kept below ``2**63``, exact on every device.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_POSITIONS: dict[tuple[int, int, str], tuple[Tensor, Tensor]] = {}


def _mul32(x: Tensor, constant: int) -> Tensor:
    """``(x · constant) mod 2**32`` for ``x`` in ``[0, 2**32)``, without overflowing ``int64``."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    """A bijective 32-bit integer hash with good avalanche (Wellons' ``lowbias32``), on ``[0, 2**32)``."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _positions(size: int, seed: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Two independent 32-bit hashes of every element position, fixed by ``seed``."""
    cache_key = (size, seed, str(device))
    if cache_key not in _POSITIONS:
        if len(_POSITIONS) > 16:  # a few input sizes and devices per run; never grow without bound
            _POSITIONS.clear()
        index = torch.arange(size, dtype=torch.int64, device=device)
        salt = _mix32(torch.tensor(seed & _MASK32, device=device))
        first = _mix32((_mul32(index, _GOLDEN) ^ salt) & _MASK32)
        second = _mix32(first ^ 0x5BD1E995)
        _POSITIONS[cache_key] = (first, second)
    return _POSITIONS[cache_key]


def _fold(total: Tensor) -> Tensor:
    """A 64-bit sum folded to 32 bits."""
    return (total ^ (total >> 32)) & _MASK32


def content_keys(inputs: Tensor, seed: int = 0) -> Tensor:
    """An integer key in ``[0, 2**62)`` per input ``(B, ...)``, fixed by its content and ``seed``.

    Every element is hashed with its position (two independent 32-bit hashes, summed over the
    input), so inputs that differ anywhere get different keys but with probability about
    ``2**-62``. Float inputs are keyed by their value in float32, so a float64 copy of a batch
    (Lightning's ``precision="64-true"``) keys like the float32 original.

    Example:
        >>> import torch
        >>> x = torch.rand(4, 3, generator=torch.Generator().manual_seed(0))
        >>> keys = content_keys(x)
        >>> torch.equal(content_keys(x.flip(0)), keys.flip(0)), torch.equal(content_keys(x.double()), keys)
        (True, True)
    """
    if inputs.ndim < 1:
        raise ValueError(f"inputs: expected a batch (B, ...), got shape {tuple(inputs.shape)}")
    if len(inputs) == 0:
        return torch.zeros(0, dtype=torch.int64, device=inputs.device)
    flat = inputs.detach().reshape(len(inputs), -1)
    if flat.is_floating_point():
        bits = flat.float().contiguous().view(torch.int32).long() & _MASK32
    else:
        bits = flat.long() & _MASK32
    first, second = _positions(flat.shape[1], seed, flat.device)
    high = _mix32(_fold(_mix32(bits ^ first).sum(dim=1)))
    low = _mix32(_fold(_mix32(bits ^ second).sum(dim=1)) ^ high)
    return ((high >> 1) << 31) | (low >> 1)


def _row_hash(keys: Tensor) -> tuple[Tensor, Tensor]:
    """Two 32-bit hashes of 62-bit keys, made differently from the element counter's."""
    keys = keys.long()
    first = _mix32(((keys & _MASK32) ^ 0x68E31DA4) & _MASK32)
    second = _mix32(((keys >> 32) & _MASK32) ^ _mix32(first ^ 0xB5297A4D))
    return first, second


def keyed_uniform(keys: Tensor, shape: tuple[int, ...], salt: int = 0, dtype: torch.dtype = torch.float32) -> Tensor:
    """Uniform draws in ``(0, 1]``, ``(B, *shape)``, element ``j`` of row ``b`` fixed by ``(keys[b], j, salt)``.

    Example:
        >>> import torch
        >>> u = keyed_uniform(torch.tensor([7, 8]), (3,))
        >>> torch.equal(keyed_uniform(torch.tensor([8]), (3,))[0], u[1]), bool((u > 0).all() and (u <= 1).all())
        (True, True)
    """
    size = math.prod(shape)
    counter = torch.arange(size, device=keys.device, dtype=torch.int64)
    salt_hash = int(_mix32(torch.tensor((salt * _GOLDEN + 0x1B56C4E9) & _MASK32)))  # on the host: no copy to the device
    stream = _mix32(_mul32(counter, _GOLDEN) ^ salt_hash)
    first, second = _row_hash(keys.reshape(-1))
    draws = _mix32((_mix32(stream.unsqueeze(0) ^ second.unsqueeze(1)) + first.unsqueeze(1)) & _MASK32)
    return ((draws + 1).to(torch.float64) / 2.0**32).to(dtype).reshape(len(keys), *shape)


def keyed_normal(keys: Tensor, shape: tuple[int, ...], salt: int = 0, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal draws ``(B, *shape)`` keyed like :func:`keyed_uniform` (Box-Muller).

    Example:
        >>> import torch
        >>> z = keyed_normal(torch.arange(200), (50,))
        >>> abs(float(z.mean())) < 0.05, round(float(z.std()), 1)
        (True, 1.0)
    """
    first = keyed_uniform(keys, shape, 2 * salt, torch.float64)
    second = keyed_uniform(keys, shape, 2 * salt + 1, torch.float64)
    return (torch.sqrt(-2.0 * torch.log(first)) * torch.cos(2.0 * math.pi * second)).to(dtype)
