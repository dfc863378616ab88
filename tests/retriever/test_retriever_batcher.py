"""Dynamic batching on one or several worker threads, with stand-in search functions that record their calls.

Nothing here waits on time: a Gate holds a batch until the test opens it, the batcher's report says what is
queued, and where a duration is the thing under test (max_wait_ms) the batcher runs on a clock the test moves.
Every wait also ends, with a failure, once the batcher can do nothing more: each worker is asleep on the batcher's
lock with nobody to wake it, or gone (a broken batcher fails its test at once instead of hanging)."""

import asyncio
import threading
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from local_dense_retriever.retrieval.cpu_threads import Layout, ThreadTuner, Ticket
from local_dense_retriever.serving import batcher as batcher_module
from local_dense_retriever.serving.batcher import BatcherClosed, DynamicBatcher

# ---- knowing when a batcher can do nothing more ---------------------------------------------------------------------

_CHANGES = threading.Condition()  # notified whenever a worker sleeps or ends, a gate is entered, a request is answered
_version = [0]
_locks: list["WatchedCondition"] = []  # the lock of every batcher made in this test
_threads: list["WatchedThread"] = []
_gates: list["Gate"] = []
_stop_waiting = threading.Event()  # the test is over: waits still running in executor threads end


def changed(*_) -> None:
    with _CHANGES:
        _version[0] += 1
        _CHANGES.notify_all()


class _Waiters(deque):
    """Condition's queue of waiters (notify() removes the ones it wakes); remembers which sleep until notified."""

    def __init__(self, condition: "WatchedCondition"):
        super().__init__()
        self.condition = condition

    def append(self, waiter) -> None:
        if self.condition.next_sleeps:
            self.condition.sleepers.add(waiter)
        super().append(waiter)


class WatchedCondition(threading.Condition):
    """The batcher's lock: knows which threads sleep on it (with no timeout, or a long one) and are not notified."""

    def __init__(self, lock=None):
        super().__init__(lock)
        self._waiters = _Waiters(self)
        self.sleepers: set = set()
        self.next_sleeps = False
        _locks.append(self)

    def wait(self, timeout=None):
        # read by _Waiters.append, under this lock; a wait of a second or more counts as one without a timeout: no
        # test here relies on a worker waking up by itself after that long (the clocks the tests stop, a mutant's
        # long wait for more queries)
        self.next_sleeps = timeout is None or timeout >= 1.0
        changed()
        try:
            return super().wait(timeout)
        finally:
            self.next_sleeps = False
            self.sleepers.intersection_update(self._waiters)

    def asleep(self) -> int:
        return sum(waiter in self.sleepers for waiter in self._waiters)


class WatchedThread(threading.Thread):
    ended = False
    join_waits = True  # False: join() only records its timeout (whether the workers stop is checked on its own)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock = _locks[-1]  # the batcher makes its lock, then its threads
        self.joins: list[float | None] = []  # the timeout of each join()
        _threads.append(self)

    def join(self, timeout=None) -> None:
        self.joins.append(timeout)
        if self.join_waits:
            super().join(timeout)

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.ended = True
            changed()


def stuck() -> bool:
    """Every worker is gone, held in a Gate, or asleep on its batcher's lock with nobody to wake it: nothing more
    can happen until the test acts (a worker in a short timed wait is not stuck)."""
    waiting = sum(gate.held() for gate in _gates)
    for lock in _locks:
        with lock:
            waiting += lock.asleep()
    return waiting >= sum(not thread.ended for thread in _threads)


def _wait_until(done) -> bool:
    """In a thread: True once done(), False once the batchers are stuck first."""
    seen = None
    while True:
        with _CHANGES:
            _CHANGES.wait_for(lambda seen=seen: done() or _stop_waiting.is_set() or _version[0] != seen)
            if done():
                return True
            if _stop_waiting.is_set():
                return False
            seen = _version[0]
        if stuck():
            return False


async def until(done, what: str) -> None:
    """Waits until done(); fails the test if the batchers get stuck first. Answers already sent by a worker (queued
    on the event loop) are let through before the verdict."""
    loop = asyncio.get_running_loop()
    while not await loop.run_in_executor(None, _wait_until, done):
        before = _version[0]
        for _ in range(20):  # the event loop runs what is queued on it: submissions, answers being delivered
            await asyncio.sleep(0)
        if done():
            return
        # Stuck, and no worker moved while the loop ran what was queued (an answer is queued before its worker
        # goes back to sleep, so it has been delivered by now): nothing will come.
        if _stop_waiting.is_set() or (stuck() and _version[0] == before):
            fail(f"the batcher can do nothing more, yet {what} never happened")


async def settle(*awaitables, return_exceptions: bool = False) -> list:
    """asyncio.gather(*awaitables), failing fast if the batcher gets stuck before they are all done."""
    futures = [asyncio.ensure_future(a) for a in awaitables]
    for future in futures:
        future.add_done_callback(changed)
    await until(lambda: all(future.done() for future in futures), "every request was answered")
    return await asyncio.gather(*futures, return_exceptions=return_exceptions)


async def answer(awaitable):
    """One request's answer, failing fast if the batcher gets stuck first."""
    return (await settle(awaitable))[0]


def fail(message: str) -> None:
    for gate in _gates:
        gate.open_all()  # so that close() does not wait for a held batch
    pytest.fail(message)


@pytest.fixture(autouse=True)
def watched_batchers(monkeypatch):
    shim = SimpleNamespace(Condition=WatchedCondition, Thread=WatchedThread, Event=threading.Event)
    monkeypatch.setattr(batcher_module, "threading", shim)
    _stop_waiting.clear()
    yield
    _stop_waiting.set()
    changed()
    for gate in _gates:
        gate.open_all()
    _locks.clear()
    _threads.clear()
    _gates.clear()


def run(scenario, *batchers: DynamicBatcher):
    """asyncio.run(scenario()), then closes the batchers (without waiting for a worker that does not stop: the
    test has failed then); waits still running end with it."""

    async def guarded():
        try:
            return await scenario()
        finally:
            _stop_waiting.set()
            changed()

    try:
        return asyncio.run(guarded())
    finally:
        for gate in _gates:
            gate.open_all()
        for batcher in batchers:
            batcher.close(timeout=0)
        _stop_waiting.clear()


