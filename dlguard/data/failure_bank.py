"""A bounded store of failures, with their labels and origin, to feed back into training (SPEC §6)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from dlguard._validation import check_tensor, positive_int

__all__ = ["FailureBank"]


class FailureBank:
    """Failures (inputs a model got wrong, with the labels they should get) kept per origin, bounded.

    Each origin -- ``"robustness"``, ``"hda"``, ``"metamorphic"``... -- keeps at most ``capacity``
    rows: a deposit appends, the oldest rows make room, and a deposit larger than ``capacity``
    keeps a uniform random ``capacity`` of its rows. Rows stay on the device they were deposited
    from; :meth:`sample` moves what it returns, :meth:`state_dict` holds CPU copies (the bank is
    part of :class:`~dlguard.callbacks.FailureReplay`'s checkpoint state). Every row of every
    origin has the same shape, the shape of one training input.

    Args:
        capacity: rows kept per origin.
        seed: seed of the subsampling of oversized deposits.

    Example:
        >>> import torch
        >>> bank = FailureBank(capacity=3)
        >>> bank.add(torch.zeros(2, 1, 4, 4), torch.tensor([7, 1]), origin="robustness")
        >>> bank.add(torch.ones(2, 1, 4, 4), torch.tensor([2, 3]), origin="robustness")
        >>> len(bank), bank.origins(), bank.labels("robustness").tolist()  # the oldest row made room
        (3, {'robustness': 3}, [1, 2, 3])
    """

    def __init__(self, capacity: int = 256, seed: int = 0) -> None:
        self.capacity = positive_int("capacity", capacity)
        self.seed = seed
        self._inputs: dict[str, Tensor] = {}
        self._labels: dict[str, Tensor] = {}
        self._generator = torch.Generator().manual_seed(seed)
        self.version = 0
        """Incremented by every change, so readers re-check what they validated once."""

    def __len__(self) -> int:
        return sum(len(labels) for labels in self._labels.values())

    def __getstate__(self) -> dict[str, Any]:
        # a torch.Generator does not pickle (ddp_spawn pickles callbacks); its state goes as plain bytes, not as
        # a temporary tensor, which torch.multiprocessing would share by a file descriptor freed before use
        state = self.__dict__.copy()
        state["_generator"] = self._generator.get_state().numpy().tobytes()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        generator = torch.Generator()
        generator.set_state(torch.tensor(list(state.pop("_generator")), dtype=torch.uint8))
        self.__dict__.update(state, _generator=generator)

    @property
    def sample_shape(self) -> tuple[int, ...] | None:
        """The shape of one stored input (``None`` while empty)."""
        for inputs in self._inputs.values():
            return tuple(inputs.shape[1:])
        return None

    def origins(self) -> dict[str, int]:
        """``{origin: rows}``."""
        return {origin: len(labels) for origin, labels in self._labels.items()}

    def inputs(self, origin: str) -> Tensor:
        """The stored inputs of ``origin``."""
        return self._inputs[origin]

    def labels(self, origin: str) -> Tensor:
        """The stored labels of ``origin``."""
        return self._labels[origin]

    def add(self, inputs: Tensor, labels: Tensor, origin: str) -> None:
        """Deposit failures: inputs ``(N, ...)`` and the labels they should get ``(N, ...)``."""
        check_tensor("inputs", inputs)
        check_tensor("labels", labels)
        if not isinstance(origin, str) or not origin:
            raise ValueError(f"origin: expected a non-empty name, got {origin!r}")
        if len(labels) != len(inputs):
            raise ValueError(f"labels: expected {len(inputs)} labels for {len(inputs)} inputs, got {len(labels)}")
        shape = self.sample_shape
        if shape is not None and tuple(inputs.shape[1:]) != shape:
            raise ValueError(
                f"inputs: expected rows of shape {shape} like the rest of the bank, got {tuple(inputs.shape[1:])}"
            )
        if len(inputs) == 0:
            return
        inputs, labels = inputs.detach(), labels.detach()
        if len(inputs) > self.capacity:
            chosen = torch.randperm(len(inputs), generator=self._generator)[: self.capacity].to(inputs.device)
            inputs, labels = inputs[chosen], labels[chosen.to(labels.device)]
        if origin in self._inputs:
            inputs = torch.cat([self._inputs[origin].to(inputs.device), inputs])[-self.capacity :]
            labels = torch.cat([self._labels[origin].to(labels.device), labels])[-self.capacity :]
        self._inputs[origin], self._labels[origin] = inputs.clone(), labels.clone()
        self.version += 1

    def clear(self, origin: str | None = None) -> None:
        """Forget the rows of ``origin``, or of every origin."""
        for store in (self._inputs, self._labels):
            if origin is None:
                store.clear()
            else:
                store.pop(origin, None)
        self.version += 1

    def sample(
        self, count: int, generator: torch.Generator, device: torch.device | str | None = None
    ) -> tuple[Tensor, Tensor]:
        """``count`` rows drawn uniformly with replacement over all origins, on ``device``."""
        positive_int("count", count)
        if not len(self):
            raise ValueError("FailureBank: is empty; nothing to sample")
        origins = list(self._labels)
        sizes = torch.tensor([len(self._labels[o]) for o in origins])
        picks = torch.randint(int(sizes.sum()), (count,), generator=generator)
        bounds = sizes.cumsum(0)
        which = torch.searchsorted(bounds, picks, right=True)
        offsets = picks - (bounds - sizes)[which]
        inputs, labels = [], []
        for index, origin in enumerate(origins):
            rows = offsets[which == index]
            if len(rows):
                inputs.append(self._inputs[origin][rows.to(self._inputs[origin].device)].to(device))
                labels.append(self._labels[origin][rows.to(self._labels[origin].device)].to(device))
        return torch.cat(inputs), torch.cat(labels)

    def state_dict(self) -> dict[str, Any]:
        """CPU copies of every origin's rows, the capacity and the subsampling generator's state."""
        return {
            "capacity": self.capacity,
            "inputs": {origin: tensor.detach().cpu().clone() for origin, tensor in self._inputs.items()},
            "labels": {origin: tensor.detach().cpu().clone() for origin, tensor in self._labels.items()},
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (an empty mapping leaves the bank empty)."""
        # this bank's capacity wins over the saved one: keep the newest rows that fit
        self._inputs = {origin: rows[-self.capacity :] for origin, rows in state.get("inputs", {}).items()}
        self._labels = {origin: rows[-self.capacity :] for origin, rows in state.get("labels", {}).items()}
        if "generator" in state:
            self._generator.set_state(state["generator"])
        self.version += 1
