"""torchmetrics metrics of dlguard; each delegates its maths to :mod:`dlguard.metrics.functional`."""

__all__: list[str] = []
