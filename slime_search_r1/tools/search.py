"""`search`: Search-R1's tool, the backends that answer it, and the text it shows.

The model writes `<search> query </search>` (XML) or calls search(query) (chat), and is shown the top passages of
the backend the `search_backend` setting names, as Search-R1 formats them (`Doc 1(Title: ...) ...`):

  SEARCH, run_search        the tool: its arguments, its run (every query at once), its observation budget
  search()                  one query to the top-k documents, SEARCH_CONCURRENCY at once, any failure a SearchError
  local_search              SEARCH_BACKEND=local: Search-R1's /retrieve API over one or more servers, round-robin
                            (local_dense_retriever/retrieval_server.py, or Search-R1's own); google: search/google.py
  format_documents          documents as Search-R1's passages2string writes them

A backend takes (settings, query, give_up) and returns the top-k documents in the retrieval API's shape,
{"contents": "\"Title\"\\ntext", ...} (a "url" is shown when `access` is enabled); a new one is registered by name in
registry.SEARCH_BACKENDS (a file of your own and one register call).
"""

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from slime_search_r1.http_client import (
    RequestFailed,
    answer_byte_limit,
    loop_semaphore,
    post_json,
    retrying,
    unbounded_session,
)
from slime_search_r1.registry import SEARCH_BACKENDS
from slime_search_r1.tools.contract import Tool, ToolAborted, ToolError

logger = logging.getLogger(__name__)

MAX_QUERIES_PER_CALL = 5
# Searches (and the access tool's page reads) in flight per rollout process: every episode of a 256-sample batch.
SEARCH_CONCURRENCY = 256

SearchBackend = Callable[[object, str, Callable[[], bool] | None], Awaitable[list[dict]]]


class SearchError(RuntimeError):
    """The search backend failed for good: after its retries, or with an answer that cannot be used."""


class SearchAborted(SearchError):
    """The rollout was aborted while this search waited for its turn."""


# ---- the tool ---------------------------------------------------------------------------------------------------


def read_search_arguments(arguments: dict) -> dict:
    query = arguments.get("query")
    queries = [query] if isinstance(query, str) else query
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) and q.strip() for q in queries):
        raise ValueError("'query' must be a non-empty string or a list of non-empty strings")
    if len(queries) > MAX_QUERIES_PER_CALL:
        raise ValueError(f"at most {MAX_QUERIES_PER_CALL} queries per call")
    return {"queries": [q.strip() for q in queries]}


async def run_search(arguments: dict, state) -> str:
    """Search-R1's passages for every query, numbered across them; their URLs too when `access` can open them."""
    try:
        found = await asyncio.gather(
            *(search(state.config, query, lambda: state.aborted) for query in arguments["queries"])
        )
    except SearchAborted as exc:
        raise ToolAborted(str(exc)) from exc
    except SearchError as exc:
        raise ToolError(str(exc)) from exc
    documents = [document for hits in found for document in hits]
    return format_documents(documents, with_urls="access" in state.config.tools).strip()


SEARCH = Tool(
    name="search",
    description=(
        "Search Wikipedia and return the top passages. Give one query, or a list of queries to search several "
        "things at once."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {
                "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
                "description": "What to search for.",
            }
        },
        "required": ["query"],
    },
    read_arguments=read_search_arguments,
    run=run_search,
    usage='Call search with {"query": "..."}.',
    xml_argument="query",
    xml_usage="If I want to search, I should put the query between <search> and </search>.",
    observation_budget=lambda config: config.max_obs_tokens,  # Search-R1's max_obs_length
    retrieves=True,  # the retrieval bonus looks for a gold answer in its passages
)
SEARCH_SCHEMA = SEARCH.schema


# ---- one query through the configured backend -------------------------------------------------------------------


async def search(config, query: str, aborted: Callable[[], bool] | None = None) -> list[dict]:
    """The top-k documents for `query`; raises SearchError when the backend fails for good.

    `aborted()` turning true (slime's abort) skips a search still waiting for a slot and stops retrying,
    so an abort is not held up by a slow or down search backend.
    """
    backend: SearchBackend = SEARCH_BACKENDS.get(config.search_backend)

    async def documents() -> list[dict]:
        hits = await backend(config, query, aborted)
        if not isinstance(hits, list):
            raise ValueError(f"the backend answered {type(hits).__name__}, not a list of documents")
        if len(hits) > config.topk:
            # Dropped, not refused: a server that ignores `topk` (answers its own default) still ranks best
            # first, so its first k hits are the answer; the rest would only be cut from the observation.
            _warn_extra_hits(config.search_backend, len(hits), config.topk)
        return [hit_document(hit) for hit in hits[: config.topk]]

    return await guarded(config, f"{config.search_backend} search", documents, aborted)


