"""Pure tensor maths of every dlguard score: no state, no model."""

__all__: list[str] = []
