"""Dynamic batching on one or several worker threads, with stand-in search functions that record their calls."""

import asyncio
import threading
import time

import numpy as np
import pytest

from local_dense_retriever.retrieval.cpu_threads import Layout, ThreadTuner
from local_dense_retriever.serving.batcher import BatcherClosed, DynamicBatcher


class RecordingSearch:
    """Scores a query by its length; rows are the query's length plus the rank. Records batch sizes and threads."""

    def __init__(self, delay: float = 0.02, fail_on: str | None = None):
        self.delay, self.fail_on = delay, fail_on
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()

    def __call__(self, queries: list[str], k: int):
        self.calls.append(list(queries))
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        if self.fail_on in queries:
            raise RuntimeError(f"cannot search {self.fail_on!r}")
        lengths = np.array([len(q) for q in queries], dtype=np.int64)
        rows = lengths[:, None] * 100 + np.arange(k)[None, :]
        return -rows.astype(np.float32), rows


async def submit_all(batcher, requests):
    return await asyncio.gather(*(batcher.submit(queries, topk) for queries, topk in requests), return_exceptions=True)


def test_concurrent_requests_share_batches_and_each_gets_its_own_slice():
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=64)
    requests = [(["q" * (i % 9 + 1)], 1 + i % 4) for i in range(100)]
    try:
        results = asyncio.run(submit_all(batcher, requests))
    finally:
        batcher.close()
    for (queries, topk), (scores, rows) in zip(requests, results, strict=True):
        assert rows.shape == (1, topk) and scores.shape == (1, topk)
        assert rows[0].tolist() == [len(queries[0]) * 100 + r for r in range(topk)]
    assert sum(len(call) for call in search.calls) == 100
    assert len(search.calls) < 10  # merged, not one call per request
    assert max(len(call) for call in search.calls) <= 64
    assert search.threads == {"retrieval-worker"}


def test_multi_query_requests_keep_their_order_and_batches_never_exceed_max_batch_size():
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=8)
    requests = [([f"{'a' * j}" for j in range(1, 6)], 2), (["bb", "c"], 1), ([f"{'d' * j}" for j in range(1, 30)], 1)]
    try:
        results = asyncio.run(submit_all(batcher, requests))
    finally:
        batcher.close()
    for (queries, topk), (_, rows) in zip(requests, results, strict=True):
        assert rows[:, 0].tolist() == [len(q) * 100 for q in queries]
        assert rows.shape == (len(queries), topk)
    assert max(len(call) for call in search.calls) <= 8
    assert sum(len(call) for call in search.calls) == 5 + 2 + 29


def test_a_single_query_sent_during_a_large_request_waits_about_one_batch():
    search = RecordingSearch(delay=0.01)
    batcher = DynamicBatcher(search, max_batch_size=16)
    large = [f"large {i}" for i in range(512)]
    finished: list[str] = []

    async def scenario():
        async def send(name: str, queries: list[str]):
            await batcher.submit(queries, 3)
            finished.append(name)

        big = asyncio.ensure_future(send("large", large))
        await asyncio.sleep(0.03)  # the large request is being served: a few of its 32 batches have run
        await send("single", ["single"])
        await big

    try:
        asyncio.run(scenario())
    finally:
        batcher.close()
    assert finished == ["single", "large"]
    batch_of_single = next(i for i, call in enumerate(search.calls) if "single" in call)
    batches_before_single_arrived = sum(1 for call in search.calls[:batch_of_single] if "single" not in call)
    # It joined the batch after the one running when it arrived, not the end of the queue (32 batches).
    assert batches_before_single_arrived <= 6, [len(call) for call in search.calls]
    assert all(len(call) <= 16 for call in search.calls)


def test_waiting_requests_share_each_batch_in_equal_parts():
    search = RecordingSearch(delay=0.0)
    release = threading.Event()

    def gated(queries, k):
        if queries == ["blocker"]:
            release.wait(10)  # hold the worker until the three requests below are all queued
        return search(queries, k)

    batcher = DynamicBatcher(gated, max_batch_size=12)

    async def scenario():
        blocker = asyncio.ensure_future(batcher.submit(["blocker"], 1))
        await asyncio.sleep(0.05)
        requests = [[f"a{i}" for i in range(30)], [f"b{i}" for i in range(30)], [f"c{i}" for i in range(3)]]
        tasks = [asyncio.ensure_future(batcher.submit(queries, 1)) for queries in requests]
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(blocker, *tasks)

    try:
        asyncio.run(scenario())
    finally:
        batcher.close()
    first_shared = search.calls[1]
    # 12 places over three requests: 4 each, the small one has only 3, the spare place goes to the first.
    assert [sum(q.startswith(p) for q in first_shared) for p in "abc"] == [5, 4, 3]
    assert [len(call) for call in search.calls[2:]] == [12, 12, 12, 12, 3]


