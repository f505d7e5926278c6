"""load_pretrained_config, as NxD Inference defines it (utils/hf_adapter.py): a load_config hook
that reads a Hugging Face config. Here only from a local checkpoint's config.json (the library
also accepts a Hub id, through transformers' AutoConfig, which reaches the Hub)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_pretrained_config(model_path_or_name: str | os.PathLike | None = None, hf_config: Any = None) -> Callable[[Any], None]:
    def load_config(self: Any) -> None:
        if (model_path_or_name is None) == (hf_config is None):
            raise ValueError('Please provide only one of "model_path_or_name" or "hf_config"')
        if hf_config is not None:
            config = dict(vars(hf_config))
        else:
            path = Path(model_path_or_name) / "config.json"
            if not path.is_file():
                raise OSError(f"{model_path_or_name} does not appear to have a file named config.json")
            config = json.loads(path.read_text())
        dtype = config.pop("dtype", config.pop("torch_dtype", None))
        if dtype is not None and self.neuron_config is not None and not self.neuron_config.overrides_torch_dtype:
            self.neuron_config.torch_dtype = dtype
        config.setdefault("_name_or_path", str(model_path_or_name))
        self.__dict__.update(config)

    return load_config
