"""A running server under load, measured from outside: closed-loop single-query clients (QPS, p50/p99 latency,
errors) and the server process's peak RSS sampled meanwhile. The index tuner and bench/ measure servers with these.
"""

import asyncio
import re
import threading
import time
from dataclasses import dataclass

import numpy as np
import orjson
import psutil


@dataclass
class Window:
    """The measured window of a closed-loop run: each answered request's latency (seconds), the failed ones."""

    latencies: list[float]
    errors: int
    seconds: float

    @property
    def qps(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(np.array(self.latencies or [np.nan]) * 1000, q))

    @property
    def p50_ms(self) -> float:
        return self.percentile_ms(50)

    @property
    def p99_ms(self) -> float:
        return self.percentile_ms(99)


def encoder_precision(url: str) -> str | None:
    """The query encoder's precision (fp32, bf16, int8, ...) as the server's /health describes its retriever."""
    import httpx

    described = httpx.get(f"{url}/health", timeout=30).json().get("retriever", "")
    found = re.search(r"encoder on \S+ \((\w+)\)", described)  # backends.DenseSearcher.description
    return found[1] if found else None


def request_body(question: str, topk: int, return_scores: bool) -> dict:
    return {"queries": [question], "topk": topk, "return_scores": return_scores}


async def closed_loop(
    url: str,
    questions: list[str],
    clients: int,
    warmup: float,
    seconds: float,
    max_seconds: float = 240.0,
    topk: int = 3,
    return_scores: bool = False,
    answers: dict[int, set[bytes]] | None = None,
) -> Window:
    """`clients` clients, each sending its next single-query request to `url`/retrieve when the last is answered.

    Warm-up lasts at least `warmup` s and one full wave (as many answers as clients), so queues are in steady state;
    the measured window lasts at least `seconds` s and one more full wave; each phase is capped at `max_seconds`.
    A request counts as answered when it gets 200 with `topk` documents. `answers`, when given, collects each
    question's distinct answer bodies in the window (question index -> bodies).
    """
    import aiohttp

    latencies: list[float] = []
    errors = 0
    state = {"measuring": False, "stop": False, "answered": 0}
    counter = iter(range(1 << 62))

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while not state["stop"]:
            index = next(counter) % len(questions)
            body = request_body(questions[index], topk, return_scores)
            started = time.perf_counter()
            try:
                async with session.post(f"{url}/retrieve", json=body) as response:
                    body = await response.read()
                    ok = response.status == 200 and len(orjson.loads(body)["result"][0]) == topk
            except (aiohttp.ClientError, asyncio.TimeoutError, LookupError, TypeError, orjson.JSONDecodeError):
                ok = False
            if state["stop"]:
                return
            state["answered"] += 1
            if state["measuring"]:
                if ok:
                    latencies.append(time.perf_counter() - started)
                    if answers is not None:
                        answers.setdefault(index, set()).add(body)
                else:
                    errors += 1

    connector = aiohttp.TCPConnector(limit=clients, limit_per_host=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(clients)]
        began = time.perf_counter()
        while time.perf_counter() - began < warmup or state["answered"] < clients:
            if time.perf_counter() - began > max_seconds:
                break
            await asyncio.sleep(0.05)
        state["measuring"], window_start = True, time.perf_counter()
        while True:
            elapsed = time.perf_counter() - window_start
            if elapsed >= seconds and len(latencies) + errors >= clients or elapsed >= max_seconds:
                break
            await asyncio.sleep(0.05)
        state["stop"] = True
        window = time.perf_counter() - window_start
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return Window(latencies, errors, window)


class PeakRss:
    """Peak RSS of one process, polled every 0.2 s in a thread until stop()."""

    def __init__(self, pid: int):
        self.process, self.peak = psutil.Process(pid), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:  # the process exited: its peak is the last one read
                return
            self._stop.wait(0.2)

    def stop(self) -> float:
        """Stop sampling; the peak in MiB."""
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20
