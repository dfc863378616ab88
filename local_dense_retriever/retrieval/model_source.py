"""Where `--retriever_model` points: a local directory or a Hugging Face hub id, checked before anything loads.

Kept apart from `encoders` so the server can check its flags without importing torch (it listens first).
"""

import os
from pathlib import Path


def looks_like_a_path(value: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else with a slash, or starting like a path, is a path.
    return value.startswith((".", "/", "~")) or "\\" in value or value.count("/") > 1 or value.endswith("/")


def check_model_source(value: str) -> str:
    """A local model directory (returned absolute), or a Hugging Face hub id that is cached or on the hub.

    Raises ValueError saying what was looked for: a mistyped directory such as `models/minilm` has the shape of a
    hub id, and transformers would spend most of a minute retrying the hub before failing without naming it.
    """
    path = Path(os.path.expanduser(value))
    if path.is_dir():
        return str(path.resolve())
    if path.exists():
        raise ValueError(f"{value}: not a directory ({path.resolve()})")
    missing = f"{value}: no such directory ({path.resolve()})"
    if looks_like_a_path(value):
        raise ValueError(missing)
    import huggingface_hub
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    try:
        cached = huggingface_hub.try_to_load_from_cache(value, "config.json")
    except HFValidationError:
        raise ValueError(f"{missing}, and not a valid Hugging Face model id") from None
    if isinstance(cached, str):
        return value
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise ValueError(f"{missing}, and not in the Hugging Face cache (HF_HUB_OFFLINE is set)")
    try:
        huggingface_hub.model_info(value, timeout=10)
    except RepositoryNotFoundError:
        raise ValueError(f"{missing}, and there is no model {value!r} on the Hugging Face hub") from None
    except Exception as err:  # no network, proxy, DNS: any of them means transformers cannot download it either
        reason = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(
            f"{missing}, not in the Hugging Face cache, and the hub could not be reached ({reason})"
        ) from None
    return value
