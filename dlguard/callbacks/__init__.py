"""Lightning callbacks that schedule probes during validation and feed failures back to training."""

__all__: list[str] = []
