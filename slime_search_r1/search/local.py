"""SEARCH_BACKEND=local: Search-R1's /retrieve API (local_dense_retriever/retrieval_server.py or Search-R1's own), and
ASearcher's /access on the same servers (the access tool's pages)."""

import itertools
from collections.abc import Callable

from slime_search_r1.http_client import RequestFailed, post_json, retrying, unbounded_session
from slime_search_r1.search.results import answer_byte_limit

# A page answer may weigh this much: ASearcher shows at most 250,000 characters of a page, and the observation is
# cut to max_page_tokens anyway; a server's --max_response_mb (16 by default) bounds it too.
PAGE_ANSWER_BYTES = 8 * 1024 * 1024


def access_url(retrieve_url: str) -> str:
    """The /access endpoint of the server whose /retrieve endpoint this is."""
    return retrieve_url.removesuffix("/retrieve").rstrip("/") + "/access"


class LocalRetrieverClient:
    """Single-query /retrieve (and single-URL /access) calls spread round-robin over one or more servers; a retry
    moves to the next one."""

    def __init__(self, urls: tuple[str, ...], *, timeout: float, max_attempts: int, proxy: str | None = None):
        if not urls:
            raise ValueError("LocalRetrieverClient needs at least one URL")
        self.urls = urls
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.proxy = proxy
        self._next_url = itertools.cycle(range(len(urls)))

    async def _post(self, payload: dict, limit: int, endpoint, give_up) -> tuple[object, str]:
        session = unbounded_session("local-retriever")  # pooled per loop; bounded by the caller's semaphore
        async for attempt in retrying(self.max_attempts, give_up=give_up):
            with attempt:
                url = endpoint(self.urls[next(self._next_url)])
                body = await post_json(session, url, payload, self.timeout, max_body_bytes=limit, proxy=self.proxy)
        return body, url

    async def search(self, query: str, topk: int, give_up: Callable[[], bool] | None = None) -> list:
        """The hits of one query, as the server sent them; `give_up()` true stops retrying."""
        payload = {"queries": [query], "topk": topk, "return_scores": False}
        body, url = await self._post(payload, answer_byte_limit(topk), lambda retrieve: retrieve, give_up)
        return _first_result(body, url)

    async def access(self, page_url: str, give_up: Callable[[], bool] | None = None) -> dict | None:
        """The page at `page_url` as the server stores it, or None when it has none."""
        body, url = await self._post({"urls": [page_url]}, PAGE_ANSWER_BYTES, access_url, give_up)
        result = body.get("result") if isinstance(body, dict) else None
        page = result[0] if isinstance(result, list) and len(result) == 1 else False
        if page is not None and not isinstance(page, dict):
            raise RequestFailed(f"{url} answered without a usable 'result' list (one page or null per URL)")
        return page


def _first_result(body: object, url: str) -> list:
    """The hit list of the one query sent: body["result"][0]."""
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list) or not result or not isinstance(result[0], list):
        raise RequestFailed(f"{url} answered without a usable 'result' list (a list of hit lists, one per query)")
    return result[0]


_clients: dict[tuple, LocalRetrieverClient] = {}


def client_for(config) -> LocalRetrieverClient:
    """One client per setting, so that its round-robin position persists across calls."""
    key = (config.local.search_url, config.search_timeout, config.search_attempts, config.local.proxy)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = LocalRetrieverClient(
            config.local.search_url,
            timeout=config.search_timeout,
            max_attempts=config.search_attempts,
            proxy=config.local.proxy,
        )
    return client


async def search(config, query: str, give_up: Callable[[], bool] | None = None) -> list:
    """The top-k hits for `query` from the configured servers."""
    return await client_for(config).search(query, config.topk, give_up=give_up)


async def access(config, page_url: str, give_up: Callable[[], bool] | None = None) -> dict | None:
    """The page at `page_url` from the configured servers' /access (started with --pages_path), or None."""
    return await client_for(config).access(page_url, give_up=give_up)
