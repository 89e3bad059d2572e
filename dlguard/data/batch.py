"""Reading ``(inputs, target)`` out of any batch, and writing guided or replayed inputs back into it."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, MutableMapping, Sequence
from typing import Any

from torch import Tensor

__all__ = ["BatchAccessor", "BatchKeys"]

BatchKeys = tuple[Hashable, Hashable] | Callable[[Any], tuple[Tensor, Tensor]]
"""``(inputs key, target key)`` -- positions of a tuple/list batch or keys of a dict batch -- or a
callable ``batch -> (inputs, target)`` that returns the batch's own tensors (not copies)."""

_KEYS_HINT = "set batch_keys=(inputs key, target key), e.g. (0, 1) or ('image', 'label')"
_HINT = f"{_KEYS_HINT}, or a callable batch -> (inputs, target)"


def describe_batch(batch: Any) -> str:
    """A batch in words for an error message: its type and keys or length."""
    if isinstance(batch, Mapping):
        return f"a {type(batch).__name__} batch with keys {list(batch)}"
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        return f"a {type(batch).__name__} batch of {len(batch)} elements"
    return f"a batch of type {type(batch).__name__}"


def _same_storage(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class BatchAccessor:
    """Reads ``(inputs, target)`` from tuple, list or dict batches, or through a callable.

    Guides and failure replay write their rows back through it, so whatever the batch structure -- a
    tuple, a list, a dict, a dataclass reached through a callable -- the training step sees the change
    without any code of its own: a list or dict batch gets new tensors at its keys (the loader's own,
    which may be views of its dataset, stay as they were), a tuple's tensors and a callable's are
    written into (they cannot take new ones). A bare tensor batch is its own inputs (no target).

    Args:
        keys: ``(inputs key, target key)`` or a callable ``batch -> (inputs, target)``.
        allow_callable: whether a callable is offered in the errors' hint (a reader that needs keys says not).

    Example:
        >>> import torch
        >>> accessor = BatchAccessor(("image", "label"))
        >>> batch = {"image": torch.zeros(2, 1, 4, 4), "label": torch.tensor([3, 5])}
        >>> images, target = accessor.read(batch)
        >>> accessor.write(batch, torch.ones(2, 1, 4, 4))
        >>> float(batch["image"].mean()), target.tolist()
        (1.0, [3, 5])
        >>> BatchAccessor().read(batch)
        Traceback (most recent call last):
        ...
        ValueError: batch_keys: cannot read the inputs at key 0 from a dict batch with keys ['image', 'label']; \
set batch_keys=(inputs key, target key), e.g. (0, 1) or ('image', 'label'), or a callable batch -> (inputs, target)
    """

    def __init__(self, keys: BatchKeys = (0, 1), allow_callable: bool = True) -> None:
        if callable(keys) and not allow_callable:
            raise ValueError(f"batch_keys: expected (inputs key, target key), got a callable {keys!r}")
        self.hint = _HINT if allow_callable else _KEYS_HINT
        if callable(keys):
            self._read: Callable[[Any], tuple[Tensor, Tensor]] | None = keys
            self.keys: tuple[Hashable, Hashable] | None = None
        elif isinstance(keys, tuple | list) and len(keys) == 2 and all(isinstance(k, Hashable) for k in keys):
            self._read, self.keys = None, (keys[0], keys[1])
        else:
            raise ValueError(f"batch_keys: expected (inputs key, target key) or a callable, got {keys!r}")
        self._checked_writable = False

    def _lookup(self, batch: Any, key: Hashable, what: str) -> Any:
        try:
            return batch[key]
        except (KeyError, IndexError, TypeError):
            raise ValueError(
                f"batch_keys: cannot read the {what} at key {key!r} from {describe_batch(batch)}; {self.hint}"
            ) from None

    def read(self, batch: Any) -> tuple[Tensor, Tensor]:
        """``(inputs (B, ...), target (B, ...))``; a clear error naming ``batch_keys`` otherwise."""
        if isinstance(batch, Tensor) and self._read is None:
            raise ValueError(
                f"batch_keys: the batch is a bare tensor of shape {tuple(batch.shape)} without targets; "
                "yield (inputs, target) batches or pass a callable batch -> (inputs, target)"
            )
        if self._read is not None:
            try:
                result = self._read(batch)
            except Exception as err:  # the user's callable: say which argument it came from
                raise ValueError(f"batch_keys: the callable failed on {describe_batch(batch)}: {err}") from err
            if not (isinstance(result, tuple | list) and len(result) == 2):
                raise ValueError(f"batch_keys: the callable must return (inputs, target), got {type(result).__name__}")
            inputs, target = result
        else:
            assert self.keys is not None
            inputs = self._lookup(batch, self.keys[0], "inputs")
            target = self._lookup(batch, self.keys[1], "target")
        self._check(inputs, target, batch)
        return inputs, target

    def inputs(self, batch: Any) -> Tensor:
        """The inputs alone (a bare tensor batch is its own inputs; no target is needed)."""
        if isinstance(batch, Tensor):
            return batch
        if self._read is None:
            assert self.keys is not None
            inputs = self._lookup(batch, self.keys[0], "inputs")
        else:
            inputs = self.read(batch)[0]
        if not isinstance(inputs, Tensor) or inputs.ndim < 1:
            raise ValueError(
                f"batch_keys: expected the inputs to be a tensor (B, ...), got {type(inputs).__name__}; {self.hint}"
            )
        return inputs

    def _check(self, inputs: Any, target: Any, batch: Any) -> None:
        if not isinstance(inputs, Tensor) or inputs.ndim < 1:
            raise ValueError(
                f"batch_keys: expected the inputs to be a tensor (B, ...), got {type(inputs).__name__} from "
                f"{describe_batch(batch)}; {self.hint}"
            )
        if not isinstance(target, Tensor) or target.ndim < 1 or target.shape[0] != inputs.shape[0]:
            shape = tuple(target.shape) if isinstance(target, Tensor) else type(target).__name__
            raise ValueError(
                f"batch_keys: expected the target to be a tensor with the inputs' batch size {inputs.shape[0]}, got "
                f"{shape} from {describe_batch(batch)}; {self.hint}"
            )

    def _check_writable(self, batch: Any, inputs: Tensor, target: Tensor) -> None:
        if self._checked_writable or self._read is None:
            return
        again_inputs, again_target = self.read(batch)
        if not (_same_storage(inputs, again_inputs) and _same_storage(target, again_target)):
            raise ValueError(
                "batch_keys: the callable returns copies of the batch's tensors, so guides and replay cannot write "
                "into the batch; return the batch's own tensors (no .float(), .clone() or .to())"
            )
        self._checked_writable = True

    def takes_new(self, batch: Any) -> bool:
        """Whether the batch takes new tensors at its keys (a list or a dict), rather than writes into its own."""
        return self.keys is not None and isinstance(batch, list | MutableMapping)

    def write(self, batch: Any, inputs: Tensor) -> None:
        """Replace the batch's inputs: a list or dict batch gets a new tensor, a tuple or a callable's is written into.

        A new tensor, so that a loader that hands out views of its dataset (``batch_size=None`` over
        pre-batched tensors, slices of a tensor on the GPU) keeps its dataset as it was.
        """
        current, target = self.read(batch)
        self._check_writable(batch, current, target)
        if inputs.shape != current.shape:
            raise ValueError(f"inputs: expected shape {tuple(current.shape)} to write back, got {tuple(inputs.shape)}")
        if inputs is current:
            return
        if self.takes_new(batch):
            assert self.keys is not None
            batch[self.keys[0]] = inputs.to(device=current.device, dtype=current.dtype)
        else:
            current.copy_(inputs)

    def write_rows(self, batch: Any, rows: Tensor, inputs: Tensor, target: Tensor) -> None:
        """Replace the given rows of the batch's inputs and target: new tensors in a list or dict batch, as in write."""
        current, current_target = self.read(batch)
        self._check_writable(batch, current, current_target)
        if not len(rows) == len(inputs) == len(target):
            raise ValueError(
                f"rows: expected as many rows as inputs and targets, got {len(rows)}, {len(inputs)} and {len(target)}"
            )
        if inputs.shape[1:] != current.shape[1:]:
            raise ValueError(
                f"inputs: expected rows of shape {tuple(current.shape[1:])} to write into the batch, got "
                f"{tuple(inputs.shape[1:])}"
            )
        inputs = inputs.to(device=current.device, dtype=current.dtype)
        target = target.to(device=current_target.device, dtype=current_target.dtype)
        if self.takes_new(batch):  # new tensors, as in write: the loader's own stay as they were
            assert self.keys is not None
            batch[self.keys[0]] = current.index_put((rows,), inputs)
            batch[self.keys[1]] = current_target.index_put((rows,), target)
        else:
            current[rows] = inputs
            current_target[rows] = target
