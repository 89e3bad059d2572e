"""Fixed probe sets drawn from batches as they stream past: one policy for every callback (SPEC §0, §5).

Each input gets a key fixed by its content and a seed (:func:`dlguard._random.content_keys`); a
draw keeps the inputs with the smallest keys -- overall, or per class, optionally among correctly
predicted inputs only. Keys do not depend on batch order, batch size or the number of processes,
so a draw made while the validation loop runs (one batch at a time, each process on its shard)
is the draw one process would make over the whole set, and the keys alone (a few bytes per input)
are enough to find the same inputs again after a restart.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from dlguard import _distributed
from dlguard._random import content_keys
from dlguard._validation import (
    check_labels,
    check_tensor,
    check_values,
    optional_positive_int,
    value_range,
)

__all__ = ["ProbeSet", "ProbeSetDraw", "ProbeSetPolicy"]


@dataclass(frozen=True)
class ProbeSetPolicy:
    """What a probe set is: how many inputs, how they are chosen, which values they may hold.

    Args:
        probe_size: a uniform random draw of this many inputs (over all processes).
        per_class: a balanced draw of this many inputs per class (SPEC §5); exclusive with ``probe_size``.
        correct_only: keep only inputs the model classifies correctly (SPEC §5 sampling).
        seed: the draw's seed.
        value_range: every input must lie in it (pixel space, SPEC §0); ``None`` for any values.
        value_range_hint: appended to the error for inputs outside ``value_range``: where it comes from.
        labels: the targets are class labels ``(B,)``; ``False`` for any other targets, e.g. steering
            angles (regression), which only a ``probe_size`` draw can use (``class_counts`` is then empty).
    """

    probe_size: int | None = None
    per_class: int | None = None
    correct_only: bool = False
    seed: int = 0
    value_range: tuple[float, float] | None = (0.0, 1.0)
    value_range_hint: str = ""
    labels: bool = True

    def __post_init__(self) -> None:
        if (self.probe_size is None) == (self.per_class is None):
            raise ValueError("probe_size and per_class: expected exactly one of them")
        if not self.labels and (self.per_class is not None or self.correct_only):
            raise ValueError(
                "labels: a draw over targets that are not class labels needs probe_size=, not per_class or correct_only"
            )
        optional_positive_int("probe_size", self.probe_size)
        optional_positive_int("per_class", self.per_class)
        value_range("value_range", self.value_range)


@dataclass
class ProbeSet:
    """A drawn probe set: this process's share, ordered by key, and what the draw found.

    Attributes:
        inputs: ``(M_rank, ...)`` this process's probe inputs.
        target: ``(M_rank, ...)`` their labels (or regression targets).
        keys: ``(M_rank,)`` their content keys.
        all_keys: ``(M,)`` every process's keys, sorted: the whole probe set, as checkpoints keep it.
        seed: the seed the keys were made with.
        class_counts: ``{class: inputs}`` of the whole probe set.
        found_per_class: ``{class: candidates}`` that qualified (correctly predicted ones for a
            ``correct_only`` draw), over all processes; ``None`` for a restored set.
        seen: distinct inputs the batches offered, over all processes (``None`` for a restored set).
        offered_per_class: ``{class: distinct inputs offered}`` over all processes (labels only; ``None``
            for a restored set or targets that are not labels).
        accuracy: share of those the model classified correctly, when the draw was told (``correct``
            given with every batch), else ``None``.
    """

    inputs: Tensor
    target: Tensor
    keys: Tensor
    all_keys: Tensor
    seed: int
    class_counts: dict[int, int]
    found_per_class: dict[int, int] | None = field(default=None)
    seen: int | None = field(default=None)
    offered_per_class: dict[int, int] | None = field(default=None)
    accuracy: float | None = field(default=None)

    def __len__(self) -> int:
        return len(self.target)

    @property
    def size(self) -> int:
        """Inputs over all processes."""
        return len(self.all_keys)

    def state_dict(self) -> dict[str, Any]:
        """Keys and seed: enough to find the same inputs again (a few bytes per input)."""
        return {"keys": self.all_keys.cpu(), "seed": self.seed}


def _first_of_each_key(keys: Tensor) -> Tensor:
    """Indices of the first occurrence of every distinct key, in key order."""
    order = torch.sort(keys, stable=True).indices
    sorted_keys = keys[order]
    first = torch.ones_like(sorted_keys, dtype=torch.bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return order[first]


def _select(keys: Tensor, target: Tensor, policy: ProbeSetPolicy) -> Tensor:
    """Indices of the draw among distinct ``keys``: the smallest keys overall or per class, in key order."""
    if policy.probe_size is not None:
        return keys.argsort()[: policy.probe_size]
    by_key = torch.sort(keys, stable=True).indices
    order = by_key[torch.sort(target[by_key].long(), stable=True).indices]  # by class, then by key
    sorted_target = target[order].long()
    counts = torch.bincount(sorted_target)
    starts = counts.cumsum(0) - counts
    position = torch.arange(len(order), device=keys.device) - starts[sorted_target]
    kept = order[position < policy.per_class]
    return kept[keys[kept].argsort()]


def _counts(target: Tensor) -> dict[int, int]:
    counts = torch.bincount(target.long()) if target.numel() else torch.zeros(0, dtype=torch.long)
    return {cls: int(n) for cls, n in enumerate(counts.tolist()) if n}


class ProbeSetDraw:
    """Draws a :class:`ProbeSet` from batches as they come, keeping only a bounded pool.

    Call :meth:`add` with every batch (on every process), then :meth:`finish` once (a collective
    under DDP). With ``restore`` (the keys of a probe set kept in a checkpoint) the draw keeps
    exactly the inputs with those keys instead.

    Args:
        policy: the draw.
        restore: keys of an earlier draw to find again.
        context: where the batches come from, for error messages (e.g. ``"validation loader 0"``).
        empty_ok: when batches came but none qualified (a ``correct_only`` draw of a model that gets
            nothing right), return the empty set instead of raising: for a caller that waits until the
            model can be measured (the callbacks).

    Example:
        >>> import torch
        >>> images = torch.rand(40, 1, 4, 4, generator=torch.Generator().manual_seed(0))
        >>> labels = torch.arange(40) % 4
        >>> draw = ProbeSetDraw(ProbeSetPolicy(per_class=3, seed=0))
        >>> for part, part_labels in zip(images.split(16), labels.split(16)):
        ...     draw.add(part, part_labels)
        >>> probe = draw.finish()
        >>> probe.size, probe.class_counts
        (12, {0: 3, 1: 3, 2: 3, 3: 3})
        >>> again = ProbeSetDraw(ProbeSetPolicy(per_class=3, seed=0), restore=probe.all_keys)
        >>> again.add(images.flip(0), labels.flip(0))  # another order, one batch: the same inputs
        >>> torch.equal(again.finish().inputs, probe.inputs)
        True
    """

    def __init__(
        self,
        policy: ProbeSetPolicy,
        restore: Tensor | None = None,
        context: str = "the batches",
        empty_ok: bool = False,
    ) -> None:
        self.policy, self.context, self.empty_ok = policy, context, empty_ok
        self.restore = None if restore is None else restore.long()
        self._inputs: Tensor | None = None
        self._target: Tensor | None = None
        self._keys: Tensor | None = None
        self._seen: list[Tensor] = []  # (4, B): key, label, qualified, correct (-1: not told) of every input

    def add(self, inputs: Tensor, target: Tensor, correct: Tensor | None = None) -> None:
        """Offer a batch: inputs ``(B, ...)``, labels ``(B,)`` and a ``(B,)`` mask of correct predictions.

        The mask is required by a ``correct_only`` draw; given to any draw, it counts towards
        :attr:`ProbeSet.accuracy`.
        """
        check_tensor("inputs", inputs)
        if self.policy.labels:
            check_labels("target", target, batch=len(inputs))
        else:
            check_tensor("target", target)
            check_values("target", target, None)
            if len(target) != len(inputs):
                raise ValueError(f"target: expected {len(inputs)} targets for {len(inputs)} inputs, got {len(target)}")
        if self.policy.correct_only and self.restore is None and correct is None:
            raise ValueError("correct: a correct_only draw needs a (B,) mask of correctly predicted inputs")
        if correct is not None and correct.shape != (len(inputs),):
            raise ValueError(
                f"correct: expected a ({len(inputs)},) mask of correct predictions, got {tuple(correct.shape)}"
            )
        if len(inputs) == 0:
            return
        check_values(f"inputs ({self.context})", inputs, self.policy.value_range, self.policy.value_range_hint)
        keys = content_keys(inputs, self.policy.seed)
        if self.restore is not None:
            mask = torch.isin(keys, self.restore.to(keys.device))
        elif self.policy.correct_only:
            assert correct is not None
            mask = correct.to(device=keys.device, dtype=torch.bool)
        else:
            mask = torch.ones_like(keys, dtype=torch.bool)
        told = torch.full_like(keys, -1) if correct is None else correct.to(device=keys.device, dtype=torch.long)
        self._seen.append(torch.stack([keys, self._classes(target).to(keys.device), mask.long(), told]))
        pool = (inputs.detach()[mask], target.detach()[mask], keys[mask])
        if self._keys is not None:
            pool = tuple(torch.cat([old, new.to(old.device)]) for old, new in zip(self._pool(), pool, strict=True))
        keep = _first_of_each_key(pool[2])
        if self.restore is None:
            keep = keep[_select(pool[2][keep], pool[1][keep], self.policy)]
        self._inputs, self._target, self._keys = (part[keep] for part in pool)

    def _classes(self, target: Tensor) -> Tensor:
        """``(B,)`` class of each input: its label, or 0 for targets that are not labels."""
        return target.long() if self.policy.labels else torch.zeros(len(target), dtype=torch.long, device=target.device)

    def _pool(self) -> tuple[Tensor, Tensor, Tensor]:
        assert self._inputs is not None and self._target is not None and self._keys is not None
        return self._inputs, self._target, self._keys

    def _sample_shape(self) -> tuple[int, ...]:
        """The shape of one input, agreed by every process (one that saw no batch learns it from the others)."""
        mine = torch.tensor([] if self._inputs is None else list(self._inputs.shape[1:]), dtype=torch.long)
        for shape in _distributed.gather(mine):
            if shape.numel():
                return tuple(shape.tolist())
        return ()

    def finish(self, limit: Callable[[int], int | None] | None = None, fewest_per_class: int = 1) -> ProbeSet:
        """The probe set (every process calls this: keys are gathered to choose the global draw).

        Args:
            limit: ``limit(seen)`` -> the most inputs the set may hold, given the distinct inputs the
                batches offered (``None``: the policy's size). A ``per_class`` draw keeps
                ``limit // classes offered`` per class. The smaller set is the larger one's smallest
                keys: what a draw of that size would have chosen. Not applied to a restore.
            fewest_per_class: a ``per_class`` draw cut by ``limit`` keeps at least this many per class.
        """
        shape = self._sample_shape()
        if self._keys is None:
            empty = torch.zeros(0, dtype=torch.long)
            target = empty if self.policy.labels else torch.zeros(0)
            self._inputs, self._target, self._keys = torch.zeros((0, *shape)), target, empty
        inputs, target, keys = self._pool()
        parts = _distributed.gather(torch.stack([keys, self._classes(target).to(keys.device)]))
        owner = torch.cat([torch.full((part.shape[1],), r, device=keys.device) for r, part in enumerate(parts)])
        every = torch.cat([part.to(keys.device) for part in parts], dim=1)
        unique = _first_of_each_key(every[0])  # padded DDP shards repeat inputs: keep one, lowest rank first
        every, owner = every[:, unique], owner[unique]
        chosen = torch.arange(every.shape[1], device=keys.device)
        seen = self._seen_everywhere()
        if self.restore is None:
            chosen = _select(every[0], every[1], self._limited(limit, seen, fewest_per_class))
        mine = owner[chosen] == _distributed.rank()
        local = torch.isin(keys, every[0, chosen[mine]])
        order = keys[local].argsort()
        probe = ProbeSet(
            inputs=inputs[local][order],
            target=target[local][order],
            keys=keys[local][order],
            all_keys=every[0, chosen].sort().values,
            seed=self.policy.seed,
            class_counts=_counts(every[1, chosen]) if self.policy.labels else {},
            found_per_class=self._found(seen),
            seen=None if self.restore is not None else seen.shape[1],
            offered_per_class=_counts(seen[1]) if self.restore is None and self.policy.labels else None,
            accuracy=self._accuracy(seen),
        )
        self._check(probe, seen.shape[1])
        return probe

    def _limited(self, limit: Callable[[int], int | None] | None, seen: Tensor, fewest: int) -> ProbeSetPolicy:
        """The policy, its size cut to ``limit(seen)`` (the size the draw uses and checks against)."""
        cap = None if limit is None else limit(seen.shape[1])
        if cap is None:
            return self.policy
        if self.policy.probe_size is not None:
            self.policy = replace(self.policy, probe_size=max(1, min(self.policy.probe_size, cap)))
        else:
            assert self.policy.per_class is not None
            classes = max(1, len(_counts(seen[1])))
            per_class = min(self.policy.per_class, max(fewest, cap // classes, 1))
            self.policy = replace(self.policy, per_class=per_class)
        return self.policy

    def _seen_everywhere(self) -> Tensor:
        """``(4, N)`` key, label, qualified, correct of every distinct input any process was offered."""
        mine = torch.cat(self._seen, dim=1) if self._seen else torch.zeros(4, 0, dtype=torch.long)
        seen = _distributed.gather_cat(mine.T.contiguous()).T
        return seen[:, _first_of_each_key(seen[0])]

    def _found(self, seen: Tensor) -> dict[int, int] | None:
        if self.restore is not None or not self.policy.correct_only:
            return None
        classes = int(seen[1].max()) + 1 if seen.shape[1] else 0
        found = torch.bincount(seen[1][seen[2].bool()], minlength=classes)
        present = torch.bincount(seen[1], minlength=classes) > 0
        return {cls: int(n) for cls, n in enumerate(found.tolist()) if present[cls]}

    def _accuracy(self, seen: Tensor) -> float | None:
        """Accuracy over the distinct inputs offered, when every batch came with its correct mask."""
        if self.restore is not None or not seen.shape[1] or bool((seen[3] < 0).any()):
            return None
        return float(seen[3].double().mean())

    def _check(self, probe: ProbeSet, seen: int) -> None:
        if probe.size:
            if self.restore is not None:  # the checkpoint's set, found again: its size, not the policy's, is due
                if probe.size < len(self.restore):
                    warnings.warn(
                        f"probe set: {len(self.restore) - probe.size} of the {len(self.restore)} inputs kept in "
                        f"the checkpoint were not found in {self.context} (did the data change?); measuring on "
                        f"the {probe.size} found",
                        stacklevel=3,
                    )
            elif self.policy.probe_size is not None and probe.size < self.policy.probe_size:
                among = f", {probe.size} of them classified correctly" if self.policy.correct_only else ""
                warnings.warn(
                    f"probe set: probe_size={self.policy.probe_size} requested but {self.context} gave {seen} "
                    f"distinct inputs{among}; measuring on {probe.size}",
                    stacklevel=3,
                )
            return
        if seen == 0:
            raise ValueError(
                f"probe set: {self.context} gave no inputs to draw from (check limit_val_batches and which "
                "dataloader the callback reads)"
            )
        if self.restore is not None:
            raise ValueError(
                f"probe set: none of the {len(self.restore)} inputs kept in the checkpoint is in {self.context}; "
                "the data changed since the checkpoint was written"
            )
        if not self.empty_ok:
            raise ValueError(f"probe set: none of the {seen} inputs in {self.context} is classified correctly")