class RecordingSearch:
    """Scores a query by its length; rows are the query's length plus the rank. Records batches and threads."""

    def __init__(self, fail_on: str | None = None):
        self.fail_on = fail_on
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()
        self.sizes: list[tuple[str, int]] = []  # (worker thread, queries) of every call

    def __call__(self, queries: list[str], k: int):
        self.calls.append(list(queries))
        self.threads.add(threading.current_thread().name)
        self.sizes.append((threading.current_thread().name, len(queries)))
        if self.fail_on in queries:
            raise RuntimeError(f"cannot search {self.fail_on!r}")
        lengths = np.array([len(q) for q in queries], dtype=np.int64)
        rows = lengths[:, None] * 100 + np.arange(k)[None, :]
        return -rows.astype(np.float32), rows


class Gate:
    """A search that blocks each call until the test opens it (by the call's first query, or all of them), so which
    calls overlap, and what is queued meanwhile, is up to the test."""

    def __init__(self, open_queries: tuple[str, ...] = (), work=lambda queries: None):
        self.search = RecordingSearch()
        self.work = work  # what a call costs, once released
        self.holders: dict[str, str] = {}  # first query -> the worker thread that runs its batch
        self.arrived: list[list[str]] = []  # the calls, in the order they came in
        self._waiting: list[str] = []  # first queries of the calls inside
        self.entries = 0  # calls that came in
        self.awaited = 0  # calls a test has waited for (entered())
        self.inside = 0
        self.most_inside = 0
        self._opened = set(open_queries)
        self._open_prefixes: tuple[str, ...] = ()
        self._everything = False
        self._changed = threading.Condition()
        _gates.append(self)

    def __call__(self, queries, k):
        with self._changed:
            self.holders[queries[0]] = threading.current_thread().name
            self.arrived.append(list(queries))
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.entries += 1
            self._waiting.append(queries[0])
            changed()
            released = self._changed.wait_for(lambda: self._is_open(queries[0]), timeout=30)
            self._waiting.remove(queries[0])
            assert released, "never released"
            self.inside -= 1
        self.work(queries)
        return self.search(queries, k)

    def held(self) -> int:
        """Calls inside that wait for the test to open the gate."""
        with self._changed:
            return sum(not self._is_open(query) for query in self._waiting)

    def _is_open(self, first_query: str) -> bool:
        return self._everything or first_query in self._opened or first_query.startswith(self._open_prefixes)

    def open(self, first_query: str) -> None:
        with self._changed:
            self._opened.add(first_query)
            self._changed.notify_all()

    def open_prefix(self, prefix: str) -> None:
        with self._changed:
            self._open_prefixes += (prefix,)
            self._changed.notify_all()

    def open_all(self) -> None:
        with self._changed:
            self._everything = True
            self._changed.notify_all()


async def entered(gate: Gate, calls: int = 1) -> None:
    """Until `calls` more batches have come into the gate."""
    gate.awaited += calls
    target = gate.awaited
    await until(lambda: gate.entries >= target, f"batch {target} reached the search")


def queued(batcher: DynamicBatcher) -> int:
    return batcher.report()["waiting_queries"]


def run_behind_a_running_batch(batcher: DynamicBatcher, gate: "Gate", requests: list[tuple]):
    """Submits a blocker, then `requests` ((queries, topk) or (queries, topk, tokens)) while the blocker's batch runs
    (so all of them queue), then lets every batch through; the requests' results, in order. Closes the batcher."""

    async def scenario():
        blocker = asyncio.ensure_future(batcher.submit(["blocker"], 1))
        await entered(gate)
        tasks = [asyncio.ensure_future(batcher.submit(*request)) for request in requests]
        await asyncio.sleep(0)  # one turn of the event loop: every task has queued its request
        assert queued(batcher) == sum(len(queries) for queries, *_ in requests)
        gate.open_all()
        await answer(blocker)
        return await settle(*tasks)

    return run(scenario, batcher)


def submit_all(batcher, requests):
    return settle(*(batcher.submit(queries, topk) for queries, topk in requests), return_exceptions=True)


def test_concurrent_requests_share_batches_and_each_gets_its_own_slice():
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=64)
    requests = [(["q" * (i % 9 + 1)], 1 + i % 4) for i in range(100)]
    results = run_behind_a_running_batch(batcher, gate, requests)
    for (queries, topk), (scores, rows) in zip(requests, results, strict=True):
        assert rows.shape == (1, topk) and scores.shape == (1, topk)
        assert rows[0].tolist() == [len(queries[0]) * 100 + r for r in range(topk)]
        assert (scores.dtype, rows.dtype) == (np.float32, np.int64)  # as the search returned them
        assert scores.tolist() == (-rows).tolist()
    assert [len(call) for call in gate.search.calls] == [1, 64, 36]  # merged, at most max_batch_size each
    assert gate.search.threads == {"retrieval-worker"}


def test_multi_query_requests_keep_their_order_and_batches_never_exceed_max_batch_size():
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=8)
    requests = [([f"{'a' * j}" for j in range(1, 6)], 2), (["bb", "c"], 1), ([f"{'d' * j}" for j in range(1, 30)], 1)]
    results = run(lambda: submit_all(batcher, requests), batcher)
    for (queries, topk), (_, rows) in zip(requests, results, strict=True):
        assert rows[:, 0].tolist() == [len(q) * 100 for q in queries]
        assert rows.shape == (len(queries), topk)
    assert max(len(call) for call in search.calls) <= 8
    assert sum(len(call) for call in search.calls) == 5 + 2 + 29


def test_a_single_query_sent_during_a_large_request_joins_the_next_batch():
    gate = Gate(open_queries=("large 0", "large 16"))  # the first two batches pass; the third is held
    batcher = DynamicBatcher(gate, max_batch_size=16)
    finished: list[str] = []

    async def scenario():
        async def send(name: str, queries: list[str]):
            await batcher.submit(queries, 3)  # while the test holds the gate: settle() below watches it
            finished.append(name)

        big = asyncio.ensure_future(send("large", [f"large {i}" for i in range(512)]))
        await entered(gate, 3)  # its 3rd batch (of 32) is running
        single = asyncio.ensure_future(send("single", ["single"]))
        await asyncio.sleep(0)
        assert queued(batcher) == 512 - 3 * 16 + 1
        gate.open_all()
        await settle(big, single)

    run(scenario, batcher)
    assert finished == ["single", "large"]
    assert "single" in gate.search.calls[3]  # the batch after the one running when it came, not the 33rd
    assert all(len(call) <= 16 for call in gate.search.calls)


def test_waiting_requests_share_each_batch_in_equal_parts():
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=12)
    requests = [[f"a{i}" for i in range(30)], [f"b{i}" for i in range(30)], [f"c{i}" for i in range(3)]]
    run_behind_a_running_batch(batcher, gate, [(queries, 1) for queries in requests])
    first_shared = gate.search.calls[1]
    # 12 places over three requests: 4 each, the small one has only 3, the spare place goes to the first.
    assert [sum(q.startswith(p) for q in first_shared) for p in "abc"] == [5, 4, 3]
    assert [len(call) for call in gate.search.calls[2:]] == [12, 12, 12, 12, 3]


