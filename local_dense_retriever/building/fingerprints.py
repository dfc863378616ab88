"""What a cached index depends on, by content: sizes and hashes of its inputs and the versions of what encoded them.

A cache keyed this way stays valid when the checkout or its virtual environment moves (no absolute path is part of
the key) and is rebuilt when an input really changed; `stale_reason` says in one line which one.

    key = {"corpus": digest_bytes(rows), "encoder": folder_digest(model_dir), "versions": package_versions(...)}
    reason = stale_reason(json.loads(manifest.read_text()) if manifest.exists() else None, key)
"""

import hashlib
from importlib import metadata
from pathlib import Path

# What turns passages into vectors and writes the index: a new version may give other vectors or another format.
ENCODING_PACKAGES = ("torch", "transformers", "faiss-cpu")
CHUNK = 1 << 20


def digest_bytes(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def file_digest(path: Path) -> dict:
    """Size and sha256 of a file's content (followed through symbolic links)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return {"bytes": Path(path).stat().st_size, "sha256": digest.hexdigest()}


def folder_digest(folder: Path) -> dict:
    """Every file under `folder` by its path relative to it (README files and dotfiles aside): size and sha256."""
    folder = Path(folder)
    files = sorted(
        path
        for path in folder.rglob("*")
        if path.is_file() and not path.name.startswith(".") and path.suffix.lower() != ".md"
    )
    return {str(path.relative_to(folder)): file_digest(path) for path in files}


def package_versions(names: tuple[str, ...] = ENCODING_PACKAGES) -> dict:
    """The installed version of each distribution (None when it is not installed)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _first_difference(earlier, now, path: str) -> str | None:
    if isinstance(earlier, dict) and isinstance(now, dict):
        for key in [*now, *(k for k in earlier if k not in now)]:
            where = f"{path} {key}".strip()
            if key not in earlier:
                return f"{where} is not in the cached key (a cache written by an older version)"
            if key not in now:
                return f"{where} is no longer part of the key (a cache written by an older version)"
            found = _first_difference(earlier[key], now[key], where)
            if found:
                return found
        return None
    if earlier == now:
        return None
    return f"{path} changed ({_short(earlier)} -> {_short(now)})"


def _short(value) -> str:
    text = str(value)
    return text[:12] if isinstance(value, str) and len(text) == 64 else text[:60]  # a sha256: its first 12 digits


def stale_reason(earlier: dict | None, now: dict) -> str | None:
    """None when the key recorded with a cache (`earlier`) is `now`'s; else why not, in one line: the first input
    that differs, e.g. "encoder model.safetensors sha256 changed (53aa51172d14 -> 0c1e8a9f3b2d)"."""
    if earlier is None:
        return "nothing is cached yet"
    return _first_difference(earlier, now, "")
