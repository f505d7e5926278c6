"""Clean-up: what earlier plans left, once nothing uses it."""
