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
            yield tag, torch.ones(2, 1)

    for tag, _, _ in packed_passes(lambda x: x, chunks(), rows=2):
        seen.append(f"got {tag}")
    assert seen == ["made a", "got a", "made b", "got b", "made c", "got c"]  # never more than a pass waits


def test_an_empty_chunk_and_a_bad_pass_size_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^chunks: chunk 'b' has no rows"):
        list(packed_passes(lambda x: x, [("a", torch.ones(1)), ("b", torch.ones(0))], rows=4))
    with pytest.raises(ValueError, match="rows"):
        list(packed_passes(lambda x: x, [("a", torch.ones(1))], rows=0))
