"""Dynamic cross-request batching: concurrent requests share encoder forward passes and index searches, computed by
a few worker threads at once when the CPU layout says so.

Requests wait in a list; a free worker builds each batch of at most `max_batch_size` queries and `max_batch_tokens`
tokens (what the encoder encodes them at, counted when the request came in) by fair share over every request waiting
(batch_shares.py: a large request is split into slices and interleaved with the others, so a single query sent while
a 512-query request is in flight waits for at most the one batch running, not the whole request; long queries are
batched apart, in batches of a quarter of the token bound, so that batch is short), runs it, and hands each request
its rows once all its slices are done (slices of one request may finish out of order on different workers). While
batches run, the next ones accumulate, so batches grow with load. With `max_wait_ms` > 0 a worker may also wait that
long for its batch to reach the size of the previous one, in queries and in requests (the clients just answered are
likely to return at once, and a large request's queries must not start a batch without them); it never waits when
idle.

How many batches run at once, and on how many threads each, is the tuner's call (retrieval/cpu_threads.py): one
batch on every CPU while that is fastest, or one single-threaded batch per worker, so no OpenMP barrier waits on a
core another process holds. A worker asks it before each batch; when more batches may run at once, the waiting
queries are shared out in proportion to each worker's measured speed, so that their batches end together (beside a
busy process the worker that shares its core runs at about half speed). Each worker has its own search function (its
own tokenizer: a fast tokenizer shared across threads has returned wrong ids here). GPU searchers keep one worker.
The event loop only enqueues and awaits, so it stays free to accept requests.
"""

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from local_dense_retriever.retrieval.cpu_threads import Layout, ThreadTuner
from local_dense_retriever.serving.batch_shares import share_batch

logger = logging.getLogger(__name__)

SearchFn = Callable[[list[str], int], tuple[np.ndarray, np.ndarray]]


class BatcherClosed(RuntimeError):
    """The batcher was closed (the server is shutting down) before this request was answered."""


@dataclass(eq=False)
class _Pending:
    queries: list[str]
    tokens: Sequence[int] | None  # what the encoder encodes each query at (None: not counted, each costs nothing)
    topk: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    next_query: int = 0  # queries before this one are in a batch already
    answered: int = 0  # queries whose rows are in `scores` and `rows`
    scores: np.ndarray | None = None  # (len(queries), topk), filled slice by slice
    rows: np.ndarray | None = None
    abandoned: bool = False  # the caller stopped waiting (client gone, shutdown): run none of its other queries

    @property
    def unbatched(self) -> int:
        return len(self.queries) - self.next_query

    def cost(self, query: int) -> int:
        return 0 if self.tokens is None else self.tokens[query]


@dataclass
class _Slice:
    request: _Pending
    start: int
    end: int


@dataclass
class BatcherStats:
    batches: int = 0
    queries: int = 0
    tokens: int = 0  # of the queries batched, as counted when their requests came in
    largest_batch: int = 0
    largest_batch_tokens: int = 0
    busy_seconds: float = 0.0  # summed over the workers
    slowest_batch_seconds: float = 0.0
    errors: int = 0
    abandoned_requests: int = 0  # their caller stopped waiting (client gone, shutdown) before the answer
    refill_waits: int = 0  # batches that waited (up to max_wait_ms) for the clients just answered to come back

    def as_dict(self) -> dict:
        """The counts, seconds rounded to the millisecond, and the mean batch size (0 before the first batch)."""
        mean = round(self.queries / self.batches, 2) if self.batches else 0.0
        seconds = {
            "busy_seconds": round(self.busy_seconds, 3),
            "slowest_batch_seconds": round(self.slowest_batch_seconds, 3),
        }
        return {**asdict(self), **seconds, "mean_batch_size": mean}


# The weight of a worker's latest batch in its speed (an exponential average of seconds per query): a neighbour that
# comes or goes shows within a few batches, one odd batch does not.
SPEED_WEIGHT = 0.3


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


def _leave(threads: int) -> None:
    """Pools left as they are (a batcher built without a tuner)."""


