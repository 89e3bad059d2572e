"""Object relevancy's follow-ups (SPEC §3): the six mutation functions, and every follow-up of a batch, named.

:data:`MUTATION_FUNCTIONS` lists the functions in SPEC §3's order, each with its type (object preserving,
MR-1, or object removing, MR-2) and its operations. :func:`object_follow_ups` gives each image
``F = 2·n_backgrounds + 14`` follow-ups in that order, as :class:`FollowUps` that record each one's function,
type and operation. Their pixels are :func:`~dlguard.augment.functional.follow_up_images`' (OpenCV, no model;
its module describes every operation, the seam and the thread pool). Follow-ups do not depend on the model:
:class:`~dlguard.augment.FollowUpCache` generates them once per probe set and hands them back every epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dlguard.augment.functional.object_mutations import FILL_COLORS, follow_up_images

__all__ = ["MUTATION_FUNCTIONS", "FollowUps", "MutationFunction", "follow_up_layout", "object_follow_ups"]


@dataclass(frozen=True)
class MutationFunction:
    """One mutation function of SPEC §3: a name, its type and its operations.

    Attributes:
        name: the function's name (e.g. ``"InpaintObject"``).
        preserving: ``True`` for an object-preserving function (MR-1), ``False`` for object-removing (MR-2).
        operations: the operations' names; empty for the functions with one operation per background
            (their operations are named by the background's index when follow-ups are generated).
    """

    name: str
    preserving: bool
    operations: tuple[str, ...]

    def operation_names(self, n_backgrounds: int) -> tuple[str, ...]:
        """``"name/operation"`` of every operation, given the number of backgrounds."""
        operations = self.operations or tuple(str(i) for i in range(n_backgrounds))
        return tuple(f"{self.name}/{operation}" for operation in operations)


MUTATION_FUNCTIONS: tuple[MutationFunction, ...] = (
    MutationFunction("MoveObjectToBackground", True, ()),
    MutationFunction("BlendObjectIntoBackground", True, ()),
    MutationFunction("GrayBackground", True, ("gray",)),
    MutationFunction("FillObjectWithColor", False, tuple(FILL_COLORS)),
    MutationFunction("InpaintObject", False, ("ns", "telea")),
    MutationFunction("FillObjectWithMarginStatistic", False, ("mean", "median")),
)


@dataclass
class FollowUps:
    """Follow-ups of ``B`` source images, ``F`` per image, in :data:`MUTATION_FUNCTIONS` order.

    Attributes:
        inputs: ``(B, F, C, H, W)`` float32 in ``[0, 1]``, the sources' ``C``.
        function: ``(F,)`` long, index of each follow-up's function in :data:`MUTATION_FUNCTIONS`.
        preserving: ``(F,)`` bool, whether that function preserves the object.
        operation: ``F`` names, e.g. ``"FillObjectWithColor/red"``, ``"MoveObjectToBackground/3"``.
        valid: ``(B, F)`` bool; ``False`` where an operation does not apply to an image (a margin statistic
            when the mask fills its bounding box); such a follow-up is a copy of the source.
    """

    inputs: Tensor
    function: Tensor
    preserving: Tensor
    operation: list[str]
    valid: Tensor

    def __len__(self) -> int:
        return len(self.inputs)

    def to(self, device: torch.device | str) -> FollowUps:
        """The same follow-ups on ``device``."""
        return FollowUps(
            self.inputs.to(device),
            self.function.to(device),
            self.preserving.to(device),
            list(self.operation),
            self.valid.to(device),
        )

    def select(self, index: int | slice | Sequence[int] | Tensor) -> FollowUps:
        """The follow-ups of the source images ``index`` (an ``int`` keeps the batch dimension)."""
        if isinstance(index, int):
            index = [index]
        if isinstance(index, Sequence):
            index = torch.as_tensor(index, dtype=torch.long, device=self.inputs.device)
        return FollowUps(self.inputs[index], self.function, self.preserving, list(self.operation), self.valid[index])

    def background_swapped(self) -> Tensor:
        """``(B, n_backgrounds, C, H, W)``: the sources' objects moved onto each background (function 0)."""
        return self.inputs[:, self.function == 0]


def follow_up_layout(n_backgrounds: int) -> tuple[Tensor, Tensor, list[str]]:
    """Each follow-up's function, type and operation, in :data:`MUTATION_FUNCTIONS` order, for ``N`` backgrounds.

    Args:
        n_backgrounds: the number ``N`` of backgrounds.

    Returns:
        ``function (F,)`` long, the index in :data:`MUTATION_FUNCTIONS`; ``preserving (F,)`` bool; and the
        ``F = 2·N + 14`` names ``"function/operation"``, as in :class:`FollowUps`.

    Example:
        >>> function, preserving, names = follow_up_layout(2)
        >>> len(names), names[2], int(function[2]), bool(preserving[2]), names[-1]
        (18, 'BlendObjectIntoBackground/0', 1, True, 'FillObjectWithMarginStatistic/median')
    """
    function, preserving, names = [], [], []
    for index, mutation in enumerate(MUTATION_FUNCTIONS):
        for name in mutation.operation_names(n_backgrounds):
            function.append(index)
            preserving.append(mutation.preserving)
            names.append(name)
    return torch.tensor(function, dtype=torch.long), torch.tensor(preserving, dtype=torch.bool), names


def object_follow_ups(
    images: Tensor, masks: Tensor, backgrounds: Tensor, *, removal: str = "box", workers: int | None = None
) -> FollowUps:
    """All follow-ups of SPEC §3 for each image: ``F = 2·N + 14`` with ``N`` backgrounds.

    The pixels are those of :func:`~dlguard.augment.functional.follow_up_images`; the follow-ups are named by
    :func:`follow_up_layout`.

    Args:
        images: ``(B, C, H, W)`` floating sources in ``[0, 1]``, ``C`` in ``{1, 3}``.
        masks: ``(B, H, W)`` bool, ``True`` on each image's object; none may be empty.
        backgrounds: ``(N, 3 or C, H, W)`` backgrounds, as :func:`~dlguard.augment.functional.follow_up_images`
            takes them.
        removal: the region the object-removing operations replace: ``"box"`` (the object's bounding box,
            default) or ``"mask"`` (its pixels), as in :func:`~dlguard.augment.functional.follow_up_images`.
        workers: threads generating images in parallel, as in
            :func:`~dlguard.augment.functional.follow_up_images` (the result does not depend on it).

    Returns:
        :class:`FollowUps` on ``images``' device.

    Raises:
        ValueError: before any work, naming ``images``, ``masks``, ``backgrounds``, ``removal`` or ``workers``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> images, backgrounds = torch.rand(2, 3, 16, 16, generator=g), torch.rand(4, 3, 16, 16, generator=g)
        >>> masks = torch.zeros(2, 16, 16, dtype=torch.bool)
        >>> masks[:, 4:12, 5:10] = True
        >>> masks[:, 4, 5] = False  # a margin pixel inside the box
        >>> follow_ups = object_follow_ups(images, masks, backgrounds)
        >>> follow_ups.inputs.shape, follow_ups.operation[9]
        (torch.Size([2, 22, 3, 16, 16]), 'FillObjectWithColor/black')
        >>> red = follow_ups.inputs[0, follow_ups.operation.index("FillObjectWithColor/red"), :, 6, 7]
        >>> red.tolist(), bool(follow_ups.valid.all())
        ([1.0, 0.0, 0.0], True)
    """
    inputs, valid = follow_up_images(images, masks, backgrounds, removal=removal, workers=workers)
    function, preserving, names = follow_up_layout(len(backgrounds))
    device = inputs.device
    return FollowUps(inputs, function.to(device), preserving.to(device), names, valid)