def test_a_failing_batch_fails_its_requests_and_the_worker_keeps_going():
    search = RecordingSearch(fail_on="boom")
    batcher = DynamicBatcher(search, max_batch_size=1)
    try:
        results = asyncio.run(submit_all(batcher, [(["boom"], 1), (["fine"], 1)]))
        later = asyncio.run(submit_all(batcher, [(["still fine"], 2)]))
    finally:
        batcher.close()
    assert isinstance(results[0], RuntimeError) and "boom" in str(results[0])
    assert results[1][1].tolist() == [[400]]
    assert later[0][1].tolist() == [[1000, 1001]]
    assert batcher.stats.errors == 1


def test_batch_size_one_means_one_search_per_request():
    search = RecordingSearch(delay=0.001)
    batcher = DynamicBatcher(search, max_batch_size=1)
    try:
        asyncio.run(submit_all(batcher, [(["x"], 1)] * 20))
    finally:
        batcher.close()
    assert [len(call) for call in search.calls] == [1] * 20


def test_an_idle_server_does_not_wait_and_a_busy_one_waits_a_bounded_time():
    search = RecordingSearch(delay=0.0)
    batcher = DynamicBatcher(search, max_batch_size=64, max_wait_ms=200)

    async def timed(queries):
        started = time.perf_counter()
        await batcher.submit(queries, 1)
        return time.perf_counter() - started

    try:
        first = asyncio.run(timed(["first"]))  # no history: answered at once
        asyncio.run(timed([f"q{i}" for i in range(10)]))  # a batch of 10: the next batch expects 10 again
        waited = asyncio.run(timed(["alone"]))  # only one comes: it waits, but no longer than max_wait
    finally:
        batcher.close()
    assert first < 0.1
    assert 0.19 <= waited < 1.0


def test_waiting_merges_clients_that_return_just_after_their_answer():
    search = RecordingSearch(delay=0.03)
    batcher = DynamicBatcher(search, max_batch_size=64, max_wait_ms=100)

    async def client(i: int):
        for _ in range(4):
            await batcher.submit([f"client {i}"], 1)
            await asyncio.sleep(0.002 * i)  # each client takes a little longer to come back

    async def all_clients():
        await asyncio.gather(*(client(i) for i in range(8)))

    try:
        asyncio.run(all_clients())
    finally:
        batcher.close()
    sizes = [len(call) for call in search.calls]
    assert sum(sizes) == 32
    assert sizes[-3:] == [8, 8, 8], sizes  # after the first rounds every batch holds all eight clients


def test_a_cancelled_request_does_not_break_the_worker():
    search = RecordingSearch(delay=0.2)
    batcher = DynamicBatcher(search, max_batch_size=4)

    async def scenario():
        doomed = asyncio.ensure_future(batcher.submit(["gone"], 1))
        await asyncio.sleep(0.05)
        doomed.cancel()
        return await batcher.submit(["kept"], 1)

    try:
        _, rows = asyncio.run(scenario())
    finally:
        batcher.close()
    assert rows.tolist() == [[400]]


def test_a_cancelled_large_request_runs_none_of_its_remaining_batches():
    search = RecordingSearch(delay=0.05)
    batcher = DynamicBatcher(search, max_batch_size=4)

    async def scenario():
        doomed = asyncio.ensure_future(batcher.submit([f"q{i}" for i in range(40)], 1))
        for _ in range(400):  # until two of its batches (of 4) have started
            if len(search.calls) >= 2:
                break
            await asyncio.sleep(0.005)
        doomed.cancel()
        await asyncio.sleep(0.3)

    try:
        asyncio.run(scenario())
    finally:
        batcher.close()
    assert [len(call) for call in search.calls] in ([4, 4], [4, 4, 4]), "the rest of its 10 batches ran"


def test_closing_fails_queued_work_at_once_instead_of_running_it():
    search = RecordingSearch(delay=0.2)
    batcher = DynamicBatcher(search, max_batch_size=4)

    async def scenario():
        queued = asyncio.ensure_future(batcher.submit([f"q{i}" for i in range(40)], 1))  # 10 batches, 2 s
        await asyncio.sleep(0.1)
        started = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(None, batcher.close)
        closing_seconds = time.perf_counter() - started
        with pytest.raises(BatcherClosed, match="shutting down"):
            await queued
        with pytest.raises(BatcherClosed):
            await batcher.submit(["after close"], 1)
        return closing_seconds

    closing_seconds = asyncio.run(scenario())
    assert len(search.calls) == 1  # the batch in progress finished; the other nine never ran
    assert closing_seconds < 1.0


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcher(RecordingSearch(), max_batch_size=0)


