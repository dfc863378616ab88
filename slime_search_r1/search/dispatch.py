"""How a query becomes passages: the backend the `search_backend` setting names, bounded by search_concurrency, any
failure a SearchError.

A backend is registered by name in registry.SEARCH_BACKENDS ("local": search/local.py, "google": search/google.py;
a new one is one file and one register call). It takes (settings, query, give_up) and returns the top-k documents
in the retrieval API's shape, {"contents": "\"Title\"\\ntext", ...} (a "url" is shown when `access` is enabled).
"""

import logging
from collections.abc import Awaitable, Callable

from slime_search_r1.http_client import RequestFailed, loop_semaphore
from slime_search_r1.registry import SEARCH_BACKENDS
from slime_search_r1.search import local
from slime_search_r1.search.results import hit_document

logger = logging.getLogger(__name__)

SearchBackend = Callable[[object, str, Callable[[], bool] | None], Awaitable[list[dict]]]


class SearchError(RuntimeError):
    """The search backend failed for good: after its retries, or with an answer that cannot be used."""


class SearchAborted(SearchError):
    """The rollout was aborted while this search waited for its turn."""


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

    return await _guarded(config, f"{config.search_backend} search", documents, aborted)


async def access_page(config, url: str, aborted: Callable[[], bool] | None = None) -> dict | None:
    """The page at `url` from the local retriever's /access (ASearcher's), or None; SearchError when it fails for
    good. It shares the searches' bound (search_concurrency): the same servers answer both."""
    return await _guarded(config, "page access", lambda: local.access(config, url, aborted), aborted)


async def _guarded(config, what: str, call: Callable[[], Awaitable], aborted: Callable[[], bool] | None):
    try:
        async with loop_semaphore("search", config.search_concurrency):
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