async def guarded(config, what: str, call: Callable[[], Awaitable], aborted: Callable[[], bool] | None):
    """`call()` within the searches' bound (SEARCH_CONCURRENCY), skipped once `aborted()`, any failure a SearchError
    (the access tool's page reads share it: the same servers answer both)."""
    try:
        async with loop_semaphore("search", SEARCH_CONCURRENCY):
            if aborted is not None and aborted():
                raise SearchAborted(f"the rollout was aborted before this {what} ran")
            return await call()
    except SearchError:
        raise
    except (RequestFailed, ValueError) as exc:
        raise SearchError(str(exc)) from exc
    except Exception as exc:
        # Whatever a backend or its parsing raises fails this sample, never the batch. CancelledError is not an
        # Exception (it propagates); the type is kept because an unexpected error's message alone may be bare.
        raise SearchError(f"{what} failed: {type(exc).__name__}: {str(exc)[:300]}") from exc


_warned_extra_hits: set[str] = set()


def _warn_extra_hits(backend: str, hits: int, topk: int) -> None:
    if backend not in _warned_extra_hits:
        _warned_extra_hits.add(backend)
        logger.warning(
            "the %s search backend answered %d hits for topk %d; only the first %d are used", backend, hits, topk, topk
        )


# ---- SEARCH_BACKEND=local: Search-R1's /retrieve API ------------------------------------------------------------


class LocalRetrieverClient:
    """Single-query /retrieve calls (and the access tool's single-URL /access calls) spread round-robin over one or
    more servers; a retry moves to the next one."""

    def __init__(self, urls: tuple[str, ...], *, timeout: float, max_attempts: int):
        if not urls:
            raise ValueError("LocalRetrieverClient needs at least one URL")
        self.urls = urls
        self.timeout = timeout
        self.max_attempts = max_attempts
        self._next_url = itertools.cycle(range(len(urls)))

    async def post(
        self, payload: dict, limit: int, endpoint: Callable[[str], str], give_up: Callable[[], bool] | None
    ) -> tuple[object, str]:
        """(the answer, the URL that gave it) of `payload` posted to `endpoint(a /retrieve URL)`, the answer at most
        `limit` bytes."""
        session = unbounded_session("local-retriever")  # pooled per loop; bounded by the caller's semaphore
        async for attempt in retrying(self.max_attempts, give_up=give_up):
            with attempt:
                url = endpoint(self.urls[next(self._next_url)])
                body = await post_json(session, url, payload, self.timeout, max_body_bytes=limit)
        return body, url

    async def search(self, query: str, topk: int, give_up: Callable[[], bool] | None = None) -> list:
        """The hits of one query, as the server sent them; `give_up()` true stops retrying."""
        payload = {"queries": [query], "topk": topk, "return_scores": False}
        body, url = await self.post(payload, answer_byte_limit(topk), lambda retrieve: retrieve, give_up)
        result = body.get("result") if isinstance(body, dict) else None  # one hit list per query sent
        if not isinstance(result, list) or not result or not isinstance(result[0], list):
            raise RequestFailed(f"{url} answered without a usable 'result' list (a list of hit lists, one per query)")
        return result[0]


_clients: dict[tuple, LocalRetrieverClient] = {}


def client_for(config) -> LocalRetrieverClient:
    """One client per setting, so that its round-robin position persists across calls."""
    key = (config.local.search_url, config.search_timeout, config.search_attempts)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = LocalRetrieverClient(
            config.local.search_url, timeout=config.search_timeout, max_attempts=config.search_attempts
        )
    return client


async def local_search(config, query: str, give_up: Callable[[], bool] | None = None) -> list:
    """The top-k hits for `query` from the configured servers."""
    return await client_for(config).search(query, config.topk, give_up=give_up)


# ---- documents, and documents as the text Search-R1 shows -------------------------------------------------------


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
