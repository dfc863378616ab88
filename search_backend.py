"""The tool behind <search>: one query in, passage contents out, bounded by search_concurrency."""

from collections.abc import Callable

from async_http import RequestFailed, loop_semaphore
from google_search_server import google_search
from local_search_client import LocalRetrieverClient
from search_r1_config import SearchR1Config
from search_results import hit_contents

_local_clients: dict[tuple, LocalRetrieverClient] = {}


class SearchError(RuntimeError):
    """The search backend failed for good: after its retries, or with an answer that cannot be used."""


class SearchAborted(SearchError):
    """The rollout was aborted while this search waited for its turn."""


def _local_client(config: SearchR1Config) -> LocalRetrieverClient:
    # Keep one client per setting so its round-robin position persists across calls.
    key = (config.local.urls, config.search_timeout, config.search_max_retries, config.local.proxy)
    client = _local_clients.get(key)
    if client is None:
        client = _local_clients[key] = LocalRetrieverClient(
            config.local.urls,
            timeout=config.search_timeout,
            max_attempts=config.search_max_retries,
            proxy=config.local.proxy,
        )
    return client


async def search(config: SearchR1Config, query: str, aborted: Callable[[], bool] | None = None) -> list[str]:
    """Contents of the top-k passages; raises SearchError when the backend fails for good.

    `aborted()` turning true (slime's abort) skips a search still waiting for a slot and stops retrying,
    so an abort is not held up by a slow or down search backend.
    """
    try:
        async with loop_semaphore("search", config.search_concurrency):
            if aborted is not None and aborted():
                raise SearchAborted("the rollout was aborted before this search ran")
            return await _search(config, query, aborted)
    except SearchError:
        raise
    except (RequestFailed, ValueError) as exc:
        raise SearchError(str(exc)) from exc
    except Exception as exc:
        # Whatever a backend or its parsing raises fails this sample, never the batch. CancelledError is not an
        # Exception (it propagates); the type is kept because an unexpected error's message alone may be bare.
        raise SearchError(f"{config.search_backend} search failed: {type(exc).__name__}: {str(exc)[:300]}") from exc


async def _search(config: SearchR1Config, query: str, aborted: Callable[[], bool] | None) -> list[str]:
    if config.search_backend == "local":
        return await _local_client(config).search(query, config.topk, give_up=aborted)
    hits = await google_search(
        config.google.api_key,
        query,
        config.topk,
        timeout=config.search_timeout,
        proxy=config.google.proxy,
        snippet_only=config.google.snippet_only,
        search_url=config.google.search_url,
        max_attempts=config.search_max_retries,
        fetch_concurrency=config.google.fetch_concurrency,
        give_up=aborted,
    )
    return [hit_contents(hit) for hit in hits]
