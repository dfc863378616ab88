"""Dynamic batching on one worker thread, with a stand-in search function that records its calls."""

import asyncio
import threading
import time

import numpy as np
import pytest

from local_dense_retriever.batcher import DynamicBatcher


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


def test_multi_query_requests_keep_their_order_and_are_never_split():
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=8)
    requests = [([f"{'a' * j}" for j in range(1, 6)], 2), (["bb", "c"], 1), ([f"{'d' * j}" for j in range(1, 11)], 1)]
    try:
        results = asyncio.run(submit_all(batcher, requests))
    finally:
        batcher.close()
    for (queries, topk), (_, rows) in zip(requests, results, strict=True):
        assert rows[:, 0].tolist() == [len(q) * 100 for q in queries]
        assert rows.shape == (len(queries), topk)
    # A request bigger than max_batch_size runs alone rather than being split or rejected.
    assert ["d" * j for j in range(1, 11)] in search.calls


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


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcher(RecordingSearch(), max_batch_size=0)
