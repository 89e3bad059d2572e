"""A recorder of host syncs: the ops whose result the host must wait for (values read, data-dependent shapes)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from dlguard.augment import FollowUps
from tests.augment.objects import box_of, textured_objects

# what .item(), bool(t), int(t), t.tolist() (on a device), torch.equal, nonzero, unique and masked selection dispatch to
_READS = {
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::item",
    "aten::equal",
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::masked_select",
}
_INDEXING = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}


class HostSyncRecorder(TorchDispatchMode):
    """Records every dispatched op that would block the host on a GPU (in ``calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        if name in _READS:
            self.calls.append(name)
        elif name in _INDEXING and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] if i is not None
        ):
            self.calls.append(f"{name} with a boolean mask")
        elif name in {"aten::_to_copy", "aten::copy_"}:
            source = args[1] if name == "aten::copy_" else args[0]
            target = args[0].device if name == "aten::copy_" else kwargs.get("device")
            if source.device.type != "cpu" and target is not None and torch.device(target).type == "cpu":
                self.calls.append(f"{name} to the host")
        return func(*args, **kwargs)


@pytest.fixture
def host_syncs() -> type[HostSyncRecorder]:
    """``with host_syncs() as syncs: ...`` then ``syncs.calls`` lists the would-be host syncs."""
    return HostSyncRecorder


@pytest.fixture(scope="module")
def textured() -> tuple[Tensor, Tensor, Tensor, FollowUps]:
    """Images with round objects, backgrounds and the follow-ups (:func:`~tests.augment.objects.textured_objects`)."""
    return textured_objects()


@pytest.fixture(scope="module", params=["box", "mask"])
def removed(request: pytest.FixtureRequest) -> tuple[Tensor, Tensor, Tensor, FollowUps]:
    """``textured``'s images and follow-ups with each removal region, and the regions ``(B, H, W)`` removed."""
    images, masks, _, follow_ups = textured_objects(request.param)
    regions = torch.stack([box_of(mask) for mask in masks]) if request.param == "box" else masks
    return images, masks, regions, follow_ups
