"""A real retrieval app whose batches pass through a gate the test opens: which batch holds which query, and what
is queued while a batch runs, are then decided by events, not by how fast the machine is."""

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np

from local_dense_retriever.serving.app import create_app
from local_dense_retriever.serving.batcher import DynamicBatcher
from local_dense_retriever.serving.loading import Resources, load_resources
from support.loopback import serve_in_thread
from support.retriever_fixtures import SmallWiki, dense_config, wait_ready


class BatchGate:
    """Wraps the searcher: lets `open_batches` batches through, then holds the next one until `release()`; records
    each batch's queries."""

    def __init__(self, search, open_batches: int):
        self._search = search
        self.open_batches = open_batches
        self.batches: list[list[str]] = []
        self.holding = threading.Event()
        self._released = threading.Event()

    def __call__(self, queries: list[str], topk: int):
        self.batches.append(list(queries))
        if len(self.batches) == self.open_batches + 1:
            self.holding.set()
            assert self._released.wait(60), "the test never released the held batch"
        return self._search(queries, topk)

    def release(self) -> None:
        self._released.set()


def first_rows(queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
    """A search that costs nothing: rows 0..topk-1 for every query (for tests of ordering, not of relevance)."""
    rows = np.tile(np.arange(topk, dtype=np.int64), (len(queries), 1))
    return np.zeros(rows.shape, dtype=np.float32), rows


@contextlib.contextmanager
def gated_server(
    small_wiki: SmallWiki,
    open_batches: int,
    max_batch_size: int = 4,
    search: Callable | None = None,
    **config,
) -> Iterator[tuple[str, BatchGate]]:
    """A server on one worker whose searches (the real searcher's, or `search`) pass through a BatchGate; its
    batches are bounded as the server's (max_batch_size, and the tokens of --max_batch_tokens or its default)."""
    config = dense_config(small_wiki, max_batch_size=max_batch_size, **config)
    gates: list[BatchGate] = []

    def load(report) -> Resources:
        resources = load_resources(config, report)
        resources.batcher.close()
        gates.append(BatchGate(search or resources.searcher.search, open_batches))
        batcher = DynamicBatcher(
            gates[0], max_batch_size=max_batch_size, max_batch_tokens=resources.batcher.max_batch_tokens
        )
        return dataclasses.replace(resources, batcher=batcher, thread_tuner=None)

    with serve_in_thread(create_app(config, load=load)) as url:
        wait_ready(url)
        try:
            yield url, gates[0]
        finally:
            gates[0].release()


def health(url: str) -> dict:
    return httpx.get(f"{url}/health", timeout=30).json()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Until `condition()` (a /health counter, usually) holds; the timeout only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)
