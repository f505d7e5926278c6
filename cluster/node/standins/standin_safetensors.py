"""The safetensors file format, which Hugging Face checkpoints and NxD Inference's sharded
checkpoints use, for the stand-ins: an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and byte range, then the data
(https://huggingface.co/docs/safetensors/index, "Format"). Float32 tensors only."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

MAX_HEADER = 100_000_000  # the format's own bound on the header


def _flat(values: Any) -> list[float]:
    return [x for v in values for x in _flat(v)] if isinstance(values, list) else [float(values)]


def _shape(values: Any) -> list[int]:
    return [len(values), *_shape(values[0])] if isinstance(values, list) else []


def write(path: Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> None:
    Path(path).write_bytes(dumps(tensors, metadata))


def dumps(tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> bytes:
    """The file's bytes (safetensors.torch.save's output)."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    data = b""
    for name, values in tensors.items():
        flat = _flat(values)
        header[name] = {"dtype": "F32", "shape": _shape(values), "data_offsets": [len(data), len(data) + 4 * len(flat)]}
        data += struct.pack(f"<{len(flat)}f", *flat)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def header(path: Path) -> dict[str, Any]:
    """The tensors a file holds, by name; raises ValueError for a file that is not safetensors."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
    (size,) = struct.unpack("<Q", raw[:8])
    if size > min(MAX_HEADER, len(raw) - 8):
        raise ValueError(f"{path}: not a safetensors file (header length {size})")
    try:
        tensors = json.loads(raw[8 : 8 + size])
    except ValueError as exc:
        raise ValueError(f"{path}: not a safetensors file ({exc})") from None
    tensors.pop("__metadata__", None)
    return dict(tensors)
