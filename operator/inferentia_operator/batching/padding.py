"""Input-shape buckets: pad an input to the smallest compiled shape that holds it.

A model compiled with buckets has one compiled graph per input shape, and an input must
be padded up to a bucket that is at least as large in every dimension (the Neuron
bucketing application note,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/appnotes/torch-neuron/bucketing-app-note.html).
Inputs are JSON nested lists; padding appends zeros at the end of each dimension, and
an answer of the bucket's shape is cut back to the request's.
"""

from __future__ import annotations

import math
from typing import Any

Shape = tuple[int, ...]


class TooLarge(ValueError):
    """The input exceeds every bucket in some dimension."""


def shape_of(value: Any) -> Shape:
    """The shape of a rectangular nested list (a scalar has shape ())."""
    if not isinstance(value, list):
        return ()
    if not value:
        return (0,)
    inner = {shape_of(v) for v in value}
    if len(inner) != 1:
        raise ValueError("the input is not rectangular: its rows differ in shape")
    return (len(value), *inner.pop())


def bucket_for(shape: Shape, buckets: list[Shape]) -> Shape:
    """The smallest bucket (fewest elements, then the first listed) holding ``shape`` in every dimension."""
    fitting = [b for b in buckets if len(b) == len(shape) and all(s <= d for s, d in zip(shape, b, strict=True))]
    if not fitting:
        raise TooLarge(f"input shape {list(shape)} fits no bucket; buckets: {[list(b) for b in buckets]}")
    return min(fitting, key=lambda b: (math.prod(b), buckets.index(b)))


def pad(value: Any, shape: Shape, fill: Any = 0) -> Any:
    """``value`` padded with ``fill`` at the end of each dimension up to ``shape``."""
    if not shape:
        return value
    items = [pad(v, shape[1:], fill) for v in value]
    blank = pad([], shape[1:], fill) if len(shape) > 1 else fill
    return items + [_copy(blank) for _ in range(shape[0] - len(items))]


def unpad(value: Any, shape: Shape) -> Any:
    """``value`` cut back to ``shape`` (the inverse of :func:`pad`)."""
    if not shape or not isinstance(value, list):
        return value
    return [unpad(v, shape[1:]) for v in value[: shape[0]]]


def _copy(value: Any) -> Any:
    return [_copy(v) for v in value] if isinstance(value, list) else value
