"""Stand-in for slime.utils.misc: int32 meta arrays, load_function and the singleton metaclass."""

import base64
import importlib
from collections.abc import Iterable
from functools import cache
from typing import Any

import torch


def decode_int32_meta_array(meta_info: dict[str, Any], keys: str | Iterable[str]) -> torch.Tensor | None:
    """The first of `keys` in meta_info as an int32 tensor: base64 of native int32, bytes, a tensor or a list."""
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    key = next((k for k in keys if k in meta_info), None)
    value = None if key is None else meta_info[key]
    if value is None:
        return None
    if isinstance(value, str):
        value = base64.b64decode(value.encode("ascii"))
    if isinstance(value, bytes | bytearray | memoryview):
        return torch.frombuffer(bytearray(value), dtype=torch.int32)
    if torch.is_tensor(value):
        return value.detach().to(device="cpu", dtype=torch.int32).reshape(-1)
    return torch.as_tensor(value, dtype=torch.int32).reshape(-1)


@cache
def load_function(path):
    """`module.attr` imported by its dotted path, as slime loads every --custom-*-path."""
    module_path, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


class SingletonMeta(type):
    _instances = {}

    def __call__(cls, *args, **kwargs):
        if cls not in cls._instances:
            cls._instances[cls] = super().__call__(*args, **kwargs)
        return cls._instances[cls]

    def clear_instances(cls):
        cls._instances = {}
