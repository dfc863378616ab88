"""How a query becomes passages: the configured backend, bounded by search_concurrency, any failure a SearchError.

Backends are registered by name: "local" (search/local.py) here; generate_with_search.py registers "google"
(google_search_server.py, serper.dev). A backend takes (config, query, give_up) and returns passage contents.
"""

from collections.abc import Awaitable, Callable

from slime_search_r1.config import ConfigError, SearchR1Config
from slime_search_r1.http import RequestFailed, loop_semaphore
from slime_search_r1.search import local

SearchBackend = Callable[[SearchR1Config, str, Callable[[], bool] | None], Awaitable[list[str]]]
_backends: dict[str, SearchBackend] = {"local": local.search}


class SearchError(RuntimeError):
    """The search backend failed for good: after its retries, or with an answer that cannot be used."""


class SearchAborted(SearchError):
    """The rollout was aborted while this search waited for its turn."""


def register_search_backend(name: str, backend: SearchBackend) -> None:
    """SEARCH_BACKEND=`name` calls `backend`."""
    _backends[name] = backend


async def search(config: SearchR1Config, query: str, aborted: Callable[[], bool] | None = None) -> list[str]:
    """Contents of the top-k passages; raises SearchError when the backend fails for good.

    `aborted()` turning true (slime's abort) skips a search still waiting for a slot and stops retrying,
    so an abort is not held up by a slow or down search backend.
    """
    backend = _backends.get(config.search_backend)
    if backend is None:
        raise ConfigError(
            f"SEARCH_BACKEND={config.search_backend} has no registered backend (registered: {sorted(_backends)})"
        )
    try:
        async with loop_semaphore("search", config.search_concurrency):
            if aborted is not None and aborted():
                raise SearchAborted("the rollout was aborted before this search ran")
            return await backend(config, query, aborted)
    except SearchError:
        raise
    except (RequestFailed, ValueError) as exc:
        raise SearchError(str(exc)) from exc
    except Exception as exc:
        # Whatever a backend or its parsing raises fails this sample, never the batch. CancelledError is not an
        # Exception (it propagates); the type is kept because an unexpected error's message alone may be bare.
        raise SearchError(f"{config.search_backend} search failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