# Several workers: batches side by side, as many as the tuner's layout allows.


def two_single_threaded_workers(**options) -> ThreadTuner:
    return ThreadTuner(1, fixed=Layout(threads=1, batches=2), set_threads=lambda threads: None, **options)


class Gate:
    """A search that blocks each call until the test releases it, so which calls overlap is up to the test."""

    def __init__(self):
        self.search = RecordingSearch(delay=0.0)
        self.entered = threading.Semaphore(0)
        self.release: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0

    def __call__(self, queries, k):
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            event = self.release.setdefault(queries[0], threading.Event())
        self.entered.release()
        assert event.wait(10), "never released"
        with self.lock:
            self.inside -= 1
        return self.search(queries, k)

    def open(self, first_query: str) -> None:
        with self.lock:
            self.release.setdefault(first_query, threading.Event()).set()

    def wait_entered(self, calls: int) -> None:
        for _ in range(calls):
            assert self.entered.acquire(timeout=10), "a worker never started"


def test_free_workers_share_the_waiting_queries_and_run_side_by_side():
    gate = Gate()
    batcher = DynamicBatcher([gate, gate], max_batch_size=64, tuner=two_single_threaded_workers())

    async def scenario():
        request = asyncio.ensure_future(batcher.submit([f"q{i}" for i in range(10)], 2))
        await asyncio.get_running_loop().run_in_executor(None, gate.wait_entered, 2)  # both inside at once
        gate.open("q5")  # the second half finishes first
        gate.open("q0")
        return await request

    try:
        _, rows = asyncio.run(scenario())
    finally:
        batcher.close()
    assert sorted(len(call) for call in gate.search.calls) == [5, 5]  # shared out, not 10 for one worker
    assert gate.search.threads == {"retrieval-worker-0", "retrieval-worker-1"}
    assert rows[:, 0].tolist() == [200] * 10  # every row in its place, though its slices finished out of order
    assert gate.most_inside == 2


def test_a_batch_on_every_cpu_keeps_the_other_workers_waiting():
    gate = Gate()
    tuner = ThreadTuner(2, adaptive=False, set_threads=lambda threads: None)  # one batch at a time on 2 threads
    batcher = DynamicBatcher([gate, gate], max_batch_size=4, tuner=tuner)

    async def scenario():
        first = asyncio.ensure_future(batcher.submit(["a1", "a2", "a3", "a4"], 1))
        await asyncio.get_running_loop().run_in_executor(None, gate.wait_entered, 1)
        second = asyncio.ensure_future(batcher.submit(["b1"], 1))
        await asyncio.sleep(0.2)  # room for a wrong second batch to start
        gate.open("a1")
        gate.open("b1")
        await asyncio.gather(first, second)

    try:
        asyncio.run(scenario())
    finally:
        batcher.close()
    assert gate.most_inside == 1
    assert [len(call) for call in gate.search.calls] == [4, 1]


def test_each_worker_sizes_its_own_thread_pools_before_its_first_batch():
    resized: list[tuple[str, int]] = []

    def set_threads(threads: int) -> None:
        resized.append((threading.current_thread().name, threads))

    tuner = ThreadTuner(1, fixed=Layout(threads=1, batches=2), set_threads=set_threads)
    gate = Gate()
    batcher = DynamicBatcher([gate, gate], max_batch_size=1, tuner=tuner)

    async def scenario():
        requests = [asyncio.ensure_future(batcher.submit([name], 1)) for name in ("x", "y")]
        await asyncio.get_running_loop().run_in_executor(None, gate.wait_entered, 2)
        gate.open("x")
        gate.open("y")
        await asyncio.gather(*requests)

    try:
        asyncio.run(scenario())
    finally:
        batcher.close()
    # FAISS's OpenMP thread count is per calling thread: set where the batches run, not where the pools were made.
    assert sorted(resized) == [("retrieval-worker-0", 1), ("retrieval-worker-1", 1)]


def test_a_tuner_with_more_batches_than_searches_is_refused():
    with pytest.raises(ValueError, match="2 batches at once; got 1 searches"):
        DynamicBatcher([RecordingSearch()], tuner=two_single_threaded_workers())
