"""Retrieval hits as documents, and documents as the text Search-R1 shows the model."""

from collections.abc import Iterable, Mapping
from typing import Any

# What one search answer may weigh, per request. A wiki-18 hit is ~0.7 KB of JSON; 64 KiB a hit leaves room for
# long-document corpora and \\u-escaped text, and is far more than one observation shows (max_obs_tokens, 500 by
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


def hit_document(hit: Mapping[str, Any]) -> dict:
    """A hit in either server shape ({"document": {...}, "score": s} or the document itself) as a document with a
    string "contents" (built from "title" and "text" when a server sends those) and every other field kept."""
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
    url = document.get("url")
    return {**document, "contents": contents, "url": url if isinstance(url, str) and url else None}


def format_documents(documents: Iterable[Mapping[str, Any]], with_urls: bool = False) -> str:
    """Search-R1's passages2string: `Doc i(Title: <first line>) <rest>` per document, i from 1; with `with_urls`
    (the access tool is enabled), `Doc i(Title: ...)(URL: ...)` for documents that have one."""
    lines = []
    for index, document in enumerate(documents, start=1):
        title, _, text = document["contents"].partition("\n")
        url = f"(URL: {document['url']})" if with_urls and document.get("url") else ""
        lines.append(f"Doc {index}(Title: {title}){url} {text}\n")
    return "".join(lines)
