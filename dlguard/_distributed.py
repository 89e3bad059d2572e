"""Collectives that are no-ops in one process, so generators and samplers run with or without DDP."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics.utilities.distributed import gather_all_tensors


def world_size() -> int:
    """Processes in the default group (1 without ``torch.distributed``)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without ``torch.distributed``)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _collective_device(tensor: Tensor) -> torch.device:
    """NCCL reduces CUDA tensors only; gloo takes tensors where they are."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return tensor.device


def gather(tensor: Tensor) -> list[Tensor]:
    """Every rank's ``tensor`` in rank order (shapes may differ along any dimension), on ``tensor``'s device.

    ``[tensor]`` in one process. A collective under DDP: every rank must call it.
    """
    if world_size() == 1:
        return [tensor]
    parts = gather_all_tensors(tensor.to(_collective_device(tensor)).contiguous())
    return [part.to(tensor.device) for part in parts]


def gather_cat(tensor: Tensor) -> Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order."""
    parts = gather(tensor)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def all_sum(tensor: Tensor) -> Tensor:
    """The sum of ``tensor`` over ranks (a new tensor; the input is untouched)."""
    if world_size() == 1:
        return tensor.clone()
    total = tensor.to(_collective_device(tensor), copy=True)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.to(tensor.device)


def settle() -> None:
    """Wait until every rank gets here, so gloo's threads are done with the run's last collective.

    A Lightning ``ddp_spawn`` worker exits right after ``fit``. When gloo's worker thread releases
    the run's last collective (Lightning's ``sync_dist`` reduction of the logged numbers) while the
    interpreter is finalising, freeing the work's tensors needs the GIL and the worker aborts
    ("terminate called without an active exception", SIGABRT). A barrier at teardown takes a round
    trip between the ranks, long after that release. Gloo only (NCCL's teardown is Lightning's); a
    no-op in one process. The group's own timeout applies: rank zero may still be writing figures.
    """
    if world_size() > 1 and dist.get_backend() == "gloo":
        dist.monitored_barrier()
