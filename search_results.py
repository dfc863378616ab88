"""Turn retrieval hits into the text Search-R1 shows the model."""

from collections.abc import Iterable, Mapping
from typing import Any


def hit_contents(hit: Mapping[str, Any]) -> str:
    """Contents of one hit in either server shape: {"document": {...}, "score": s} or the document itself."""
    if not isinstance(hit, Mapping):
        raise ValueError(f"a retrieval hit must be an object, got {type(hit).__name__}: {str(hit)[:80]!r}")
    document = hit.get("document", hit)
    if not isinstance(document, Mapping):
        raise ValueError(f"a retrieval hit's document must be an object, got {type(document).__name__}")
    contents = document.get("contents")
    if contents is None:
        title, text = document.get("title"), document.get("text")
        if title is None and text is None:
            raise ValueError(f"a retrieval hit has no 'contents' (keys: {sorted(document)})")
        contents = f'"{title or ""}"\n{text or ""}'
    if not isinstance(contents, str):
        raise ValueError(f"a retrieval hit's 'contents' must be a string, got {type(contents).__name__}")
    return contents


def format_documents(contents: Iterable[str]) -> str:
    """Search-R1's passages2string: `Doc i(Title: <first line>) <rest>` per hit, i from 1."""
    lines = []
    for index, content in enumerate(contents, start=1):
        title, _, text = content.partition("\n")
        lines.append(f"Doc {index}(Title: {title}) {text}\n")
    return "".join(lines)