def test_requests_left_out_of_a_batch_go_first_in_the_next_one():
    """Three 4-query requests queued behind a running batch, batches of 2: the first batch has room for only two of
    them; the third request's first query must be in the second batch, not wait until the first two are done."""
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=2)
    run_behind_a_running_batch(batcher, gate, [([f"{name}{i}" for i in range(4)], 1) for name in "abc"])
    after_blocker = gate.search.calls[1:]
    assert after_blocker[0] == ["a0", "b0"]
    assert after_blocker[1][0] == "c0", after_blocker


def test_a_failing_batch_fails_its_requests_and_the_worker_keeps_going():
    search = RecordingSearch(fail_on="boom")
    batcher = DynamicBatcher(search, max_batch_size=1)

    async def scenario():
        results = await submit_all(batcher, [(["boom"], 1), (["fine"], 1)])
        return results, await submit_all(batcher, [(["still fine"], 2)])

    results, later = run(scenario, batcher)
    assert isinstance(results[0], RuntimeError) and "boom" in str(results[0])
    assert results[1][1].tolist() == [[400]]
    assert later[0][1].tolist() == [[1000, 1001]]
    assert batcher.stats.errors == 1


def test_batch_size_one_means_one_search_per_request():
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=1)
    run(lambda: submit_all(batcher, [(["x"], 1)] * 20), batcher)
    assert [len(call) for call in search.calls] == [1] * 20


class StoppedClock:
    """A clock that moves only when the test says; each reading is counted, so the test knows when the batcher has
    looked at it again."""

    def __init__(self):
        self.now = 1000.0
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1  # by the worker holding the batcher's lock: one at a time
        changed()
        return self.now

    async def readings_reach(self, count: int) -> None:
        await until(lambda: self.readings >= count, f"the batcher read its clock {count} times")


def test_an_idle_batcher_never_waits_and_a_busy_one_waits_until_the_expected_queries_are_here():
    """After a batch of 10, the next one waits (up to max_wait) for 10 queries: the clients just answered come
    back. The clock never moves here: the 10th query, not a timeout, starts the batch."""
    clock = StoppedClock()
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=64, max_wait_ms=60_000, clock=clock)

    async def scenario():
        await answer(batcher.submit(["first"], 1))  # no history: answered at once, the clock stopped
        waits_when_idle = batcher.stats.refill_waits
        await answer(batcher.submit([f"q{i}" for i in range(10)], 1))
        one = asyncio.ensure_future(batcher.submit(["back 0"], 1))
        readings = clock.readings
        await clock.readings_reach(readings + 2)
        assert batcher.stats.refill_waits == 1 and not one.done()
        rest = [asyncio.ensure_future(batcher.submit([f"back {i}"], 1)) for i in range(1, 10)]
        await settle(one, *rest)
        return waits_when_idle

    waits_when_idle = run(scenario, batcher)
    assert waits_when_idle == 0
    assert [len(call) for call in search.calls] == [1, 10, 10]


class ClockStoppedUntilMoved(StoppedClock):
    """Stopped until the test sets `moving`; then a second later at each reading (every wait ends at once)."""

    moving = False

    def __call__(self) -> float:
        self.now += 1.0 if self.moving else 0.0
        return super().__call__()


def test_a_busy_batcher_waits_for_the_clients_it_answered_though_a_large_request_has_queries_enough():
    """A batch held 5 queries of a 16-query request and 3 single queries: the next one waits (up to max_wait) until 4
    requests are here again, the 3 clients just answered coming back, instead of filling itself with 8 queries of
    the large request and leaving them to wait for it. The clock stands still meanwhile: the 4th request, not a
    timeout, starts the batch."""
    clock = ClockStoppedUntilMoved()
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=8, max_wait_ms=500, clock=clock)
    large = [f"l{i}" for i in range(16)]

    async def scenario():
        blocker = asyncio.ensure_future(batcher.submit(["blocker"], 1))
        await entered(gate)
        big = asyncio.ensure_future(batcher.submit(large, 1))
        first = [asyncio.ensure_future(batcher.submit([f"s{i}"], 1)) for i in range(3)]
        await asyncio.sleep(0)
        gate.open("blocker")
        await entered(gate)  # 8 places over 4 requests: 2 each, then the large request takes the 3 left
        gate.open("l0")
        await settle(blocker, *first)
        await until(lambda: batcher.stats.refill_waits == 1, "the batcher waited for the clients to come back")
        entries_while_waiting = gate.entries
        again = [asyncio.ensure_future(batcher.submit([f"s{i}"], 1)) for i in range(3, 6)]
        await entered(gate)
        clock.moving = True  # the waits for the rest of the large request end at once
        gate.open_all()
        await settle(big, *again)
        return entries_while_waiting

    assert run(scenario, batcher) == 2
    assert gate.search.calls[1:3] == [[*large[:5], "s0", "s1", "s2"], [*large[5:10], "s3", "s4", "s5"]]


def test_a_busy_batcher_waits_no_longer_than_max_wait():
    clock = StoppedClock()
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=64, max_wait_ms=200, clock=clock)

    async def scenario():
        await answer(batcher.submit([f"q{i}" for i in range(10)], 1))
        started = clock.now
        alone = asyncio.ensure_future(batcher.submit(["alone"], 1))
        await clock.readings_reach(clock.readings + 2)
        clock.now = started + 0.1999  # the worker looks again within 0.2 s of real time: still waiting
        await clock.readings_reach(clock.readings + 2)
        assert queued(batcher) == 1  # not taken yet
        clock.now = started + 0.2
        await answer(alone)

    run(scenario, batcher)
    assert [len(call) for call in search.calls] == [10, 1] and batcher.stats.refill_waits == 1


def test_a_cancelled_request_does_not_break_the_worker():
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=4)

    async def scenario():
        doomed = asyncio.ensure_future(batcher.submit(["gone"], 1))
        await entered(gate)
        doomed.cancel()
        gate.open_all()
        return await answer(batcher.submit(["kept"], 1))

    _, rows = run(scenario, batcher)
    assert rows.tolist() == [[400]]
    assert batcher.stats.abandoned_requests == 1