class DynamicBatcher:
    """`search`: one search function per worker thread (or one function: one worker). `max_batch_tokens`: the most
    tokens a batch may hold, over the counts submit() is given (None: no bound); a single query over it runs in a
    batch of its own. `tuner`: when batches may start and on how many threads (default: as many batches at once as
    workers, pools left alone). `clock`: what max_wait_ms and the workers' speeds are measured on. `speed_shares`:
    share the queries between workers by their measured speed (False: equal shares, which the load benchmark's
    `even` mode compares against)."""

    def __init__(
        self,
        search: SearchFn | Sequence[SearchFn],
        max_batch_size: int = 64,
        max_wait_ms: float = 0.0,
        max_batch_tokens: int | None = None,
        tuner: ThreadTuner | None = None,
        clock: Callable[[], float] = time.monotonic,
        speed_shares: bool = True,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be at least 1, got {max_batch_tokens}")
        searches = [search] if callable(search) else list(search)
        self.tuner = tuner or ThreadTuner(1, fixed=Layout(threads=1, batches=len(searches)), set_threads=_leave)
        if len(searches) < self.tuner.workers:
            raise ValueError(f"the tuner runs {self.tuner.workers} batches at once; got {len(searches)} searches")
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000.0
        self.speed_shares = speed_shares
        self.stats = BatcherStats()
        self._clock = clock
        self._lock = threading.Condition()
        self._waiting: deque[_Pending] = deque()  # requests with queries not yet in a batch, in serving order
        self._running = 0  # batches being computed
        self._last_batch_size = 0  # queries
        self._last_batch_requests = 0  # requests it held a slice of
        self._last_batch_long = False  # it held long queries (_next_batch)
        self._closing = False
        self.stopping = threading.Event()  # set once close() began: requests still waiting will fail
        workers = range(self.tuner.workers)
        self._idle = set(workers)  # workers not computing a batch
        self._seconds_per_query: list[float | None] = [None for _ in workers]  # measured in single-threaded batches
        self._threads = [
            threading.Thread(target=self._run, args=(fn, i), name=f"retrieval-worker-{i}", daemon=True)
            for i, fn in zip(workers, searches, strict=False)
        ]
        if len(self._threads) == 1:
            self._threads[0].name = "retrieval-worker"
        for thread in self._threads:
            thread.start()

    @property
    def workers(self) -> int:
        return len(self._threads)

    async def submit(
        self, queries: list[str], topk: int, tokens: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Scores and rows, (len(queries), topk) each, for one request's queries; `tokens`: what the encoder encodes
        each query at, for max_batch_tokens."""
        if tokens is not None and len(tokens) != len(queries):
            raise ValueError(f"{len(tokens)} token counts for {len(queries)} queries")
        if not queries:  # no batch would ever hold it
            return np.empty((0, topk), dtype=np.float32), np.empty((0, topk), dtype=np.int64)
        loop = asyncio.get_running_loop()
        pending = _Pending(queries, tokens, topk, loop.create_future(), loop)
        with self._lock:
            if self._closing:
                raise BatcherClosed("the retriever is shutting down")
            self._waiting.append(pending)
            self._lock.notify()
        try:
            return await pending.future
        except asyncio.CancelledError:
            with self._lock:
                pending.abandoned = True
                self.stats.abandoned_requests += 1
            raise

    def report(self) -> dict:
        """The counters, plus what is queued and running now, and each worker's speed relative to the fastest."""
        with self._lock:
            waiting = sum(item.unbatched for item in self._waiting if not item.abandoned)
            return {
                **self.stats.as_dict(),
                "waiting_queries": waiting,
                "running_batches": self._running,
                "worker_speeds": [round(speed, 2) for speed in self._relative_speeds()],
            }

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the batches in progress; requests still waiting fail with BatcherClosed instead of running."""
        with self._lock:
            self._closing = True
            self.stopping.set()
            self._lock.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:  # anything submitted while the workers were stopping (a busy one fails them itself later)
            self._fail_waiting()

    def _run(self, search: SearchFn, worker: int) -> None:
        while True:
            with self._lock:
                taken = self._take(worker)
                if taken is None:
                    self._fail_waiting()
                    return
            self._run_batch(search, worker, *taken)

    def _take(self, worker: int):
        """(ticket, batch) once there are queries and the tuner lets a batch start; None once closing. Holds the lock
        (its waits release it)."""
        deadline = None
        while not self._closing:
            available = sum(item.unbatched for item in self._waiting if not item.abandoned)
            if available:
                # Waiting only pays when more requests are due: the clients answered by the last batch tend to come
                # straight back, so wait (at most max_wait) until that many queries, and requests, are here (a large
                # request's queries do not stand for the clients beside it), and never when idle.
                expected = min(self.max_batch_size, max(1, self._last_batch_size))
                requests = sum(not item.abandoned for item in self._waiting)
                if (available < expected or requests < self._last_batch_requests) and self.max_wait > 0:
                    if deadline is None:
                        deadline = self._clock() + self.max_wait
                        self.stats.refill_waits += 1
                    if deadline > self._clock():
                        self._lock.wait(deadline - self._clock())
                        continue
                ticket = self.tuner.begin()
                if ticket is not None:
                    room, token_room = self._room(worker, ticket.layout.batches, available)
                    self._running += 1
                    self._idle.discard(worker)
                    batch = self._next_batch(room, token_room)
                    self._last_batch_size = sum(part.end - part.start for part in batch)
                    self._last_batch_requests = len(batch)
                    if any(item.unbatched for item in self._waiting):
                        self._lock.notify()  # another worker may start on the rest
                    return ticket, batch
            self._lock.wait()  # for requests, or for a batch to end and free its CPUs
        return None

    def _room(self, worker: int, batches_at_once: int, available: int) -> tuple[int, float]:
        """How many of the `available` queries this worker takes, and the most tokens they may hold: with several
        batches at once, the workers free to start now share the queries in proportion to their speed (equally
        while unmeasured), and a slower worker's batch is capped below max_batch_size and max_batch_tokens by as
        much, so that batches started together end together."""
        tokens = math.inf if self.max_batch_tokens is None else self.max_batch_tokens
        free = max(1, batches_at_once - self._running)
        if free == 1 and batches_at_once == 1 or not self.speed_shares:
            return min(self.max_batch_size, math.ceil(available / free)), tokens
        speeds = self._relative_speeds()
        others = sorted((speeds[other] for other in self._idle if other != worker), reverse=True)[: free - 1]
        share = speeds[worker] / (speeds[worker] + sum(others))
        room = max(1, min(math.ceil(self.max_batch_size * speeds[worker]), math.ceil(available * share)))
        return room, tokens * speeds[worker]

    def _relative_speeds(self) -> list[float]:
        """Each worker's queries per second over the fastest one's (1.0 while unmeasured)."""
        rates = [1 / seconds if seconds else None for seconds in self._seconds_per_query]
        fastest = max((rate for rate in rates if rate), default=None)
        return [rate / fastest if rate and fastest else 1.0 for rate in rates]

    def _next_batch(self, room: int, token_room: float) -> list[_Slice]:
        """The waiting requests' slices that make the next batch (batch_shares.share_batch). Requests that got
        nothing (more requests than room, or queries of the other kind) go first next time, then those with queries
        left."""
        waiting = [item for item in self._waiting if not item.abandoned]
        takes, self._last_batch_long = share_batch(waiting, room, token_room, self._last_batch_long)
        batch = []
        for item in waiting:
            if takes[item]:
                batch.append(_Slice(item, item.next_query, item.next_query + takes[item]))
                item.next_query += takes[item]
        unserved = [item for item in waiting if not takes[item]]
        self._waiting = deque(unserved + [item for item in waiting if takes[item] and item.unbatched])
        return batch

    def _run_batch(self, search: SearchFn, worker: int, ticket, batch: list[_Slice]) -> None:
        queries = [query for part in batch for query in part.request.queries[part.start : part.end]]
        self.tuner.enter(ticket)
        started = self._clock()
        try:
            scores, rows = search(queries, max(part.request.topk for part in batch))
        except Exception as err:  # one bad batch must not stop the worker
            logger.exception("retrieval batch of %d queries failed", len(queries))
            with self._lock:
                self._finish(ticket, worker, len(queries))
                self.stats.errors += 1
                for part in batch:
                    part.request.abandoned = True  # its other slices would be wasted work
                    _send(part.request, error=err)
                self._waiting = deque(item for item in self._waiting if not item.abandoned)
            return
        seconds = self._clock() - started
        with self._lock:
            self._finish(ticket, worker, len(queries))
            tokens = sum(part.request.cost(query) for part in batch for query in range(part.start, part.end))
            self._record(len(queries), tokens, seconds)
            if ticket.layout.batches > 1:  # single-threaded batches side by side: how fast is this worker's core
                per_query, before = seconds / len(queries), self._seconds_per_query[worker]
                self._seconds_per_query[worker] = (
                    per_query if before is None else SPEED_WEIGHT * per_query + (1 - SPEED_WEIGHT) * before
                )
            offset = 0
            for part in batch:
                request, size = part.request, part.end - part.start
                part_scores = scores[offset : offset + size, : request.topk]
                part_rows = rows[offset : offset + size, : request.topk]
                offset += size
                if request.abandoned:
                    continue
                if request.scores is None:
                    request.scores = np.empty((len(request.queries), request.topk), dtype=part_scores.dtype)
                    request.rows = np.empty((len(request.queries), request.topk), dtype=part_rows.dtype)
                request.scores[part.start : part.end] = part_scores
                request.rows[part.start : part.end] = part_rows
                request.answered += size
                if request.answered == len(request.queries):
                    _send(request, (request.scores, request.rows))

    def _finish(self, ticket, worker: int, queries: int) -> None:
        self._running -= 1
        self._idle.add(worker)
        self.tuner.end(ticket, queries)
        self._lock.notify_all()  # its CPUs are free: a waiting worker may start

    def _fail_waiting(self) -> None:
        error = BatcherClosed("the retriever is shutting down")
        while self._waiting:
            _send(self._waiting.popleft(), error=error)

    def _record(self, size: int, tokens: int, seconds: float) -> None:
        stats = self.stats
        stats.batches += 1
        stats.queries += size
        stats.tokens += tokens
        stats.largest_batch = max(stats.largest_batch, size)
        stats.largest_batch_tokens = max(stats.largest_batch_tokens, tokens)
        stats.busy_seconds += seconds
        stats.slowest_batch_seconds = max(stats.slowest_batch_seconds, seconds)
