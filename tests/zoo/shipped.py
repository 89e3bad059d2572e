"""How the zoo's recipe tests compare a retrained weight file with the shipped one, on any processor.

The recipes train on one deterministic CPU thread, yet the last bits of their weights depend on the
kernels torch picks for the processor: the shipped files came back bit for bit on the machines of
earlier sessions with AVX512 kernels (last on an AMD EPYC with AVX-512, CI of bed6b47), but not on an
Intel Xeon with AVX-512 (2026-12-06) nor on an AMD EPYC's AVX2 kernels (2026-12-01). So a retrained file
must have the shipped one's keys, shapes and dtypes, pass the model's quality bar and *behave* like the
shipped model on held-out inputs (each test says how, and checks that an untrained network of the same
architecture does not) -- not equal it bit for bit, which no test can promise across processors.
"""

import torch


def assert_like_shipped(shipped: dict[str, torch.Tensor], again: dict[str, torch.Tensor]) -> None:
    """A retrained state dict has the shipped one's keys, and each tensor its shape and dtype."""
    assert shipped.keys() == again.keys()
    assert all(again[key].shape == shipped[key].shape and again[key].dtype == shipped[key].dtype for key in shipped)