def test_a_cancelled_large_request_runs_none_of_its_remaining_batches():
    gate = Gate(open_queries=("q0",))
    batcher = DynamicBatcher(gate, max_batch_size=4)

    async def scenario():
        doomed = asyncio.ensure_future(batcher.submit([f"q{i}" for i in range(40)], 1))
        await entered(gate, 2)  # its second batch (of 10) is running
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        gate.open_all()
        await answer(batcher.submit(["after"], 1))  # one worker, in order: anything of the large request ran before

    run(scenario, batcher)
    assert gate.search.calls == [["q0", "q1", "q2", "q3"], ["q4", "q5", "q6", "q7"], ["after"]]


def test_closing_fails_queued_work_instead_of_running_it():
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=4)

    async def scenario():
        queued_request = asyncio.ensure_future(batcher.submit([f"q{i}" for i in range(40)], 1))  # 10 batches
        await entered(gate)
        batcher.close(timeout=0)  # returns at once: the worker is still in its batch
        assert batcher.stopping.is_set()
        with pytest.raises(BatcherClosed, match="^the retriever is shutting down$"):
            await answer(queued_request)
        gate.open_all()  # the batch in progress ends; the worker must stop there
        await until(lambda: all(thread.ended for thread in _threads), "the worker stopped")
        with pytest.raises(BatcherClosed, match="^the retriever is shutting down$"):
            await answer(batcher.submit(["after close"], 1))

    run(scenario, batcher)
    assert len(gate.search.calls) == 1  # the batch in progress finished; the other nine never ran


def test_a_request_without_queries_is_answered_at_once_with_no_rows():
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=4)
    scores, rows = run(lambda: answer(batcher.submit([], 3)), batcher)
    assert scores.shape == rows.shape == (0, 3) and search.calls == []
    assert (scores.dtype, rows.dtype) == (np.float32, np.int64)  # as a search answers


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcher(RecordingSearch(), max_batch_size=0)


# ---- batches bounded by the tokens their queries are encoded at -----------------------------------------------------

LONG, SHORT = 256, 8  # tokens of a query of 4,096 characters at --max_length 256, and of a question


def test_a_single_query_sent_beside_long_queries_waits_for_one_short_batch_of_them():
    """One request of 512 long queries, batches of up to 64 queries and 1,024 tokens: a batch of long queries holds
    a quarter of the bound, one long query. A single query sent while the first runs is the next batch, alone."""
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=64, max_batch_tokens=1024)
    long_queries = [f"long {i}" for i in range(512)]

    async def scenario():
        large = asyncio.ensure_future(batcher.submit(long_queries, 3, tokens=[LONG] * 512))
        await entered(gate)
        single = asyncio.ensure_future(batcher.submit(["single"], 3, tokens=[SHORT]))
        await asyncio.sleep(0)
        assert queued(batcher) == 512 - 1 + 1
        gate.open_all()
        return await settle(large, single)

    (_, large_rows), (_, single_rows) = run(scenario, batcher)
    calls = gate.search.calls
    assert calls[:2] == [long_queries[:1], ["single"]]
    assert calls[2:] == [[query] for query in long_queries[1:]]
    assert large_rows.shape == (512, 3) and single_rows[0].tolist() == [600, 601, 602]
    assert batcher.report()["largest_batch_tokens"] == LONG and batcher.report()["tokens"] == 512 * LONG + SHORT


def test_long_queries_and_questions_take_turns_in_batches_of_their_own():
    """A request of 8 long queries, then 10 single questions, 1,024 tokens a batch: after the blocker (a question)
    comes a batch of long queries, then the questions together, then the rest of the long ones; a request that
    mixes both kinds is served in its order, a batch per kind."""
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=64, max_batch_tokens=1024)
    long_request = ([f"h{i}" for i in range(8)], 1, [LONG] * 8)
    questions = [([f"s{i}"], 1, [SHORT]) for i in range(10)]
    run_behind_a_running_batch(batcher, gate, [long_request, *questions])
    assert gate.search.calls[1:] == [["h0"], [f"s{i}" for i in range(10)], *([f"h{i}"] for i in range(1, 8))]

    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=64, max_batch_tokens=1024)
    run(lambda: answer(batcher.submit(["q0", "q1", "l2", "q3"], 1, tokens=[SHORT, SHORT, LONG, SHORT])), batcher)
    assert search.calls == [["q0", "q1"], ["l2"], ["q3"]]


@pytest.mark.parametrize(("bound", "sizes"), [(30, [3]), (29, [2, 1]), (20, [2, 1]), (19, [1, 1, 1]), (9, [1, 1, 1])])
def test_a_batch_holds_the_queries_whose_tokens_fit_in_max_batch_tokens(bound, sizes):
    """Three queries of 10 tokens: all fit in 30, two in 20 to 29, one in 10 to 19; each runs alone when even one is
    over the bound (a batch always holds a query)."""
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=8, max_batch_tokens=bound)
    run(lambda: answer(batcher.submit(["a", "b", "c"], 1, tokens=[10, 10, 10])), batcher)
    assert [len(call) for call in search.calls] == sizes


def test_a_query_over_max_batch_tokens_runs_alone_and_queries_without_counts_cost_nothing():
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=8, max_batch_tokens=100)

    async def scenario():
        await answer(batcher.submit(["s1", "big", "s2"], 1, tokens=[10, 500, 10]))
        await answer(batcher.submit([f"u{i}" for i in range(8)], 1))  # BM25's: not counted

    run(scenario, batcher)
    assert search.calls == [["s1"], ["big"], ["s2"], [f"u{i}" for i in range(8)]]
    assert batcher.report()["largest_batch_tokens"] == 500


def test_requests_of_long_queries_take_turns_within_the_token_bound():
    """Three requests of 4 long queries, 2,048 tokens a batch, so 512 for a batch of long queries: two long queries a
    batch, one from each of two requests, and the request left out goes first in the next."""
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=64, max_batch_tokens=8 * LONG)
    run_behind_a_running_batch(batcher, gate, [([f"{name}{i}" for i in range(4)], 1, [LONG] * 4) for name in "abc"])
    assert gate.search.calls[1:] == [
        ["a0", "b0"],
        ["c0", "a1"],
        ["b1", "c1"],
        ["a2", "b2"],
        ["c2", "a3"],
        ["b3", "c3"],
    ]


