"""Pure perturbation ops on ``(B, C, H, W)`` float tensors in ``[0, 1]``."""

from dlguard.augment.functional.padding import pad_resize, pad_resize_matrix
from dlguard.augment.functional.translate import pad_to_region, region_translations

__all__ = ["pad_resize", "pad_resize_matrix", "pad_to_region", "region_translations"]
