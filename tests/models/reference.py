"""The real models the tests serve, and the answers they expect, computed directly with torch.

Run with a Python that has torch (Debian's python3-torch, which cluster/node-deps.sh installs):

    python3 tests/models/reference.py build DIR        # writes DIR/conv.pt and DIR/mlp.pt
    python3 tests/models/reference.py predict MODEL [DTYPE]   # a JSON list of inputs on stdin -> the outputs

No weights are downloaded: each network is made here from a fixed seed.

- ``conv.pt`` (TorchScript, ``torch.jit.script``): a 1-D convolution then a position-wise MLP over
  an input of any length. Zero-padding an input to a longer bucket leaves the outputs at its own
  positions unchanged (the convolution pads with zeros itself), so the answers through bucket
  padding equal the direct ones; a deeper stack of convolutions would not have that property.
- ``mlp.pt`` (a whole module, ``torch.save``): Linear(16, 8), ReLU, Linear(8, 3), on inputs of 16.
- ``tokens.pt`` (TorchScript): token ids (int64) of any length through an embedding and a
  position-wise projection, one output per token; padding with token 0 changes nothing at the
  input's own positions. It stands in for the samples' transformers (BERT, DistilBERT, GPT-2).
- ``image.pt`` (TorchScript): a [3, H, W] image through a strided convolution, global average
  pooling and a linear layer to 10 scores. It stands in for the ResNet-50 sample.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


class Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 4, 3, padding=1)
        self.mix = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x.unsqueeze(1)))  # [B, 4, L]
        return self.mix(h.transpose(1, 2)).squeeze(-1)  # [B, L]


class Tokens(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.embed(ids))).squeeze(-1)  # [B, L]


def build(out: Path) -> None:
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(Conv().eval()), str(out / "conv.pt"))
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    torch.save(mlp, str(out / "mlp.pt"))
    torch.jit.save(torch.jit.script(Tokens().eval()), str(out / "tokens.pt"))
    image = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 10)
    ).eval()
    torch.jit.save(torch.jit.script(image), str(out / "image.pt"))


def load(path: str):
    try:
        return torch.jit.load(path)
    except RuntimeError:
        return torch.load(path)


def predict(path: str, inputs: list, dtype: str = "float32") -> list:
    model = load(path)
    with torch.no_grad():
        return [model(torch.tensor([x], dtype=getattr(torch, dtype)))[0].tolist() for x in inputs]


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        print(json.dumps(predict(sys.argv[2], json.load(sys.stdin), *sys.argv[3:])))