TOKEN_SHARES = {
    # 60 tokens over three requests: 20 each; a and b fill theirs exactly, c's 30-token query is over what is left,
    # and the 20 it leaves go to a and b in the next round
    "a part filled exactly": (
        {"a": [10, 10, 10], "b": [10, 10, 10], "c": [30]},
        60,
        ["a0", "a1", "a2", "b0", "b1", "b2"],
    ),
    # 15 each: a takes 10, b 10; the last 10 go to a in the next round, down to the last token
    "the bound filled exactly": ({"a": [10, 10, 10], "b": [10]}, 30, ["a0", "a1", "b0"]),
    # 15 each, then 5 each: no next query fits a part, so the first that fits what is left takes it, and no more
    "no part fits a query": ({"a": [10, 10], "b": [10, 10]}, 30, ["a0", "a1", "b0"]),
    # 16.7 each: one query each (a's and b's second are over their parts); then 10 each: b1 fits its part, a1 (20)
    # is over it, and only a request with nothing in the batch may go over its part
    "over its part only with nothing in the batch": (
        {"a": [10, 20], "b": [10, 10], "c": [10]},
        50,
        ["a0", "b0", "b1", "c0"],
    ),
    # 18.5 each, then 8.5 each: no next query fits its part; the first that fits what is left (a's 12 tokens, not
    # b's 10) takes it, and b's no longer fits
    "the first query that fits what is left": ({"a": [10, 12], "b": [10, 10]}, 37, ["a0", "a1", "b0"]),
    # a's next queries in the second round are its 5-token ones, not the 10-token ones it took in the first
    "later rounds go on where a request stopped": (
        {"a": [10, 10, 5, 5], "b": [10]},
        40,
        ["a0", "a1", "a2", "a3", "b0"],
    ),
}


@pytest.mark.parametrize("case", TOKEN_SHARES)
def test_the_tokens_of_a_batch_are_shared_in_rounds_of_equal_parts(case):
    costs, bound, first_batch = TOKEN_SHARES[case]
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=64, max_batch_tokens=bound)
    requests = [([f"{name}{i}" for i in range(len(tokens))], 1, tokens) for name, tokens in costs.items()]
    run_behind_a_running_batch(batcher, gate, requests)
    assert gate.search.calls[1] == first_batch


def test_a_slower_worker_takes_its_share_of_max_batch_tokens_too():
    """Workers measured at 1 and 1/2: beside a backlog of 100-token queries and a bound of 1,000 tokens, the slow
    worker's batch holds 500 tokens, the fast one's 1,000 (their query caps, 32 and 64, are not reached)."""
    fast, slow = "retrieval-worker-0", "retrieval-worker-1"
    clock = WorkerTime({fast: 0.001, slow: 0.002})
    gate = Gate(work=clock.spend)
    batcher = DynamicBatcher(
        [gate, gate],
        max_batch_size=64,
        max_batch_tokens=1000,
        max_wait_ms=0.0,
        tuner=two_single_threaded_workers(),
        clock=clock,
    )

    async def scenario():
        measuring = asyncio.ensure_future(batcher.submit(["w0", "w1"], 1))
        await entered(gate, 2)
        gate.open_prefix("w")
        await answer(measuring)
        speeds = batcher.report()["worker_speeds"]
        blockers = []
        for name in ("b0", "b1"):  # one blocker held in each worker
            blockers.append(asyncio.ensure_future(batcher.submit([name], 1)))
            await entered(gate)
        backlog = asyncio.ensure_future(batcher.submit([f"s{i}" for i in range(60)], 1, tokens=[100] * 60))
        await asyncio.sleep(0)
        holder = {worker: query for query, worker in gate.holders.items() if query[0] == "b"}
        gate.open(holder[slow])
        await entered(gate)
        gate.open(holder[fast])
        await entered(gate)
        taken = {gate.holders[call[0]]: len(call) for call in gate.arrived[-2:]}
        gate.open_all()
        await settle(*blockers, backlog)
        return speeds, taken

    speeds, taken = run(scenario, batcher)
    assert speeds == [1.0, 0.5]
    assert taken == {slow: 5, fast: 10}


def test_max_batch_tokens_must_be_positive_and_counts_must_match_the_queries():
    with pytest.raises(ValueError, match="max_batch_tokens must be at least 1, got 0"):
        DynamicBatcher(RecordingSearch(), max_batch_tokens=0)
    batcher = DynamicBatcher(RecordingSearch())
    with pytest.raises(ValueError, match="2 token counts for 3 queries"):
        run(lambda: answer(batcher.submit(["a", "b", "c"], 1, tokens=[1, 2])), batcher)


# Several workers: batches side by side, as many as the tuner's layout allows.


def two_single_threaded_workers(**options) -> ThreadTuner:
    return ThreadTuner(1, fixed=Layout(threads=1, batches=2), set_threads=lambda threads: None, **options)


def test_free_workers_share_the_waiting_queries_and_run_side_by_side():
    gate = Gate()
    batcher = DynamicBatcher([gate, gate], max_batch_size=64, tuner=two_single_threaded_workers())

    async def scenario():
        request = asyncio.ensure_future(batcher.submit([f"q{i}" for i in range(10)], 2))
        await entered(gate, 2)  # both inside at once
        assert batcher.report()["running_batches"] == 2
        gate.open("q5")  # the second half finishes first
        gate.open("q0")
        return await answer(request)

    _, rows = run(scenario, batcher)
    assert sorted(len(call) for call in gate.search.calls) == [5, 5]  # shared out, not 10 for one worker
    assert gate.search.threads == {"retrieval-worker-0", "retrieval-worker-1"}
    assert rows[:, 0].tolist() == [200] * 10  # every row in its place, though its slices finished out of order
    assert gate.most_inside == 2


class WatchedTuner(ThreadTuner):
    """Says when a worker asked to start a batch and was told to wait."""

    def __init__(self, *args, **options):
        super().__init__(*args, **options)
        self.refused = threading.Event()

    def begin(self):
        ticket = super().begin()
        if ticket is None:
            self.refused.set()
            changed()
        return ticket


def test_a_batch_on_every_cpu_keeps_the_other_workers_waiting():
    gate = Gate()
    tuner = WatchedTuner(2, set_threads=lambda threads: None)  # starts with one batch on both CPUs; 2 workers
    batcher = DynamicBatcher([gate, gate], max_batch_size=4, tuner=tuner)

    async def scenario():
        first = asyncio.ensure_future(batcher.submit(["a1", "a2", "a3", "a4"], 1))
        await entered(gate)
        second = asyncio.ensure_future(batcher.submit(["b1"], 1))
        await until(tuner.refused.is_set, "the idle worker asked to start a batch")
        inside_while_refused = gate.inside
        gate.open_all()
        await settle(first, second)
        return inside_while_refused

    inside_while_refused = run(scenario, batcher)
    assert inside_while_refused == 1 and gate.most_inside == 1
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
        await entered(gate, 2)
        gate.open("x")
        gate.open("y")
        await settle(*requests)

    run(scenario, batcher)
    # FAISS's OpenMP thread count is per calling thread: set where the batches run, not where the pools were made.
    assert sorted(resized) == [("retrieval-worker-0", 1), ("retrieval-worker-1", 1)]


