"""Scale to zero: the holder that keeps requests while no replica runs, its Services and policy, and the part."""
