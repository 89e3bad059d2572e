"""Helpers shared below the metrics: :mod:`dlguard.utilities.plot` draws dlguard's figures.

This layer imports nothing of dlguard but the private root modules (``_validation``, ``_random``,
``_own_random``, ``_distributed``), so the metrics' ``plot()`` methods can use it without an import circle (see
``docs/architecture.md``). Users import the plot functions from :mod:`dlguard.report`.
"""

__all__: list[str] = []