class WorkerTime:
    """Each worker thread's own clock, moved by its searches: queries x that worker's seconds per query."""

    def __init__(self, seconds_per_query: dict[str, float]):
        self.seconds_per_query = seconds_per_query
        self._local = threading.local()

    def __call__(self) -> float:
        return getattr(self._local, "now", 0.0)

    def spend(self, queries: list[str]) -> None:
        self._local.now = self() + len(queries) * self.seconds_per_query[threading.current_thread().name]


def sizes_by_worker(search: RecordingSearch, since: int) -> dict[str, list[int]]:
    sizes: dict[str, list[int]] = {}
    for worker, size in search.sizes[since:]:
        sizes.setdefault(worker, []).append(size)
    return sizes


def test_workers_side_by_side_share_the_queries_by_their_measured_speed():
    """Beside a busy process the worker that shares its core runs at half speed: it gets half as many queries, so
    that batches started together end together (an equal share made its queries the slowest ones)."""
    fast, slow = "retrieval-worker-0", "retrieval-worker-1"
    clock = WorkerTime({fast: 0.001, slow: 0.002})
    gate = Gate(work=clock.spend)
    batcher = DynamicBatcher(
        [gate, gate], max_batch_size=64, max_wait_ms=0.0, tuner=two_single_threaded_workers(), clock=clock
    )

    async def scenario():
        first = asyncio.ensure_future(batcher.submit(["w0", "w1"], 1))
        await entered(gate, 2)  # one query in each worker
        gate.open("w0")
        gate.open("w1")
        await answer(first)  # both speeds measured
        measured = batcher.report()["worker_speeds"]
        both_idle = len(gate.search.sizes)
        shared = asyncio.ensure_future(batcher.submit([f"r{i}" for i in range(60)], 1))  # both idle: shared 2:1
        await entered(gate, 2)  # both took their part
        gate.open_prefix("r")
        await answer(shared)
        shared = sizes_by_worker(gate.search, both_idle)
        blockers = []
        for name in ("b0", "b1"):  # one blocker held in each worker
            blockers.append(asyncio.ensure_future(batcher.submit([name], 1)))
            await entered(gate)
        backlog = asyncio.ensure_future(batcher.submit([f"s{i}" for i in range(60)], 1))
        await asyncio.sleep(0)
        assert queued(batcher) == 60
        holder = {worker: query for query, worker in gate.holders.items() if query[0] == "b"}
        gate.open(holder[slow])  # the slow worker is free first, the fast one still busy: it takes its capped part
        await entered(gate)
        gate.open(holder[fast])  # now the fast one: the rest
        await entered(gate)
        taken = {worker: query for query, worker in gate.holders.items() if query[0] == "s"}
        gate.open_all()
        await settle(*blockers, backlog)
        return measured, shared, taken, [size for _, size in gate.search.sizes if size > 1][-2:]

    measured, shared, taken, backlog_sizes = run(scenario, batcher)
    assert measured == [1.0, 0.5]
    assert shared == {fast: [40], slow: [20]}
    assert taken == {slow: "s0", fast: "s32"}  # the slow one's batch capped at half of max_batch_size
    assert sorted(backlog_sizes) == [28, 32]


def test_a_tuner_with_more_batches_than_searches_is_refused():
    with pytest.raises(ValueError, match="2 batches at once; got 1 searches"):
        DynamicBatcher([RecordingSearch()], tuner=two_single_threaded_workers())


def test_the_counters_health_reports_add_up_on_a_clock_the_search_moves():
    """What /health's batcher block says after a batch of 3 queries, two of 1 and two that fail: counts, sizes,
    tokens (where the request counted them) and seconds (the search moves the batcher's clock by 0.12345 s a query,
    so the seconds are exact)."""
    now = [100.0]
    recording = RecordingSearch(fail_on="boom")

    def search(queries, k):
        now[0] += 0.12345 * len(queries)
        return recording(queries, k)

    batcher = DynamicBatcher(search, max_batch_size=8, max_wait_ms=0.0, clock=lambda: now[0])
    assert batcher.report()["mean_batch_size"] == 0.0  # no batch yet: no division by zero

    async def scenario():
        await answer(batcher.submit(["a", "bb", "ccc"], 2, tokens=[3, 4, 5]))
        await answer(batcher.submit(["d"], 1, tokens=[7]))
        await answer(batcher.submit(["f"], 1))
        with pytest.raises(RuntimeError, match="cannot search 'boom'"):
            await answer(batcher.submit(["boom", "e"], 1, tokens=[100, 100]))
        with pytest.raises(RuntimeError, match="cannot search 'boom'"):
            await answer(batcher.submit(["boom"], 1))
        return batcher.report()

    report = run(scenario, batcher)
    assert recording.calls == [["a", "bb", "ccc"], ["d"], ["f"], ["boom", "e"], ["boom"]]
    assert {key: report[key] for key in batcher.stats.as_dict()} == {
        "batches": 3,  # the failed batch counts as an error, not as a batch served
        "queries": 5,
        "mean_batch_size": 1.67,
        "largest_batch": 3,
        "tokens": 19,  # 3 + 4 + 5, then 7; the failed batch's are not counted
        "largest_batch_tokens": 12,
        "busy_seconds": 0.617,  # 0.61725 rounded
        "slowest_batch_seconds": 0.37,  # 0.37035 rounded
        "errors": 2,
        "abandoned_requests": 0,
        "refill_waits": 0,
    }
    assert report["waiting_queries"] == 0 and report["running_batches"] == 0


# ---- what the counters, defaults and shutdown promise -------------------------------------------------------------


def test_by_default_a_batcher_never_waits_for_more_queries():
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=64)

    async def scenario():
        await answer(batcher.submit([f"q{i}" for i in range(10)], 1))
        await answer(batcher.submit(["alone"], 1))  # fewer than the last batch: taken at once all the same

    run(scenario, batcher)
    assert [len(call) for call in search.calls] == [10, 1] and batcher.stats.refill_waits == 0


