"""Packed passes: every chunk's outputs, in full passes across the chunks' boundaries."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from dlguard.probes.packing import packed_passes


@pytest.mark.parametrize("rows", [1, 3, 7, 50])
def test_each_chunk_gets_the_outputs_of_its_own_rows_in_passes_of_rows(rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    sizes = torch.randint(1, 12, (9,), generator=generator).tolist()
    chunks = [(f"chunk {i}", torch.randn(n, 4, generator=generator)) for i, n in enumerate(sizes)]
    weight = torch.randn(4, 2, generator=generator)
    passes: list[int] = []

    def run(x: Tensor) -> Tensor:
        passes.append(len(x))
        return x @ weight

    got = list(packed_passes(run, iter(chunks), rows))
    assert [tag for tag, _, _ in got] == [tag for tag, _ in chunks]
    for (_, inputs, outputs), (_, chunk) in zip(got, chunks, strict=True):
        assert inputs is chunk
        torch.testing.assert_close(outputs, chunk @ weight)  # the reference: one chunk at a time
    total = sum(sizes)
    assert passes == [rows] * (total // rows) + ([total % rows] if total % rows else [])


def test_a_chunk_comes_back_as_soon_as_its_last_row_has_run() -> None:
    seen: list[str] = []

    def chunks():
        for tag in ("a", "b", "c"):
            seen.append(f"made {tag}")
            yield tag, torch.ones(3, 1)

    def run(x: Tensor) -> Tensor:
        seen.append(f"pass of {len(x)}")
        return x

    for tag, _, _ in packed_passes(run, chunks(), rows=2):
        seen.append(f"got {tag}")
    # a straddles the first two passes, b the second and third: both come back once the third has run,
    # before c is made; the last pass takes what is left
    assert seen == [
        "made a", "pass of 2", "made b", "pass of 2", "pass of 2", "got a", "got b", "made c", "pass of 2", "pass of 1",
        "got c",
    ]  # fmt: skip


def test_chunks_of_another_row_shape_or_dtype_start_a_new_pass() -> None:
    passes: list[tuple[tuple[int, ...], torch.dtype]] = []

    def run(x: Tensor) -> Tensor:
        passes.append((tuple(x.shape), x.dtype))
        return x.flatten(1).sum(1, keepdim=True)

    chunks = [("a", torch.ones(2, 3)), ("b", torch.ones(2, 4)), ("c", torch.ones(2, 4, dtype=torch.float64))]
    got = {tag: out.flatten().tolist() for tag, _, out in packed_passes(run, chunks, rows=8)}
    assert got == {"a": [3.0, 3.0], "b": [4.0, 4.0], "c": [4.0, 4.0]}
    assert passes == [((2, 3), torch.float32), ((2, 4), torch.float32), ((2, 4), torch.float64)]


def test_bad_chunks_pass_sizes_and_outputs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^chunks: chunk 'b' has no rows"):
        list(packed_passes(lambda x: x, [("a", torch.ones(1)), ("b", torch.ones(0))], rows=4))
    with pytest.raises(ValueError, match="rows"):
        packed_passes(lambda x: x, [("a", torch.ones(1))], rows=0)  # at the call, before any chunk is made
    with pytest.raises(ValueError, match=r"^run: returned 1 rows for a pass of 2 inputs, expected one row per input"):
        list(packed_passes(lambda x: x[:1], [("a", torch.ones(2, 1))], rows=2))
    with pytest.raises(ValueError, match=r"^run: returned a scalar for a pass of 2 inputs"):
        list(packed_passes(lambda x: x.sum(), [("a", torch.ones(2, 1))], rows=2))
