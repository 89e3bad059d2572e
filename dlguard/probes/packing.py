"""Forward passes of full size across many small batches: one sweep's inputs packed into passes of ``rows`` rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import torch
from torch import Tensor

from dlguard._validation import positive_int

__all__ = ["packed_passes"]

Tag = TypeVar("Tag")


def packed_passes(
    run: Callable[[Tensor], Tensor], chunks: Iterable[tuple[Tag, Tensor]], rows: int
) -> Iterator[tuple[Tag, Tensor, Tensor]]:
    """``run`` on every chunk's inputs, in passes of ``rows`` rows that cross the chunks' boundaries.

    A sweep makes many small batches -- each property level of a 16-input probe set is 16 rows --
    and a pass per batch runs the model far below its throughput at a full pass. Here the chunks'
    rows are queued and run ``rows`` at a time (the last pass takes what is left; a chunk of another
    row shape or dtype than the queue's starts a new pass); each chunk comes back, in order, as
    ``(tag, inputs, outputs)`` as soon as its last row has run, so the caller handles one chunk at
    a time and no more than about ``rows`` plus one chunk's inputs wait (twice that while a pass is
    cut from them). The outputs equal ``run(inputs)`` up to the batch-size dependence of the
    model's kernels.

    Args:
        run: the model on a batch, one output row per input row, e.g.
            :meth:`~dlguard.probes.ModelAdapter.logits`.
        chunks: ``(tag, inputs)`` pairs, each with at least one row; ``tag`` is handed back untouched.
        rows: rows per pass (``>= 1``).

    Raises:
        ValueError: for ``rows < 1`` (at once), a chunk without rows, or ``run`` returning another
            number of rows than it was given.

    Example:
        >>> import torch
        >>> sizes = []
        >>> def run(x):
        ...     sizes.append(len(x))
        ...     return x * 10
        >>> chunks = [("a", torch.arange(3.0)), ("b", torch.arange(3.0, 5.0)), ("c", torch.arange(5.0, 6.0))]
        >>> [(tag, out.tolist()) for tag, _, out in packed_passes(run, chunks, rows=4)], sizes
        ([('a', [0.0, 10.0, 20.0]), ('b', [30.0, 40.0]), ('c', [50.0])], [4, 2])
    """
    positive_int("rows", rows)
    return _packed(run, chunks, rows)


def _packed(
    run: Callable[[Tensor], Tensor], chunks: Iterable[tuple[Tag, Tensor]], rows: int
) -> Iterator[tuple[Tag, Tensor, Tensor]]:
    waiting: list[tuple[Tag, Tensor]] = []  # chunks whose outputs are not all in yet
    queued: list[Tensor] = []  # inputs not run yet
    done: list[Tensor] = []  # outputs not handed back yet
    queued_rows = done_rows = 0

    def run_passes(final: bool) -> None:
        nonlocal queued, queued_rows, done_rows
        if not queued_rows:
            return
        inputs = torch.cat(queued) if len(queued) > 1 else queued[0]
        full = queued_rows if final else queued_rows // rows * rows
        for part in inputs[:full].split(rows):
            out = run(part)
            if out.ndim == 0 or len(out) != len(part):
                got = "a scalar" if out.ndim == 0 else f"{len(out)} rows"
                raise ValueError(f"run: returned {got} for a pass of {len(part)} inputs, expected one row per input")
            done.append(out)
        done_rows += full
        queued, queued_rows = ([inputs[full:]] if full < queued_rows else []), queued_rows - full

    def ready() -> Iterator[tuple[Tag, Tensor, Tensor]]:
        nonlocal done, done_rows
        while waiting and len(waiting[0][1]) <= done_rows:
            tag, inputs = waiting.pop(0)
            outputs = torch.cat(done) if len(done) > 1 else done[0]
            yield tag, inputs, outputs[: len(inputs)]
            rest = outputs[len(inputs) :]
            done, done_rows = ([rest] if len(rest) else []), done_rows - len(inputs)

    for tag, inputs in chunks:
        if not len(inputs):
            raise ValueError(f"chunks: chunk {tag!r} has no rows; leave empty batches out")
        if queued and (inputs.shape[1:] != queued[0].shape[1:] or inputs.dtype != queued[0].dtype):
            run_passes(final=True)  # rows of another shape or dtype do not share a pass
            yield from ready()
        waiting.append((tag, inputs))
        queued.append(inputs)
        queued_rows += len(inputs)
        if queued_rows >= rows:
            run_passes(final=False)
            yield from ready()
    run_passes(final=True)
    yield from ready()