class SteppingClock:
    """A clock one second later at each reading: every wait for more queries (max_wait_ms 500) ends at once."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_batcher_waits_for_as_many_queries_as_its_last_batch_held_and_counts_each_wait():
    """Batches of at most 10: a 14-query request is a batch of 10, then (after a wait for 10) one of 4; 4 queries
    then are as many as the last batch (no wait); 1 query is fewer (a wait)."""
    search = RecordingSearch()
    batcher = DynamicBatcher(search, max_batch_size=10, max_wait_ms=500, clock=SteppingClock())

    async def scenario():
        waits = []
        for size in (14, 4, 1):
            await answer(batcher.submit([f"q{i}" for i in range(size)], 1))
            waits.append(batcher.stats.refill_waits)
        return waits

    assert run(scenario, batcher) == [1, 1, 2]
    assert [len(call) for call in search.calls] == [10, 4, 4, 1]


def test_a_batcher_without_a_tuner_runs_one_single_threaded_batch_per_search_and_leaves_the_pools(monkeypatch):
    from local_dense_retriever.retrieval import cpu_threads

    resized = []
    monkeypatch.setattr(cpu_threads, "set_pool_threads", resized.append)
    gate = Gate()
    batcher = DynamicBatcher([gate, gate], max_batch_size=64)

    async def scenario():
        request = asyncio.ensure_future(batcher.submit(["a", "b"], 1))
        await entered(gate, 2)  # side by side
        gate.open_all()
        return await answer(request)

    _, rows = run(scenario, batcher)
    assert rows[:, 0].tolist() == [100, 100]
    assert batcher.workers == 2 and [(layout.threads, layout.batches) for layout in batcher.tuner.layouts] == [(1, 2)]
    assert resized == []  # the pools are the caller's business here
    assert [thread.daemon for thread in _threads] == [True, True]  # they never keep the process from exiting


def test_searches_beyond_what_the_tuner_runs_at_once_are_left_unused():
    searches = [RecordingSearch() for _ in range(3)]
    batcher = DynamicBatcher(searches, tuner=two_single_threaded_workers())
    run(lambda: answer(batcher.submit(["q"], 1)), batcher)
    assert batcher.workers == 2 and searches[2].calls == []


def test_close_gives_the_workers_its_timeout_in_all(monkeypatch):
    """close() joins each worker for what is left of its timeout (on a clock one second later at each reading), and
    the workers stop."""
    ticks = iter(float(t) for t in range(100, 200))
    monkeypatch.setattr(batcher_module, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    monkeypatch.setattr(WatchedThread, "join_waits", False)
    short = DynamicBatcher([RecordingSearch(), RecordingSearch()], tuner=two_single_threaded_workers())
    short.close(timeout=1.5)  # deadline 101.5: read at 101 (0.5 s left), then 102 (none)
    by_default = DynamicBatcher([RecordingSearch(), RecordingSearch()], tuner=two_single_threaded_workers())
    by_default.close()  # deadline 113: read at 104, 105
    assert [thread.joins for thread in _threads] == [[0.5], [0.0], [9.0], [8.0]]
    assert _wait_until(lambda: all(thread.ended for thread in _threads)), "a worker did not stop"


def test_a_failed_batch_runs_none_of_its_requests_other_slices_and_each_failure_is_counted():
    search = RecordingSearch(fail_on="boom")
    tuner = ThreadTuner(1, set_threads=lambda threads: None)  # adaptive: it is told how many queries each batch held
    batcher = DynamicBatcher(search, max_batch_size=2, tuner=tuner)

    async def scenario():
        failed = await settle(batcher.submit(["boom", "a", "b", "c"], 1), return_exceptions=True)
        failed += await settle(batcher.submit(["boom"], 1), return_exceptions=True)
        return failed, await answer(batcher.submit(["after"], 1))

    failed, (_, rows) = run(scenario, batcher)
    assert [str(error) for error in failed] == ["cannot search 'boom'"] * 2
    assert search.calls == [["boom", "a"], ["boom"], ["after"]]
    assert rows.tolist() == [[500]] and batcher.stats.errors == 2


def test_every_cancelled_request_is_counted_and_the_others_in_its_batch_still_answered():
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=8)

    async def scenario():
        blocker = asyncio.ensure_future(batcher.submit(["blocker"], 1))
        await entered(gate)
        first = asyncio.ensure_future(batcher.submit(["first"], 1))
        kept = asyncio.ensure_future(batcher.submit(["kept"], 1))
        last = asyncio.ensure_future(batcher.submit(["last"], 1))
        await asyncio.sleep(0)  # all three queued
        gate.open("blocker")
        await entered(gate)  # one batch of all three is running
        for cancelled in (first, last):
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled  # the request is marked abandoned before its batch ends
        gate.open_all()
        await settle(blocker)
        return await answer(kept)

    _, rows = run(scenario, batcher)
    assert gate.search.calls[1] == ["first", "kept", "last"]
    assert rows.tolist() == [[400]]  # the cancelled request before it in the batch does not stop its answer
    assert batcher.stats.abandoned_requests == 2


def test_speeds_are_equal_until_measured():
    search = RecordingSearch()
    batcher = DynamicBatcher([search, search], max_batch_size=64, tuner=two_single_threaded_workers())
    assert batcher.report()["worker_speeds"] == [1.0, 1.0]
    run(lambda: answer(batcher.submit(["only one"], 1)), batcher)  # one worker measured, the other not
    assert len(search.calls) == 1 and batcher.report()["worker_speeds"] == [1.0, 1.0]


def test_a_workers_speed_follows_its_batches_as_a_moving_average():
    """Both workers at 1 ms a query, then the second at 2 ms: its average moves by 0.3 of the change (1.3 ms a
    query), so its speed is 1 / 1.3 of the first's, not half at once."""
    fast, slow = "retrieval-worker-0", "retrieval-worker-1"
    clock = WorkerTime({fast: 0.001, slow: 0.001})
    gate = Gate(work=clock.spend)
    batcher = DynamicBatcher(
        [gate, gate], max_batch_size=64, max_wait_ms=0.0, tuner=two_single_threaded_workers(), clock=clock
    )

    async def scenario():
        for round_ in ("a", "b"):
            request = asyncio.ensure_future(batcher.submit([f"{round_}0", f"{round_}1"], 1))
            await entered(gate, 2)  # one query in each worker
            gate.open_prefix(round_)
            await answer(request)
            clock.seconds_per_query[slow] = 0.002

    run(scenario, batcher)
    assert batcher.report()["worker_speeds"] == [1.0, 0.77]


