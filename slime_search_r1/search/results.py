"""Turn retrieval hits into the text Search-R1 shows the model."""

from collections.abc import Iterable, Mapping
from typing import Any

# What one search answer may weigh, per request. A wiki-18 hit is ~0.7 KB of JSON; 64 KiB a hit leaves room for
# long-document corpora and \u-escaped text, and is far more than one observation shows (max_obs_tokens, 500 by
# default, is ~2-3 KB). The base covers the envelope (serper adds a knowledge graph, related searches, ...).
# topk 3: 256 KiB; topk 100: 6.3 MiB. 256 searches in flight at topk 3 hold at most 64 MiB.
_ANSWER_BYTES_PER_HIT = 64 * 1024
_ANSWER_BASE_BYTES = 64 * 1024


def answer_byte_limit(topk: int) -> int:
    """The most bytes a search backend's answer for `topk` hits may have; longer ones are refused."""
    return _ANSWER_BASE_BYTES + topk * _ANSWER_BYTES_PER_HIT


def _described(value: object) -> str:
    # only text is quoted: str() of an arbitrary nested structure can be huge or recurse too deeply
    return f"str {value[:80]!r}" if isinstance(value, str) else type(value).__name__


def hit_contents(hit: Mapping[str, Any]) -> str:
    """Contents of one hit in either server shape: {"document": {...}, "score": s} or the document itself."""
    if not isinstance(hit, Mapping):
        raise ValueError(f"a retrieval hit must be an object, got {_described(hit)}")
    document = hit.get("document", hit)
    if not isinstance(document, Mapping):
        raise ValueError(f"a retrieval hit's document must be an object, got {type(document).__name__}")
    contents = document.get("contents")
    if contents is None:
        title, text = document.get("title"), document.get("text")
        if title is None and text is None:
            raise ValueError(f"a retrieval hit has no 'contents' (keys: {sorted(document)})")
        if not all(isinstance(part, str | None) for part in (title, text)):
            raise ValueError("a retrieval hit's 'title' and 'text' must be strings")
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
