"""Where the zoo's recipe tests can compare a retrained weight file with the shipped one bit for bit."""

import torch

SHIPPED_HERE = torch.backends.cpu.get_cpu_capability() == "AVX512"
"""Whether torch picks the CPU kernels the shipped weights were trained with (AVX512, assumed: the earlier
sessions' Intel Xeon machines, whose kernels no record names). Elsewhere (an AMD EPYC's AVX2 kernels,
2026-12-01) the recipe trains other last bits: its weights have the shipped keys, shapes and dtype and pass
the quality bar, but are not the shipped ones bit for bit."""
