"""Google search through serper.dev (SEARCH_BACKEND=google), returning hits in the retrieval server's document shape.

Snippet-only by default; with snippet_only=False each result page is fetched (bounded concurrency,
short timeout, at most PAGE_MAX_BYTES read), decoded with its declared charset or chardet, stripped to text,
and the paragraphs that contain the snippet's sentences are kept. A page that cannot be fetched or parsed
falls back to its snippet. The API key travels only in the request header, and is blanked out of any error
message (an error body could echo it): it never appears in a message or a log line.
"""

import asyncio
import html
import logging
from collections.abc import Callable
from html.parser import HTMLParser

import aiohttp
import chardet

from slime_search_r1.http_client import (
    RequestFailed,
    answer_byte_limit,
    loop_semaphore,
    loop_session,
    post_json,
    read_prefix,
    retrying,
)

logger = logging.getLogger(__name__)

SERPER_URL = "https://google.serper.dev/search"
PAGE_TIMEOUT_S = 5.0
PAGE_FETCH_CONCURRENCY = 8  # result pages fetched at once (snippet_only=False), per rollout process
# Pages are cut here: most HTML pages are well under 1 MB, the snippet's paragraph sits near the top of a long
# one, and HTMLParser costs ~0.2 s of CPU per MB (so a cut page costs at most ~0.4 s).
PAGE_MAX_BYTES = 2 * 1024 * 1024
_CHARDET_SAMPLE_BYTES = 64 * 1024
_SKIPPED_TAGS = {"script", "style", "noscript", "head", "svg", "template"}
_BLOCK_TAGS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "td", "pre"}


def snippet_sentences(snippet: str) -> list[str]:
    """Serper snippets join fragments with '...'; keep fragments of more than five words."""
    return [part.strip() for part in snippet.split("...") if len(part.split()) > 5]


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIPPED_TAGS:
            self._skip_depth += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in _SKIPPED_TAGS and self._skip_depth:
            self._skip_depth -= 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._skip_depth:
            self.parts.append(data)


def html_to_paragraphs(page: str) -> list[str]:
    extractor = _TextExtractor()
    extractor.feed(page)
    extractor.close()
    text = html.unescape("".join(extractor.parts))
    return [" ".join(line.split()) for line in text.split("\n") if line.strip()]


def decode_page(raw: bytes, declared_charset: str | None) -> str:
    if declared_charset:
        try:
            return raw.decode(declared_charset)
        except (LookupError, UnicodeDecodeError):
            pass
    encoding = chardet.detect(raw[:_CHARDET_SAMPLE_BYTES])["encoding"] or "utf-8"
    try:
        return raw.decode(encoding, errors="replace")
    except LookupError:
        return raw.decode("utf-8", errors="replace")


def _page_paragraphs(raw: bytes, declared_charset: str | None) -> list[str]:
    return html_to_paragraphs(decode_page(raw, declared_charset))


def page_context(snippet: str, paragraphs: list[str]) -> str:
    """The page's paragraphs that contain one of the snippet's sentences, in page order, once each."""
    sentences = snippet_sentences(snippet)
    kept = [para for para in paragraphs if any(sentence in para for sentence in sentences)]
    return "\n".join(dict.fromkeys(kept))


async def _fetch_page(session: aiohttp.ClientSession, url: str, semaphore: asyncio.Semaphore) -> list[str]:
    """The page's text paragraphs; none (so its snippet is used) when it cannot be fetched or parsed."""
    if not url:
        return []
    async with semaphore:
        try:
            timeout = aiohttp.ClientTimeout(total=PAGE_TIMEOUT_S)
            async with session.get(url, timeout=timeout, headers={"User-Agent": "Mozilla/5.0 (search-r1)"}) as resp:
                if resp.status >= 400 or "html" not in resp.headers.get("Content-Type", "text/html"):
                    return []
                raw = await read_prefix(resp, PAGE_MAX_BYTES)
                # charset detection and HTML parsing are CPU work: keep them off the rollout's event loop
                return await asyncio.to_thread(_page_paragraphs, raw, resp.charset)
        except Exception as exc:
            # Any failure, not only network ones: html.parser itself raises AssertionError on `<![ x` (Python
            # 3.11), and a page must never cost more than its snippet. CancelledError still propagates.
            logger.debug("page %s not used, its snippet is: %s: %s", url, type(exc).__name__, exc)
            return []


def _text(item: dict, key: str) -> str:
    """A result field that should be text; anything else (a number, a list, ...) reads as missing."""
    value = item.get(key)
    return value if isinstance(value, str) else ""


def _document(title: str, context: str, link: str) -> dict:
    contents = f'"{title or "No title."}"\n{context or "No snippet available."}'
    return {"document": {"contents": contents, "url": link} if link else {"contents": contents}}


async def google_search(
    api_key: str,
    query: str,
    top_k: int = 5,
    timeout: float = 30.0,
    proxy: str | None = None,
    snippet_only: bool = True,
    *,
    search_url: str = SERPER_URL,
    max_attempts: int = 3,
    fetch_concurrency: int = PAGE_FETCH_CONCURRENCY,
    give_up: Callable[[], bool] | None = None,
) -> list[dict]:
    """Top-k Google results for `query` as [{"document": {"contents": '"title"\\ncontext'}}, ...]."""
    if not api_key:
        raise RequestFailed("google search needs a serper.dev API key (GOOGLE_API_KEY)")
    session = loop_session("serper", aiohttp.ClientSession)
    payload = {"q": query, "num": top_k, "gl": "us", "hl": "en"}
    options = {"headers": {"X-API-KEY": api_key, "Content-Type": "application/json"}, "proxy": proxy}
    try:
        async for attempt in retrying(max_attempts, give_up=give_up):
            with attempt:
                body = await post_json(
                    session, search_url, payload, timeout, max_body_bytes=answer_byte_limit(top_k), **options
                )
    except RequestFailed as exc:
        # an error body (shown in the message) could echo the key: blank it out, keeping the error's class
        raise type(exc)(str(exc).replace(api_key, "<GOOGLE_API_KEY>")) from None
    if not isinstance(body, dict) or not isinstance(body.get("organic", []), list):
        raise RequestFailed(f"{search_url} answered without an 'organic' result list")
    items = [item for item in body.get("organic", []) if isinstance(item, dict)][:top_k]

    if snippet_only:
        contexts = [" ".join(snippet_sentences(_text(item, "snippet"))) for item in items]
    else:
        semaphore = loop_semaphore("page-fetch", fetch_concurrency)
        pages = await asyncio.gather(*(_fetch_page(session, _text(item, "link"), semaphore) for item in items))
        contexts = [
            page_context(_text(item, "snippet"), paragraphs) or " ".join(snippet_sentences(_text(item, "snippet")))
            for item, paragraphs in zip(items, pages, strict=True)
        ]
    return [
        _document(_text(item, "title"), context, _text(item, "link"))
        for item, context in zip(items, contexts, strict=True)
        if _text(item, "title") or context
    ]


async def search(config, query: str, give_up: Callable[[], bool] | None = None) -> list[dict]:
    """SEARCH_BACKEND=google: the top-k results for `query`."""
    return await google_search(
        config.google.api_key,
        query,
        config.topk,
        timeout=config.search_timeout,
        proxy=config.google.proxy,
        snippet_only=config.google.snippet_only,
        search_url=SERPER_URL,  # read here, not bound as the default: a test points it at a stand-in
        max_attempts=config.search_attempts,
        give_up=give_up,
    )
