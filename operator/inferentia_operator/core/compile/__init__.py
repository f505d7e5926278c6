"""Compile: the compile Job of a plan, the record of a completed compile, and the part that decides between them."""
