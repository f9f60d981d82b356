"""The machine: the one table, the engine that drives it, the context a state gets."""
