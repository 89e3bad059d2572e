"""Pure perturbation ops on ``(B, C, H, W)`` float tensors in ``[0, 1]``."""

__all__: list[str] = []
