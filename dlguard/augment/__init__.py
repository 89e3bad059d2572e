"""kornia-style augmentation modules (random, replayable parameters) over the functional ops."""

__all__: list[str] = []
