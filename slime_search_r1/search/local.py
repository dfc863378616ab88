"""SEARCH_BACKEND=local: Search-R1's /retrieve API (local_dense_retriever/retrieval_server.py or Search-R1's own)."""

import itertools
import logging
from collections.abc import Callable

import aiohttp

from slime_search_r1.config import SearchR1Config
from slime_search_r1.http import RequestFailed, post_json, retrying, unbounded_session
from slime_search_r1.search.results import answer_byte_limit, hit_contents

logger = logging.getLogger(__name__)


class LocalRetrieverClient:
    """Single-query /retrieve calls spread round-robin over one or more servers; a retry moves to the next one."""

    def __init__(self, urls: tuple[str, ...], *, timeout: float, max_attempts: int, proxy: str | None = None):
        if not urls:
            raise ValueError("LocalRetrieverClient needs at least one URL")
        self.urls = urls
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.proxy = proxy
        self._next_url = itertools.cycle(range(len(urls)))
        self._warned_extra_hits = False

    def _session(self) -> aiohttp.ClientSession:
        return unbounded_session("local-retriever")  # pooled per loop; bounded by the caller's semaphore

    async def search(self, query: str, topk: int, give_up: Callable[[], bool] | None = None) -> list[str]:
        """The contents of the top-k passages for one query; `give_up()` true stops retrying."""
        payload = {"queries": [query], "topk": topk, "return_scores": False}
        limit = answer_byte_limit(topk)
        async for attempt in retrying(self.max_attempts, give_up=give_up):
            with attempt:
                url = self.urls[next(self._next_url)]
                body = await post_json(
                    self._session(), url, payload, self.timeout, max_body_bytes=limit, proxy=self.proxy
                )
        hits = _first_result(body, url)
        if len(hits) > topk:
            # Dropped, not refused: a server that ignores `topk` (answers its own default) still ranks best
            # first, so its first k hits are the answer; the rest would only be cut from the observation.
            if not self._warned_extra_hits:
                self._warned_extra_hits = True
                logger.warning(
                    "%s answered %d hits for topk %d; only the first %d are used", url, len(hits), topk, topk
                )
            hits = hits[:topk]
        try:
            return [hit_contents(hit) for hit in hits]
        except ValueError as exc:
            raise RequestFailed(f"{url} answered without a usable 'result' list: {exc}") from exc


def _first_result(body: object, url: str) -> list:
    """The hit list of the one query sent: body["result"][0]."""
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list) or not result or not isinstance(result[0], list):
        raise RequestFailed(f"{url} answered without a usable 'result' list (a list of hit lists, one per query)")
    return result[0]


_clients: dict[tuple, LocalRetrieverClient] = {}


async def search(config: SearchR1Config, query: str, give_up: Callable[[], bool] | None = None) -> list[str]:
    """The contents of the top-k passages for `query` from the configured servers."""
    # One client per setting, so that its round-robin position persists across calls.
    key = (config.local.urls, config.search_timeout, config.search_attempts, config.local.proxy)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = LocalRetrieverClient(
            config.local.urls,
            timeout=config.search_timeout,
            max_attempts=config.search_attempts,
            proxy=config.local.proxy,
        )
    return await client.search(query, config.topk, give_up=give_up)
