"""Client for local retrieval servers (local_dense_retriever/retrieval_server.py or Search-R1's own)."""

import itertools
from collections.abc import Callable

import aiohttp

from async_http import RequestFailed, post_json, retrying, unbounded_session
from search_results import hit_contents


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

    def _session(self) -> aiohttp.ClientSession:
        return unbounded_session("local-retriever")  # pooled per loop; bounded by the caller's semaphore

    async def search(self, query: str, topk: int, give_up: Callable[[], bool] | None = None) -> list[str]:
        """The contents of the top-k passages for one query; `give_up()` true stops retrying."""
        payload = {"queries": [query], "topk": topk, "return_scores": False}
        async for attempt in retrying(self.max_attempts, give_up=give_up):
            with attempt:
                url = self.urls[next(self._next_url)]
                body = await post_json(self._session(), url, payload, self.timeout, proxy=self.proxy)
        return _first_result(body, url)


def _first_result(body: object, url: str) -> list[str]:
    try:
        hits = body["result"][0]
        return [hit_contents(hit) for hit in hits]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise RequestFailed(f"{url} answered without a usable 'result' list: {exc!r}") from exc
