"""Test generators that run a model (genetic algorithm, greedy coverage search, attacks)."""

__all__: list[str] = []
