"""Dynamic cross-request batching: concurrent requests share one encoder forward pass and one index search.

Requests wait in a queue; a single worker thread builds each batch of at most `max_batch_size` queries by fair
share over every request waiting (a large request is split into slices and interleaved with the others, so a
single query sent while a 512-query request is in flight waits about one batch, not the whole request), runs it,
and hands each request its rows once all its slices are done. While a batch runs, the next one accumulates, so
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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

logger = logging.getLogger(__name__)

SearchFn = Callable[[list[str], int], tuple[np.ndarray, np.ndarray]]


class BatcherClosed(RuntimeError):
    """The batcher was closed (the server is shutting down) before this request was answered."""


@dataclass(eq=False)
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    next_query: int = 0  # queries before this one are in a batch already
    scores: list[np.ndarray] = field(default_factory=list)  # one slice per batch this request was part of
    rows: list[np.ndarray] = field(default_factory=list)
    abandoned: bool = False  # the caller stopped waiting (client gone, shutdown): run none of its other queries

    @property
    def unbatched(self) -> int:
        return len(self.queries) - self.next_query


@dataclass
class _Slice:
    request: _Pending
    start: int
    end: int


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


def _send(item: _Pending, result=None, error: BaseException | None = None) -> None:
    try:
        item.loop.call_soon_threadsafe(_deliver, item.future, result, error)
    except RuntimeError:  # its event loop is closed: nobody is waiting any more
        pass


class DynamicBatcher:
    def __init__(self, search: SearchFn, max_batch_size: int = 64, max_wait_ms: float = 0.0):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self._search = search
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.stats = BatcherStats()
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._waiting: deque[_Pending] = deque()  # requests with queries not yet in a batch, in serving order
        self._last_batch_size = 0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="retrieval-worker", daemon=True)
        self._thread.start()

    async def submit(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and rows, (len(queries), topk) each, for one request's queries."""
        if self._closing:
            raise BatcherClosed("the retriever is shutting down")
        loop = asyncio.get_running_loop()
        pending = _Pending(queries, topk, loop.create_future(), loop)
        self._queue.put(pending)
        try:
            return await pending.future
        except asyncio.CancelledError:
            pending.abandoned = True
            raise

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the batch in progress; requests still waiting fail with BatcherClosed instead of running."""
        self._closing = True
        self._queue.put(None)
        self._thread.join(timeout)
        if not self._thread.is_alive():  # else the worker fails them itself once its batch is done
            self._fail_waiting()  # anything submitted while the worker was stopping

    def _collect(self) -> bool:
        """Move queued requests to the waiting list (blocking while there are none); False once closing."""
        if self._closing:
            return False
        if not self._waiting:
            item = self._queue.get()
            if item is None:
                return False
            self._waiting.append(item)
        # Waiting only pays when more requests are due: the clients answered by the last batch tend to come
        # straight back, so wait (at most max_wait) until that many queries are here, and never when idle.
        expected = min(self.max_batch_size, max(1, self._last_batch_size))
        deadline = time.monotonic() + self.max_wait
        available = sum(item.unbatched for item in self._waiting)
        while True:
            remaining = deadline - time.monotonic() if available < expected else 0.0
            try:
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            self._waiting.append(item)
            available += item.unbatched

    def _next_batch(self) -> list[_Slice]:
        """Fair share of max_batch_size over the waiting requests: each gets an equal part, capped by what it has.

        Requests that got nothing (more requests than room) go first next time, then those with queries left.
        """
        waiting = [item for item in self._waiting if not item.abandoned]
        takes = dict.fromkeys(waiting, 0)
        room, open_ = self.max_batch_size, waiting
        while room and open_:
            share = max(1, room // len(open_))
            for item in open_:
                take = min(share, item.unbatched - takes[item], room)
                takes[item] += take
                room -= take
                if not room:
                    break
            open_ = [item for item in open_ if item.unbatched > takes[item]]
        batch = []
        for item in waiting:
            if takes[item]:
                batch.append(_Slice(item, item.next_query, item.next_query + takes[item]))
                item.next_query += takes[item]
        unserved = [item for item in waiting if not takes[item]]
        self._waiting = deque(unserved + [item for item in waiting if takes[item] and item.unbatched])
        return batch

    def _run(self) -> None:
        while self._collect():
            batch = self._next_batch()
            if batch:
                self._run_batch(batch)
        self._fail_waiting()

    def _run_batch(self, batch: list[_Slice]) -> None:
        queries = [query for part in batch for query in part.request.queries[part.start : part.end]]
        self._last_batch_size = len(queries)
        started = time.perf_counter()
        try:
            scores, rows = self._search(queries, max(part.request.topk for part in batch))
        except Exception as err:  # one bad batch must not stop the worker
            logger.exception("retrieval batch of %d queries failed", len(queries))
            self.stats.errors += 1
            for part in batch:
                part.request.abandoned = True  # its other slices would be wasted work
                _send(part.request, error=err)
            self._waiting = deque(item for item in self._waiting if not item.abandoned)
            return
        self._record(len(queries), time.perf_counter() - started)
        offset = 0
        for part in batch:
            request, size = part.request, part.end - part.start
            request.scores.append(scores[offset : offset + size, : request.topk])
            request.rows.append(rows[offset : offset + size, : request.topk])
            offset += size
            if part.end == len(request.queries):  # its last slice: slices run in order, so all are done
                _send(request, (np.concatenate(request.scores), np.concatenate(request.rows)))

    def _fail_waiting(self) -> None:
        error = BatcherClosed("the retriever is shutting down")
        while self._waiting:
            _send(self._waiting.popleft(), error=error)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                _send(item, error=error)

    def _record(self, size: int, seconds: float) -> None:
        stats = self.stats
        stats.batches += 1
        stats.queries += size
        stats.largest_batch = max(stats.largest_batch, size)
        stats.busy_seconds += seconds
        stats.slowest_batch_seconds = max(stats.slowest_batch_seconds, seconds)
