"""Dynamic cross-request batching: concurrent requests share one encoder forward pass and one index search.

Requests wait in a FIFO queue; a single worker thread takes everything queued (up to `max_batch_size` queries),
runs the batch, and hands each request its slice of the result. While a batch runs, the next one accumulates, so
batches grow with load. With `max_wait_ms` > 0 the worker may also wait that long for the batch to reach the size
of the previous one (the clients it just answered are likely to return at once); it never waits when idle.
One worker, not a pool: the fast tokenizer and FAISS GPU indexes are not thread-safe, and on CPU one batch
already uses every core. The event loop only enqueues and awaits, so it stays free to accept requests.
"""

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

SearchFn = Callable[[list[str], int], tuple[np.ndarray, np.ndarray]]


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class BatcherStats:
    batches: int = 0
    queries: int = 0
    largest_batch: int = 0
    busy_seconds: float = 0.0
    slowest_batch_seconds: float = 0.0
    errors: int = 0

    def as_dict(self) -> dict:
        return {
            "batches": self.batches,
            "queries": self.queries,
            "mean_batch_size": round(self.queries / self.batches, 2) if self.batches else 0.0,
            "largest_batch": self.largest_batch,
            "busy_seconds": round(self.busy_seconds, 3),
            "slowest_batch_seconds": round(self.slowest_batch_seconds, 3),
            "errors": self.errors,
        }


def _deliver(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    if future.done():  # the client went away and its request was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class DynamicBatcher:
    def __init__(self, search: SearchFn, max_batch_size: int = 64, max_wait_ms: float = 0.0):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self._search = search
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.stats = BatcherStats()
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._carry: _Pending | None = None  # a request that did not fit in the previous batch goes first next time
        self._last_batch_size = 0
        self._thread = threading.Thread(target=self._run, name="retrieval-worker", daemon=True)
        self._thread.start()

    async def submit(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and rows, (len(queries), topk) each, for one request's queries."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Pending(queries, topk, future, loop))
        return await future

    def close(self, timeout: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _next_batch(self) -> list[_Pending] | None:
        first = self._carry if self._carry is not None else self._queue.get()
        self._carry = None
        if first is None:
            return None
        batch, size = [first], len(first.queries)
        # Waiting only pays when more requests are due: the clients answered by the last batch tend to come
        # straight back, so wait (at most max_wait) until that many queries are here, and never when idle.
        expected = min(self.max_batch_size, max(1, self._last_batch_size))
        deadline = time.monotonic() + self.max_wait
        while size < self.max_batch_size:
            try:
                remaining = deadline - time.monotonic() if size < expected else 0.0
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # finish this batch, then stop
                break
            if size + len(item.queries) > self.max_batch_size:
                self._carry = item
                break
            batch.append(item)
            size += len(item.queries)
        return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            queries = [query for item in batch for query in item.queries]
            self._last_batch_size = len(queries)
            started = time.perf_counter()
            try:
                scores, rows = self._search(queries, max(item.topk for item in batch))
            except Exception as err:  # one bad batch must not stop the worker
                logger.exception("retrieval batch of %d queries failed", len(queries))
                self.stats.errors += 1
                for item in batch:
                    item.loop.call_soon_threadsafe(_deliver, item.future, None, err)
                continue
            self._record(len(queries), time.perf_counter() - started)
            start = 0
            for item in batch:
                end = start + len(item.queries)
                result = (scores[start:end, : item.topk], rows[start:end, : item.topk])
                item.loop.call_soon_threadsafe(_deliver, item.future, result)
                start = end

    def _record(self, size: int, seconds: float) -> None:
        stats = self.stats
        stats.batches += 1
        stats.queries += size
        stats.largest_batch = max(stats.largest_batch, size)
        stats.busy_seconds += seconds
        stats.slowest_batch_seconds = max(stats.slowest_batch_seconds, seconds)
