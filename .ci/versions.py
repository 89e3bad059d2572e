"""Print the installed version of every dependency dlguard declares (what pip resolved for this run)."""

import re
from importlib.metadata import requires, version

import torch

names = [re.match(r"[A-Za-z0-9_.-]+", r)[0] for r in requires("dlguard") or [] if "extra ==" not in r]
print(" | ".join(f"{name} {version(name)}" for name in ["dlguard", *names]))
print(f"python-visible CUDA: {torch.cuda.is_available()}")
