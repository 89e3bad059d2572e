"""Where the zoo's recipe tests can compare a retrained weight file with the shipped one bit for bit."""

import torch

SHIPPED_HERE = torch.backends.cpu.get_cpu_capability() == "AVX512"
"""Whether torch picks the CPU kernels the shipped weights were trained with (AVX512, assumed: the earlier
sessions' Intel Xeon machines, whose kernels no record names). Elsewhere (an AMD EPYC's AVX2 kernels,
2026-12-01) the recipe trains other last bits: its weights have the shipped keys, shapes and dtype and pass
the quality bar, but are not the shipped ones bit for bit."""


def assert_like_shipped(shipped: dict[str, torch.Tensor], again: dict[str, torch.Tensor]) -> None:
    """A retrained state dict has the shipped one's keys, shapes and dtypes, and its bits where ``SHIPPED_HERE``."""
    assert shipped.keys() == again.keys()
    assert all(again[key].shape == shipped[key].shape and again[key].dtype == shipped[key].dtype for key in shipped)
    if SHIPPED_HERE:  # bit for bit only on the CPU kernels that trained the shipped weights
        assert all(torch.equal(shipped[key], again[key]) for key in shipped)