def test_without_speed_shares_free_workers_split_the_queries_equally():
    """The benchmark's baseline: measured speeds 1 : 0.5, yet 60 queries are split 30 / 30."""
    fast, slow = "retrieval-worker-0", "retrieval-worker-1"
    clock = WorkerTime({fast: 0.001, slow: 0.002})
    gate = Gate(work=clock.spend)
    tuner = two_single_threaded_workers()
    batcher = DynamicBatcher(
        [gate, gate], max_batch_size=64, max_wait_ms=0.0, tuner=tuner, clock=clock, speed_shares=False
    )

    async def scenario():
        first = asyncio.ensure_future(batcher.submit(["w0", "w1"], 1))
        await entered(gate, 2)
        gate.open_prefix("w")
        await answer(first)
        measured = batcher.report()["worker_speeds"]
        shared = asyncio.ensure_future(batcher.submit([f"r{i}" for i in range(60)], 1))
        await entered(gate, 2)
        gate.open_all()
        await answer(shared)
        return measured

    assert run(scenario, batcher) == [1.0, 0.5]
    assert sizes_by_worker(gate.search, 2) == {fast: [30], slow: [30]}


def test_a_request_with_less_left_than_its_share_takes_only_what_it_has():
    """16 places over requests of 5, 40, 1 and 1 queries: 4 each (the small ones take 1), then 3 each for the two
    with queries left (the first has 1 left: it takes 1), then the rest to the large one."""
    gate = Gate()
    batcher = DynamicBatcher(gate, max_batch_size=16)
    sizes = (5, 40, 1, 1)
    requests = [([f"{name}{i}" for i in range(size)], 1) for name, size in zip("abcd", sizes, strict=True)]
    results = run_behind_a_running_batch(batcher, gate, requests)
    assert [sum(q[0] == name for q in gate.search.calls[1]) for name in "abcd"] == [5, 9, 1, 1]
    assert [len(rows) for _, rows in results] == list(sizes)


class ScriptedTuner:
    """Lets `batches` single-threaded batches run at once (the test may change it), over `workers` workers; records
    the queries each batch it saw end held."""

    def __init__(self, workers: int, batches: int):
        self.workers, self.batches = workers, batches
        self.running = 0
        self.ended: list[int] = []

    def begin(self) -> Ticket | None:  # called under the batcher's lock, as end() is
        if self.running >= self.batches:
            return None
        self.running += 1
        return Ticket(Layout(threads=1, batches=self.batches), 0, 0.0)

    def enter(self, ticket: Ticket) -> None:
        pass

    def end(self, ticket: Ticket, items: int) -> None:
        self.running -= 1
        self.ended.append(items)


def test_workers_that_failed_a_batch_are_free_again_and_the_tuner_hears_of_every_batch():
    gate = Gate()
    gate.search = RecordingSearch(fail_on="boom")
    tuner = ScriptedTuner(workers=2, batches=2)
    batcher = DynamicBatcher([gate, gate], max_batch_size=64, tuner=tuner)

    async def scenario():
        failing = asyncio.ensure_future(batcher.submit(["boom", "boom"], 1))
        await entered(gate, 2)  # one failing query in each worker
        gate.open("boom")
        failed = await settle(failing, return_exceptions=True)  # answered when the first of its batches fails
        await until(lambda: len(tuner.ended) == 2, "both failed batches ended")
        shared = asyncio.ensure_future(batcher.submit([f"q{i}" for i in range(10)], 1))
        await entered(gate, 2)  # both workers took a part
        gate.open_all()
        return failed, await answer(shared)

    failed, _ = run(scenario, batcher)
    assert isinstance(failed[0], RuntimeError)
    assert sorted(len(call) for call in gate.search.calls[2:]) == [5, 5]  # both workers share it, as before
    assert sorted(tuner.ended) == [1, 1, 5, 5]


def test_each_free_worker_shares_with_the_fastest_of_the_others_that_may_start_with_it():
    """Three workers measured at 1, 1/2 and 1/4 of the fastest's speed; two batches may run at once. The first to
    take 60 queries shares them with the fastest of the two others, and its batch is capped by its own speed."""
    names = [f"retrieval-worker-{i}" for i in range(3)]
    clock = WorkerTime(dict(zip(names, (0.001, 0.002, 0.004), strict=True)))
    gate = Gate(work=clock.spend)
    tuner = ScriptedTuner(workers=3, batches=3)
    batcher = DynamicBatcher([gate] * 3, max_batch_size=64, max_wait_ms=0.0, tuner=tuner, clock=clock)

    async def scenario():
        measuring = asyncio.ensure_future(batcher.submit(["w0", "w1", "w2"], 1))
        await entered(gate, 3)  # one query in each worker
        gate.open_prefix("w")
        await answer(measuring)
        speeds = batcher.report()["worker_speeds"]
        tuner.batches = 2
        shared = asyncio.ensure_future(batcher.submit([f"r{i}" for i in range(60)], 1))
        await entered(gate, 2)  # two batches at once: the third worker waits
        first_taker = gate.holders["r0"]
        gate.open_all()
        await answer(shared)
        return speeds, first_taker

    speeds, first_taker = run(scenario, batcher)
    assert speeds == [1.0, 0.5, 0.25]
    # its share: its speed over its own plus the fastest other's (1 with 1/2; 1/2 or 1/4 with 1), capped at
    # max_batch_size x its speed
    expected = {names[0]: 40, names[1]: 20, names[2]: 12}[first_taker]
    assert gate.arrived[3][0] == "r0" and len(gate.arrived[3]) == expected


def test_by_default_a_batch_holds_at_most_64_queries():
    search = RecordingSearch()
    batcher = DynamicBatcher(search)
    run(lambda: answer(batcher.submit([f"q{i}" for i in range(70)], 1)), batcher)
    assert [len(call) for call in search.calls] == [64, 6]


def test_a_batch_on_every_cpu_does_not_count_as_a_workers_speed():
    """Speeds are measured in single-threaded batches side by side (1 : 0.5 here); once the layout is one batch at
    a time, its batches (faster now) leave them as they were."""
    fast, slow = "retrieval-worker-0", "retrieval-worker-1"
    clock = WorkerTime({fast: 0.001, slow: 0.002})
    gate = Gate(work=clock.spend)
    tuner = ScriptedTuner(workers=2, batches=2)
    batcher = DynamicBatcher([gate, gate], max_batch_size=64, max_wait_ms=0.0, tuner=tuner, clock=clock)

    async def scenario():
        measuring = asyncio.ensure_future(batcher.submit(["w0", "w1"], 1))
        await entered(gate, 2)
        gate.open_prefix("w")
        await answer(measuring)
        measured = batcher.report()["worker_speeds"]
        tuner.batches = 1
        clock.seconds_per_query.update({fast: 0.0005, slow: 0.0005})
        gate.open_prefix("x")
        await answer(batcher.submit(["x0", "x1"], 1))
        return measured

    assert run(scenario, batcher) == [1.0, 0.5]
    assert batcher.report()["worker_speeds"] == [1.0, 0.5] and [len(call) for call in gate.search.calls[2:]] == [2]
