"""Load benchmark of the retrieval server: single-query requests at several concurrencies, batching on vs off.

    python bench/retriever_load.py                      # 10k real + 100k synthetic (about 10 minutes here)
    python bench/retriever_load.py --sizes 1m           # the 1M synthetic corpus (about 15 minutes here)
    python bench/retriever_load.py --max_size_case      # single queries beside maximum-size requests (2 minutes)
    python bench/retriever_load.py --sizes 10k,1m --modes on --layout tuned --concurrency 1,256
                                                        # + the tuned approximate layout (approximate_layouts.py)

For each corpus size it measures, in the same run:
- the ceiling: encode + search of a full batch (the server's max batch size) in-process, no HTTP, as queries/s;
- the server (real CLI in a child process, 127.0.0.1) with dynamic batching on (defaults) and off
  (`--max_batch_size 1`: one encode and one search per request, as the public servers do), each at every
  concurrency: closed-loop clients sending one query per request, QPS, p50/p99 latency, errors, mean batch
  size, startup seconds (spawn to /health ok) and peak RSS.
Corpora: 10k is the embedded mini-Wikipedia (10,033 real summaries, real MiniLM embeddings). 100k and 1M are
synthetic: row i repeats summary i mod 10,033 with a "[copy k]" title, and its vector is that summary's real
MiniLM embedding plus Gaussian noise (sigma 0.04 per dimension, then re-normalised; cosine ~0.8 to the source);
rows below 10,033 are the real ones. Queries are real FanOutQA sub-questions encoded by the real MiniLM.
Each point is measured --repeats times and the best window is kept for every server alike (shared, drifting VM).
Results go to the `## Retriever load` section of bench/RESULTS.md (other sections are left alone).

    python bench/retriever_load.py --busy_cores 1            # beside 1 busy core, 100k (about 15 minutes here)
    python bench/retriever_load.py --busy_cores 1 --wrapper  # the same through run_qwen2.5_3B_with_retrieval.sh

Busy neighbours (--busy_cores K): K child processes spin (`while True: pass`, bounded in time, stopped by PID),
each pinned to one of the last K CPUs; each server is measured idle and beside them, in turns, at 1 and 256
clients: our server (`on`), the server as before cpu_threads.py (libgomp spin-wait, fixed threads: `spin`),
and the public request path (`public`); `--modes on,today,even` compares the current CPU policy (`on`: the
one-page tuner, speed shares) with that of commit TODAY_COMMIT (`today`) and with equal shares (`even`) in one run.
It prints and records the issue's targets as PASS/FAIL and exits 1 if one fails. With --wrapper the wrapper
starts the server as for training, and its TRAIN_CMD is a stand-in training (this script, --standin_training)
that searches like rollouts, idle and then beside K busy processes;
rows compare the wrapper's default with RETRIEVER_NUM_THREADS=1 and RETRIEVER_CPUS=<the free CPUs>. Each writes
its own section of bench/RESULTS.md.
"""

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # support.rankings: answers are compared as the tests compare them

import approximate_layouts  # noqa: E402
import results_md  # noqa: E402
from local_dense_retriever.building import fingerprints  # noqa: E402
from local_dense_retriever.demo import embedded_default, mini_wiki  # noqa: E402
from local_dense_retriever.serving.launcher import SERVER_MODULE, ServerProcess  # noqa: E402

RESULTS_PATH = REPO / "bench" / "RESULTS.md"
SECTION = "## Retriever load"
CACHE_DIR = REPO / ".cache" / "bench"
SIZES = {"10k": 10_033, "100k": 100_000, "1m": 1_000_000}
# Server modes: ours with batching on (defaults) or off, and the public servers' request path for reference.
MODES = {
    "on": (SERVER_MODULE, []),
    "off": (SERVER_MODULE, ["--max_batch_size", "1"]),
    # One batch at a time on every usable CPU, PASSIVE threads (what --num_threads gets): issue 13's idle layout.
    "passive": (SERVER_MODULE, ["--num_threads", str(len(os.sched_getaffinity(0)))]),
    "public": ([str(REPO / "bench" / "public_pattern_server.py")], []),
    "layout": (SERVER_MODULE, []),  # --layout: our server on the approximate layout (flags per corpus)
}
DEFAULT_MODES = ("on", "off", "public")
NOISE_SIGMA = 0.04
TOPK = 3
CHECKED_MODES = ("on", "layout")  # servers whose answers under load are compared with their answers alone


@dataclass
class Point:
    size: str
    mode: str
    concurrency: int
    qps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    seconds: float
    mean_batch: float
    other_cores: float  # CPU used meanwhile by processes outside this benchmark (the machine is shared)
    qps_range: tuple[float, float] = (0.0, 0.0)  # lowest and highest QPS over the repeats


@dataclass
class ServerRun:
    size: str
    mode: str
    startup_s: float
    load_seconds: dict
    peak_rss_mb: float
    points: list[Point] = field(default_factory=list)
    answers_checked: int = 0  # distinct answers compared with the same question asked alone (CHECKED_MODES)
    mismatches: int = 0


# ---------------------------------------------------------------------------------------------- corpora


def synthetic_vectors(real: np.ndarray, n: int, chunk: int = 100_000):
    """The synthetic corpus's n unit vectors, `chunk` rows at a time: row i is real row i mod len(real), plus
    Gaussian noise (NOISE_SIGMA per dimension, seed 0) on every row past the real ones, re-normalised."""
    rng = np.random.default_rng(0)
    for start in range(0, n, chunk):
        rows = np.arange(start, min(n, start + chunk))
        vectors = real[rows % len(real)].copy()
        copies = rows >= len(real)
        vectors[copies] += rng.normal(0.0, NOISE_SIGMA, size=(int(copies.sum()), real.shape[1])).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        yield vectors


def synthetic_corpus(n: int, assets: embedded_default.MiniWikiAssets) -> tuple[Path, Path]:
    """Corpus jsonl + Flat index of n rows derived from the real summaries and their MiniLM vectors (cached)."""
    import faiss

    out = CACHE_DIR / f"synthetic_{n}"
    corpus_path, index_path, manifest_path = out / "corpus.jsonl", out / "minilm_Flat.index", out / "manifest.json"
    # by content: the real vectors it derives from, not where they sit
    manifest = {"n": n, "sigma": NOISE_SIGMA, "seed": 0, "source": fingerprints.file_digest(assets.embeddings_path)}
    earlier = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    reason = fingerprints.stale_reason(earlier, manifest)
    if reason is None and index_path.exists() and corpus_path.exists():
        return corpus_path, index_path
    print(f"  generating the {n}-row synthetic corpus in {out}: {reason or 'a cached file is missing'}")
    out.mkdir(parents=True, exist_ok=True)
    summaries = mini_wiki.load_summaries()
    real = np.load(assets.embeddings_path)
    base = len(summaries)
    started = time.perf_counter()
    copies = (
        {**summary, "title": f"{summary['title']} [copy {row // base}]"} if row >= base else summary
        for row, summary in ((row, summaries[row % base]) for row in range(n))
    )
    mini_wiki.write_corpus(copies, corpus_path)
    index = faiss.IndexFlatIP(real.shape[1])
    for vectors in synthetic_vectors(real, n):
        index.add(vectors)
    faiss.write_index(index, str(index_path))
    manifest_path.write_text(json.dumps(manifest))
    print(f"  generated the {n}-row synthetic corpus and index in {time.perf_counter() - started:.0f} s")
    return corpus_path, index_path


def corpus_files(size: str, assets: embedded_default.MiniWikiAssets) -> tuple[Path, Path]:
    """Corpus jsonl and Flat index for a --sizes entry: the real mini-Wikipedia for 10k, synthetic above."""
    if size == "10k":
        return assets.corpus_path, assets.index_path
    return synthetic_corpus(SIZES[size], assets)


def load_questions() -> list[str]:
    return [sub["question"] for sub in mini_wiki.fanoutqa_sub_questions()]


# ---------------------------------------------------------------------------------------------- ceiling


def measure_ceiling(model_dir: Path, index_path: Path, questions: list[str], batch: int, reps: int) -> dict:
    """Best-case throughput: the batched encode + FAISS search the server does, timed in-process (no HTTP), in the
    two ways the CPUs can be spent: one batch at a time on every CPU (libgomp's default wait: this process sets
    no policy), and one single-threaded batch per CPU side by side (own tokenizers, shared model and index).
    `qps` is the better of the two: the machine's ceiling, whichever layout the server picks."""
    import faiss
    import torch

    from local_dense_retriever.retrieval import cpu_threads
    from local_dense_retriever.retrieval.backends import DenseSearcher, FaissIndex
    from local_dense_retriever.retrieval.encoders import TextEncoder

    cpus = cpu_threads.thread_count()
    encoder = TextEncoder(str(model_dir), retriever_name=embedded_default.RETRIEVER_NAME, device="cpu")
    cpu_threads.configure_pools(cpus)
    searcher = DenseSearcher(encoder, FaissIndex(index_path))
    rng = np.random.default_rng(1)
    samples = [[questions[i] for i in rng.choice(len(questions), batch, replace=False)] for _ in range(reps)]
    searcher.search(samples[0], TOPK)  # warm-up
    encode_s, search_s = [], []
    for sample in samples:
        started = time.perf_counter()
        vectors = encoder.encode_queries(sample)
        encoded = time.perf_counter()
        searcher.index.search_vectors(vectors, TOPK)
        encode_s.append(encoded - started)
        search_s.append(time.perf_counter() - encoded)
    shared_qps = batch / float(np.median(np.array(encode_s) + np.array(search_s)))

    searchers = [searcher] + [searcher.fork() for _ in range(cpus - 1)]
    barrier = threading.Barrier(cpus)
    seconds = [0.0] * cpus

    def single_threaded(worker: int) -> None:
        torch.set_num_threads(1)
        faiss.omp_set_num_threads(1)  # per thread in libgomp
        searchers[worker].search(samples[0], TOPK)  # warm-up
        barrier.wait()
        started = time.perf_counter()
        for sample in samples[worker::cpus] * cpus:  # every worker runs `reps` batches
            searchers[worker].search(sample, TOPK)
        seconds[worker] = time.perf_counter() - started

    workers = [threading.Thread(target=single_threaded, args=(worker,)) for worker in range(cpus)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    cpu_threads.configure_pools(cpus)
    split_qps = sum(len(samples[worker::cpus] * cpus) for worker in range(cpus)) * batch / max(seconds)
    return {
        "batch": batch,
        "encode_ms": 1000 * float(np.median(encode_s)),
        "search_ms": 1000 * float(np.median(search_s)),
        "shared_qps": shared_qps,
        "split_qps": split_qps,
        "qps": max(shared_qps, split_qps),
    }


def best_ceiling(assets, index_path: Path, questions: list[str], args) -> dict:
    """measure_ceiling `--repeats` times, each after other processes went quiet; the best, with the range."""
    candidates = []
    for _ in range(args.repeats):
        wait_until_quiet(args.wait_for_quiet)
        with ForeignCpu() as foreign:
            candidates.append(measure_ceiling(assets.model_dir, index_path, questions, 64, args.ceiling_reps))
        candidates[-1]["other_cores"] = foreign.cores
    best = max(candidates, key=lambda c: c["qps"])
    best["qps_range"] = (min(candidate["qps"] for candidate in candidates), best["qps"])
    best["candidates"] = [round(candidate["qps"], 1) for candidate in candidates]
    print(f"  ceiling {best['qps']:.0f} queries/s (one batch on every CPU {best['shared_qps']:.0f}, one "
          f"single-threaded batch per CPU {best['split_qps']:.0f}; other processes {best['other_cores']:.2f} "
          "cores)", flush=True)  # fmt: skip
    return best


# ---------------------------------------------------------------------------------------------- load


async def closed_loop(url: str, questions: list[str], concurrency: int, warmup: float, duration: float,
                      max_seconds: float, answers: dict[int, set[bytes]] | None = None,
                      ) -> tuple[list[float], int, float]:  # fmt: skip
    """`concurrency` clients, each sending its next request when the last one is answered.

    Warm-up lasts at least `warmup` s and one full wave (as many answers as clients), so queues are in steady
    state; the measured window lasts at least `duration` s and one more full wave, capped at `max_seconds`.
    `answers`, when given, collects each question's distinct answers in the window (question index -> bodies).
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
            started = time.perf_counter()
            ok = False
            try:
                async with session.post(f"{url}/retrieve", json=request_body(questions[index])) as response:
                    body = await response.read()
                    ok = response.status == 200 and len(orjson.loads(body)["result"][0]) == TOPK
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, orjson.JSONDecodeError):
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

    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(concurrency)]
        began = time.perf_counter()
        while time.perf_counter() - began < warmup or state["answered"] < concurrency:
            if time.perf_counter() - began > max_seconds:
                break
            await asyncio.sleep(0.05)
        state["measuring"], window_start = True, time.perf_counter()
        while True:
            elapsed = time.perf_counter() - window_start
            if elapsed >= duration and len(latencies) + errors >= concurrency or elapsed >= max_seconds:
                break
            await asyncio.sleep(0.05)
        state["stop"] = True
        window = time.perf_counter() - window_start
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return latencies, errors, window


def request_body(question: str) -> dict:
    # Scores too, so answers can be compared with ties allowed to swap (bench/retriever_hostile.py does the same).
    return {"queries": [question], "topk": TOPK, "return_scores": True}


def check_answers(url: str, questions: list[str], answers: dict[int, set[bytes]]) -> tuple[int, int]:
    """(answers checked, mismatches): every distinct answer a question got under load against the answer the same
    server gives it alone, one request at a time (same documents in the same order; scores within 1e-4, and
    documents whose scores tie within that may swap; with a reduced-precision encoder, within its rounding)."""
    import httpx

    from local_dense_retriever.retrieval.precision import SCORE_TOLERANCE
    from support.rankings import same_ranking

    described = httpx.get(f"{url}/health", timeout=30).json().get("retriever", "")
    precision = re.search(r"encoder on \S+ \((\w+)\)", described)
    tolerance = SCORE_TOLERANCE.get(precision[1] if precision else "fp32", 1e-4)
    checked = mismatches = 0
    with httpx.Client(timeout=120) as client:
        for index in sorted(answers):
            alone = client.post(f"{url}/retrieve", json=request_body(questions[index])).json()["result"][0]
            for body in answers[index]:
                checked += 1
                mismatches += not same_ranking(orjson.loads(body)["result"][0], alone, tolerance)
    return checked, mismatches


class RssMonitor:
    def __init__(self, pid: int):
        import psutil

        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except Exception:
                return
            self._stop.wait(0.2)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


class ForeignCpu:
    """Average cores used by processes other than this benchmark, its server and its busy processes."""

    def __init__(self, server_pid: int | None = None, busy_pids: tuple[int, ...] = ()):
        import psutil

        self._psutil = psutil
        pids = ([server_pid] if server_pid else []) + list(busy_pids)
        self._ours = [psutil.Process()] + [psutil.Process(pid) for pid in pids]

    def _busy(self) -> tuple[float, float, float]:
        times = self._psutil.cpu_times()
        busy = sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))
        ours = sum(sum(p.cpu_times()[:2]) for p in self._ours)  # user + system
        return busy, ours, time.perf_counter()

    def __enter__(self) -> "ForeignCpu":
        self._start = self._busy()
        return self

    def __exit__(self, *exc) -> None:
        busy, ours, now = self._busy()
        self.cores = max(0.0, ((busy - self._start[0]) - (ours - self._start[1])) / (now - self._start[2]))


def wait_until_quiet(
    max_wait: float, server_pid: int | None = None, threshold: float = 0.1, busy_pids: tuple[int, ...] = ()
) -> None:
    """On a shared machine, wait (bounded) until other processes leave the CPU alone for 3 seconds in a row."""
    deadline = time.perf_counter() + max_wait
    quiet_seconds = 0
    while time.perf_counter() < deadline:
        with ForeignCpu(server_pid, busy_pids) as foreign:
            time.sleep(1.0)
        quiet_seconds = quiet_seconds + 1 if foreign.cores < threshold else 0
        if quiet_seconds >= 3:
            return
    if max_wait > 0:
        print(f"  (other processes still busy after {max_wait:.0f} s; measuring anyway)", flush=True)


def batches_seen(url: str) -> tuple[int, int]:
    import httpx

    stats = httpx.get(f"{url}/health", timeout=30).json()["batches"]
    return stats["batches"], stats["queries"]


def run_server(size: str, mode: str, flags: list[str], questions: list[str], args) -> ServerRun:
    import httpx

    program, mode_flags = MODES[mode]
    log_path = CACHE_DIR / f"server_{size}_{mode}.log"
    server = ServerProcess(flags + mode_flags, log_path=log_path, startup_timeout=900, program=program)
    server.start()
    monitor = RssMonitor(server.process.pid)
    try:
        load_seconds = httpx.get(f"{server.url}/health", timeout=30).json()["load_seconds"]
        run = ServerRun(size, mode, server.startup_seconds, load_seconds, 0.0)
        answers = {} if mode in CHECKED_MODES else None
        for concurrency in args.concurrency:
            repeats = [
                measure_point(server, size, mode, concurrency, questions, args, answers=answers)
                for _ in range(args.repeats)
            ]
            point = best_of(repeats)
            run.points.append(point)
            print(
                f"  {size:>4} {mode:<6} c={concurrency:<3} {point.qps:7.1f} QPS  p50 {point.p50_ms:8.0f} ms"
                f"  p99 {point.p99_ms:8.0f} ms  errors {point.errors}  mean batch {point.mean_batch:5.1f}"
                f"  ({point.requests} requests in {point.seconds:.0f} s; others used {point.other_cores:.2f} cores)",
                flush=True,
            )
        if answers is not None:
            run.answers_checked, run.mismatches = check_answers(server.url, questions, answers)
            print(f"  {size:>4} {mode:<6} {run.mismatches} of {run.answers_checked} answers differ from sequential")
    finally:
        server.stop()
        peak_rss_mb = monitor.stop()
    run.peak_rss_mb = peak_rss_mb
    return run


def measure_point(
    server: ServerProcess,
    size: str,
    mode: str,
    concurrency: int,
    questions: list[str],
    args,
    busy_pids: tuple[int, ...] = (),
    answers: dict[int, set[bytes]] | None = None,
) -> Point:
    wait_until_quiet(args.wait_for_quiet, server.process.pid, busy_pids=busy_pids)
    batches_before, queries_before = batches_seen(server.url)
    with ForeignCpu(server.process.pid, busy_pids) as foreign:
        latencies, errors, window = asyncio.run(
            closed_loop(server.url, questions, concurrency, args.warmup, args.duration, args.max_seconds, answers)
        )
    batches_after, queries_after = batches_seen(server.url)
    lat = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    return Point(
        size=size,
        mode=mode,
        concurrency=concurrency,
        qps=len(latencies) / window,
        p50_ms=float(np.percentile(lat, 50)),
        p99_ms=float(np.percentile(lat, 99)),
        requests=len(latencies),
        errors=errors,
        seconds=window,
        # nan for the public pattern, which has no batches (every request is encoded alone)
        mean_batch=(queries_after - queries_before) / (batches_after - batches_before)
        if batches_after > batches_before
        else float("nan"),
        other_cores=foreign.cores,
    )


# ---------------------------------------------------------------------------------------------- max-size requests
# One client sends maximum-size valid requests back to back (512 queries of 4,096 characters: every query runs to
# --max_length tokens) while single-query clients keep going; before the batcher split requests, a single query
# sent meanwhile waited for the whole large request (12.6 s of a 12.9 s request on the machine).


def max_size_request(questions: list[str], queries: int = 512, chars: int = 4096, topk: int = TOPK) -> dict:
    text = " ".join(questions)
    return {"queries": [(text[i * 7 :] + text)[:chars] for i in range(queries)], "topk": topk}


async def single_queries_beside_max_size_requests(
    url: str, questions: list[str], clients: int, duration: float, heavy: bool
) -> dict:
    """`clients` closed-loop single-query clients for `duration` s, with (heavy) or without one more client that
    sends maximum-size requests back to back. Latencies of single queries, in seconds, and the heavy client's."""
    import aiohttp

    single: list[float] = []
    large: list[float] = []
    errors = {"single": 0, "large": 0}
    stop = time.perf_counter() + duration
    payload = max_size_request(questions)
    counter = iter(range(1 << 62))

    async def post(session, body: dict, kind: str, latencies: list[float]) -> None:
        started = time.perf_counter()
        try:
            async with session.post(f"{url}/retrieve", json=body) as response:
                result = orjson.loads(await response.read())["result"]
                ok = response.status == 200 and len(result) == len(body["queries"])
        except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, orjson.JSONDecodeError):
            ok = False
        if ok:
            latencies.append(time.perf_counter() - started)
        else:
            errors[kind] += 1

    async def single_client(session) -> None:
        while time.perf_counter() < stop:
            question = questions[next(counter) % len(questions)]
            await post(session, {"queries": [question], "topk": TOPK}, "single", single)

    async def heavy_client(session) -> None:
        while time.perf_counter() < stop:
            await post(session, payload, "large", large)

    connector = aiohttp.TCPConnector(limit=clients + 1)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        tasks = [single_client(session) for _ in range(clients)] + ([heavy_client(session)] if heavy else [])
        await asyncio.gather(*tasks)
    return {"single": single, "large": large, "errors": errors}


def measure_max_size_case(url: str, questions: list[str], clients: int, duration: float) -> dict:
    """Single-query p50/p99 alone, then beside a maximum-size client, on the same server."""
    results = {}
    for heavy in (False, True):
        run = asyncio.run(single_queries_beside_max_size_requests(url, questions, clients, duration, heavy))
        single = np.array(run["single"] or [np.nan]) * 1000
        results["beside" if heavy else "alone"] = {
            "requests": len(run["single"]),
            "p50_ms": float(np.percentile(single, 50)),
            "p99_ms": float(np.percentile(single, 99)),
            "errors": run["errors"]["single"],
            "large_requests": len(run["large"]),
            "large_errors": run["errors"]["large"],
            "large_mean_ms": float(np.mean(run["large"]) * 1000) if run["large"] else float("nan"),
        }
    return results


def batch_bounds(url: str) -> str:
    """The server's batch bounds as /health reports them (a server without a token bound says none)."""
    import httpx

    health = httpx.get(f"{url}/health", timeout=30).json()
    tokens = health.get("max_batch_tokens")
    return f"max batch {health['max_batch_size']} queries" + (f" and {tokens:,} tokens" if tokens else "")


def render_max_size_case(result: dict, clients: int, started: str, bounds: str, load: str) -> str:
    alone, beside = result["alone"], result["beside"]
    return "\n".join(
        [
            "### Single queries beside maximum-size requests",
            "",
            f"Measured by `python bench/retriever_load.py {' '.join(sys.argv[1:])}`".rstrip() + f" on {started}; "
            f"{os.cpu_count()} CPU cores, no GPU, the 10k corpus, the server's defaults ({bounds}); {load}. "
            f"{clients} closed-loop single-query clients, first alone, then beside one client sending maximum-size "
            "requests back to back (512 queries of 4,096 characters, top-3: every query is encoded at the full "
            "256 tokens). The machine is shared: compare the ratios, which come from one run.",
            "",
            "| single-query clients | requests | p50 ms | p99 ms | errors | max-size requests | their mean ms "
            "| errors |",
            "|---|---|---|---|---|---|---|---|",
            f"| alone | {alone['requests']} | {alone['p50_ms']:.0f} | {alone['p99_ms']:.0f} | {alone['errors']} "
            "| | | |",
            f"| beside a max-size client | {beside['requests']} | {beside['p50_ms']:.0f} | {beside['p99_ms']:.0f} "
            f"| {beside['errors']} | {beside['large_requests']} | {beside['large_mean_ms']:.0f} "
            f"| {beside['large_errors']} |",
            "",
            f"Single-query p99 beside the max-size client: {beside['p99_ms'] / alone['p99_ms']:.1f}x its p99 alone, "
            "and "
            f"{beside['p99_ms'] / beside['large_mean_ms']:.0%} of one max-size request's time (a query that waited "
            "for a whole large request would be at 100% or more).",
            "",
        ]
    )


# ---------------------------------------------------------------------------------------------- report


def render(ceilings: dict, runs: list[ServerRun], sizes: list[str], started: str) -> str:
    lines = [
        f"### Corpora {', '.join(sizes)}",
        "",
        f"Measured by `python bench/retriever_load.py {' '.join(sys.argv[1:])}`".rstrip() + f" on {started}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, no GPU. "
        "MiniLM-L6 encoder (fp32, CPU), FAISS Flat inner product, top-3, one query per request, closed-loop "
        "aiohttp clients on the same machine. `on` = our server's defaults (dynamic batching, max batch 64, "
        "max wait 5 ms); `off` = our server with `--max_batch_size 1` (one encode + one search per request, "
        "serialised on the worker); `public` = the public servers' request path "
        "(bench/public_pattern_server.py: a sync FastAPI endpoint, so each request encodes and searches on its "
        "own in the 40-thread pool). "
        "Ceiling = in-process encode + search of 64-query batches, no HTTP, the better of one batch at a time on "
        "every CPU and one single-threaded batch per CPU side by side. Corpora: see the docstring of "
        "bench/retriever_load.py (100k and 1M are synthetic: real texts and MiniLM vectors plus noise). "
        "The machine is a shared VM whose speed drifts by 10-30% between minutes: each point (and the ceiling) is "
        "measured `--repeats` times, each after waiting for other processes to go quiet, and the best window is "
        "reported for every server alike (the QPS range over the repeats is shown); `other procs` is the CPU other "
        "processes still used during that window (in cores, out of the machine's total).",
        "",
        "| corpus | server | concurrency | QPS | QPS range | p50 ms | p99 ms | p99/p50 | errors | mean batch | "
        "on vs off | on vs public | of ceiling | other procs (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_mode = {(run.mode, p.size, p.concurrency): p for run in runs for p in run.points}

    def ratio(p: Point, base_mode: str) -> str:
        base = by_mode.get((base_mode, p.size, p.concurrency))
        return f"{p.qps / base.qps:.1f}x" if p.mode == "on" and base and base.qps else ""

    for run in runs:
        for p in run.points:
            ceiling = f"{p.qps / ceilings[p.size]['qps']:.0%}" if p.size in ceilings else ""
            lines.append(
                f"| {p.size} | {p.mode} | {p.concurrency} | {p.qps:.1f} | {p.qps_range[0]:.0f}-{p.qps_range[1]:.0f} | "
                f"{p.p50_ms:.0f} | {p.p99_ms:.0f} | "
                f"{p.p99_ms / p.p50_ms:.2f} | {p.errors} | {p.mean_batch:.1f} | {ratio(p, 'off')} | "
                f"{ratio(p, 'public')} | {ceiling} | {p.other_cores:.2f} |"
            )
    lines += [
        "",
        "| corpus | ceiling QPS | range | one batch on every CPU | one single-threaded batch per CPU "
        "| encode ms / 64 | search ms / 64 (every CPU) | other procs (cores) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size, c in ceilings.items():
        low, high = c["qps_range"]
        lines.append(
            f"| {size} | {c['qps']:.0f} | {low:.0f}-{high:.0f} | {c['shared_qps']:.0f} | {c['split_qps']:.0f} "
            f"| {c['encode_ms']:.0f} | {c['search_ms']:.0f} | {c['other_cores']:.2f} |"
        )
    checked = [run for run in runs if run.answers_checked]
    if checked:
        lines += [""] + [
            f"Answers of `{run.mode}` ({run.size}) under load vs the same question asked alone: {run.mismatches} of "
            f"{run.answers_checked} distinct answers differ."
            for run in checked
        ]
    lines += ["", "| corpus | server | startup s (spawn to ready) | of which index / corpus s | peak RSS MB |",
              "|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        index_s = run.load_seconds.get("loading the index", float("nan"))
        corpus_s = run.load_seconds.get("opening the corpus", float("nan"))
        lines.append(
            f"| {run.size} | {run.mode} | {run.startup_s:.1f} | {index_s:.2f} / {corpus_s:.2f} "
            f"| {run.peak_rss_mb:.0f} |"
        )
    return "\n".join(lines) + "\n"


def write_section(text: str, key: str, path: Path = RESULTS_PATH) -> None:
    """Replace this run's marked block (one per --sizes) inside `## Retriever load`, or add it at the section's end.

    Everything else in the file, including hand-written notes in this section outside the markers, is kept.
    """
    existing = path.read_text() if path.exists() else "# Benchmark results\n"
    if SECTION not in existing:
        existing = existing.rstrip("\n") + f"\n\n{SECTION}\n"
    begin, end = f"<!-- retriever-load {key} -->", f"<!-- end retriever-load {key} -->"
    block = f"{begin}\n{text}{end}\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n", re.S)
    if pattern.search(existing):
        existing = pattern.sub(lambda _: block, existing)
    else:
        section_start = existing.index(SECTION)
        next_section = existing.find("\n## ", section_start + len(SECTION))
        cut = len(existing) if next_section < 0 else next_section + 1
        existing = existing[:cut].rstrip("\n") + "\n\n" + block + ("\n" + existing[cut:] if next_section >= 0 else "")
    path.write_text(existing)


# ---------------------------------------------------------------------------------------------- busy neighbours

BUSY_SECTION = "Retriever beside busy processes"
WRAPPER_SECTION = "Retriever in the wrapper beside a busy training"
BUSY_CONCURRENCY = (1, 256)
# `spin`: our server as it ran before local_dense_retriever/cpu_threads.py. torch and faiss load before the server
# calls calm_openmp(), so libgomp keeps its default spin-wait, and --num_threads fixes os.cpu_count() threads as
# before (which also turns the thread tuner off).
SPIN_PROGRAM = [
    "-c",
    "import sys, faiss, torch; from local_dense_retriever.serving.cli import main; sys.exit(main())",
]
# `today`: the server's CPU policy as it was at TODAY_COMMIT (issue 21's tuner: a ladder of layouts, seven knobs,
# and equal shares for batches side by side), read from git and swapped in before the server loads; `even`: the
# current tuner with equal shares, so that `on` against `today` and `even` tells the tuner's and the shares' parts.
TODAY_COMMIT = "dc5b62c"
EQUAL_SHARES = (
    "from local_dense_retriever.serving import batcher; init = batcher.DynamicBatcher.__init__; "
    "batcher.DynamicBatcher.__init__ = lambda self, *a, **k: init(self, *a, **{**k, 'speed_shares': False}); "
)
TODAY_PROGRAM = [
    "-c",
    "import subprocess, sys, types; "
    f"source = subprocess.run(['git', 'show', '{TODAY_COMMIT}:local_dense_retriever/retrieval/cpu_threads.py'], "
    "capture_output=True, text=True, check=True).stdout; "
    "today = types.ModuleType('cpu_threads_today'); exec(compile(source, 'cpu_threads_today.py', 'exec'), "
    "today.__dict__); from local_dense_retriever.retrieval import cpu_threads; "
    "cpu_threads.ThreadTuner = today.ThreadTuner; " + EQUAL_SHARES + "from local_dense_retriever.serving.cli "
    "import main; sys.exit(main())",
]
EVEN_PROGRAM = [
    "-c",
    f"import sys; {EQUAL_SHARES}from local_dense_retriever.serving.cli import main; sys.exit(main())",
]
BUSY_MODES = {  # program, extra flags
    "on": MODES["on"],
    "today": (TODAY_PROGRAM, []),
    "even": (EVEN_PROGRAM, []),
    "passive": MODES["passive"],
    "spin": (SPIN_PROGRAM, ["--num_threads", str(os.cpu_count() or 1)]),
    "public": MODES["public"],
}
DEFAULT_BUSY_MODES = ("on", "spin", "public")
BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
WRAPPER = REPO / "run_qwen2.5_3B_with_retrieval.sh"
TARGET_BUSY_SHARE = 0.6  # busy QPS over idle QPS at 256 clients
TARGET_P99_OVER_P50 = 1.5  # busy, at 256 clients
TARGET_CEILING_SHARE = 0.85  # idle QPS at 256 clients over the in-process ceiling of the same run
# "C=1 latency no worse than the public path's": p50 at one client moved by up to ~5% between windows here.
TARGET_C1_TOLERANCE = 1.1


class BusyCores:
    """`k` processes spinning `while True: pass`, each pinned to one of the last k CPUs this process may use.

    They stop by themselves after `seconds` and are terminated by PID on exit, whatever happens meanwhile.
    """

    def __init__(self, k: int, seconds: float):
        cpus = sorted(os.sched_getaffinity(0))
        if not 0 <= k < len(cpus):
            raise ValueError(f"--busy_cores {k}: choose 0 to {len(cpus) - 1}; this process may use {len(cpus)} CPUs")
        self.cpus = cpus[len(cpus) - k :] if k else []
        self.free_cpus = cpus[: len(cpus) - k]
        self.seconds = seconds
        self.processes: list[subprocess.Popen] = []

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(process.pid for process in self.processes)

    def __enter__(self) -> "BusyCores":
        try:
            for cpu in self.cpus:
                process = subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(seconds=self.seconds)])
                self.processes.append(process)
                os.sched_setaffinity(process.pid, {cpu})
        except BaseException:
            self.stop()
            raise
        time.sleep(0.5 if self.processes else 0.0)  # let the interpreters start and reach their loops
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []


def busy_bound_seconds(args) -> float:
    """How long busy processes may live: every point of one state at its caps, with margin (they are stopped first)."""
    return len(BUSY_CONCURRENCY) * (2 * args.max_seconds + args.wait_for_quiet + 30)


@dataclass
class BusyRun:
    mode: str
    cpu_threads: dict  # the server's own report (/health), when it has one
    points: dict[tuple[str, int], Point] = field(default_factory=dict)  # (idle | busy, clients) -> best window
    # the layout (batches x threads) its tuner used at the end of each window ("" if it has none)
    threads: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    answers_checked: int = 0  # distinct answers compared with the same question asked alone (CHECKED_MODES)
    mismatches: int = 0
    errors: int = 0  # in every window, not only the best ones


def tuned_layout(health: dict) -> str:
    """The layout (batches at once x threads each) the server's tuner uses now, from /health ("" if it has none)."""
    threads = health.get("cpu_threads", {})
    if "layout" in threads:
        return threads["layout"]
    return f"1x{threads['torch_threads']}" if "torch_threads" in threads else ""


def best_of(repeats: list[Point]) -> Point:
    point = max(repeats, key=lambda p: p.qps)
    point.qps_range = (min(p.qps for p in repeats), point.qps)
    return point


def run_busy_server(size: str, mode: str, flags: list[str], questions: list[str], args) -> BusyRun:
    """One server, idle then beside `--busy_cores` busy processes, in turns, `--repeats` times; best window kept."""
    import httpx

    log_path = CACHE_DIR / f"server_{size}_{mode}_busy.log"
    program, mode_flags = BUSY_MODES[mode]
    server = ServerProcess(flags + mode_flags, log_path=log_path, startup_timeout=900, program=program)
    server.start()
    try:
        run = BusyRun(mode, httpx.get(f"{server.url}/health", timeout=30).json().get("cpu_threads", {}))
        answers = {} if mode in CHECKED_MODES else None
        windows: dict[tuple[str, int], list[Point]] = {}
        for _ in range(args.repeats):
            for state in ("idle", "busy"):
                with BusyCores(args.busy_cores if state == "busy" else 0, busy_bound_seconds(args)) as busy:
                    for clients in BUSY_CONCURRENCY:
                        point = measure_point(
                            server, size, mode, clients, questions, args, busy_pids=busy.pids, answers=answers
                        )
                        windows.setdefault((state, clients), []).append(point)
                        threads = tuned_layout(httpx.get(f"{server.url}/health", timeout=30).json())
                        run.threads.setdefault((state, clients), []).append(threads)
                        run.errors += point.errors
                        print(
                            f"  {size:>4} {mode:<6} {state:<4} c={clients:<3} {point.qps:7.1f} QPS  p50 "
                            f"{point.p50_ms:7.0f} ms  p99 {point.p99_ms:7.0f} ms  errors {point.errors}  "
                            f"layout {threads or '?'}  (others used {point.other_cores:.2f} cores)",
                            flush=True,
                        )
        run.points = {key: best_of(repeats) for key, repeats in windows.items()}
        if answers is not None:  # on the quiet machine, after the busy windows
            run.answers_checked, run.mismatches = check_answers(server.url, questions, answers)
            print(f"  {size:>4} {mode:<6} {run.mismatches} of {run.answers_checked} answers differ from sequential")
    finally:
        server.stop()
    return run


def busy_targets(runs: dict[str, BusyRun], ceiling: dict | None) -> list[tuple[str, str, bool]]:
    """(target, result, met) for issue 21's targets that this run can check."""
    targets = []
    ours = runs.get("on")
    if ours is None:
        return targets
    idle, busy = ours.points[("idle", 256)], ours.points[("busy", 256)]
    if ceiling:
        share = idle.qps / ceiling["qps"]
        targets.append(
            (
                f"idle QPS at 256 clients >= {TARGET_CEILING_SHARE:.0%} of the in-process ceiling (same run)",
                f"{idle.qps:.1f} / {ceiling['qps']:.1f} = {share:.0%}",
                share >= TARGET_CEILING_SHARE,
            )
        )
    share = busy.qps / idle.qps if idle.qps else 0.0
    targets.append(
        (
            f"busy QPS >= {TARGET_BUSY_SHARE:.0%} of idle QPS at 256 clients",
            f"{busy.qps:.1f} / {idle.qps:.1f} = {share:.0%}",
            share >= TARGET_BUSY_SHARE,
        )
    )
    for state, point in (("idle", idle), ("busy", busy)):
        tail = point.p99_ms / point.p50_ms
        targets.append(
            (
                f"{state} p99 <= {TARGET_P99_OVER_P50}x p50 at 256 clients",
                f"{point.p99_ms:.0f} / {point.p50_ms:.0f} ms = {tail:.2f}",
                tail <= TARGET_P99_OVER_P50,
            )
        )
    if "public" in runs:
        for state in ("idle", "busy"):
            public, ours_1 = runs["public"].points[(state, 1)], ours.points[(state, 1)]
            targets.append(
                (
                    f"{state} p50 at 1 client no worse than the public path's (within "
                    f"{TARGET_C1_TOLERANCE - 1:.0%}: noise)",
                    f"{ours_1.p50_ms:.1f} vs {public.p50_ms:.1f} ms (p99 {ours_1.p99_ms:.1f} vs {public.p99_ms:.1f})",
                    ours_1.p50_ms <= public.p50_ms * TARGET_C1_TOLERANCE,
                )
            )
    targets.append(("0 errors (every window, idle and busy)", f"{ours.errors} errors", ours.errors == 0))
    targets.append(
        (
            "answers identical to sequential (every distinct answer under load vs the question asked alone)",
            f"{ours.mismatches} of {ours.answers_checked} differ",
            ours.mismatches == 0 and ours.answers_checked > 0,
        )
    )
    return targets


def describe_threads(report: dict) -> str:
    if not report:
        return "not reported"
    applied = report.get("wait_policy_set_before_openmp_loaded")
    policy = report.get("omp_wait_policy") if applied else "libgomp default (spin, then sleep)"
    if report.get("adaptive_threads"):
        layouts = " / ".join(report["layouts"])
        return f"layout tuned among {layouts} (batches at once x threads each), OpenMP wait {policy}"
    if "layout" in report:
        return f"layout {report['layout']} (batches at once x threads each), OpenMP wait {policy}"
    return f"torch {report.get('torch_threads', '?')} / FAISS {report.get('faiss_threads', '?')} threads, {policy}"


def render_busy(
    size: str, runs: dict[str, BusyRun], busy_cpus: list[int], started: str, targets, ceiling: dict | None
) -> str:
    lines = [
        f"### Corpus {size}, {len(busy_cpus)} busy core(s)",
        "",
        f"Measured by `python bench/retriever_load.py {' '.join(sys.argv[1:])}`".rstrip() + f" on {started}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, no GPU. Busy = "
        f"{len(busy_cpus)} process(es) running `while True: pass`, pinned to CPU(s) {busy_cpus}, started and "
        "stopped by the benchmark around the `busy` windows. Same encoder, index, queries and load generator as "
        "the load tables: MiniLM-L6 on CPU, FAISS Flat, top-3, one query per request (scores returned), closed-loop "
        f"clients. `on` = our server's defaults ({describe_threads(runs['on'].cpu_threads) if 'on' in runs else ''}); "
        "`passive` = one batch at a time on every CPU with OMP_WAIT_POLICY=PASSIVE (`--num_threads` = the usable "
        "CPUs: issue 13's server on an idle machine, without its thread tuner); "
        f"`today` = the server with the CPU policy of commit {TODAY_COMMIT} (issue 21's tuner, equal shares for "
        "batches side by side); `even` = our server with equal shares (the tuner of `on`); "
        "`spin` = the server as before issue 13: torch and faiss loaded before it sets "
        "the wait policy (libgomp's default spin-wait) and `--num_threads` = the machine's core count (no tuning); "
        "`public` = the public servers' request path (bench/public_pattern_server.py). Each cell is the best of "
        "`--repeats` windows, idle and busy taken in turns; `layout` is what the server ran at the end of each "
        "window (batches at once x threads each; `-`: not reported); errors are summed over every window; "
        "`other procs` is what processes outside the benchmark used meanwhile (cores).",
        "",
    ]
    if ceiling:
        low, high = ceiling["qps_range"]
        lines += [
            f"Ceiling, in-process (no HTTP), batches of 64, best of {len(ceiling['candidates'])} (range "
            f"{low:.0f}-{high:.0f}): one batch at a time on every CPU {ceiling['shared_qps']:.1f} queries/s, one "
            f"single-threaded batch per CPU side by side {ceiling['split_qps']:.1f} queries/s; the ceiling is the "
            f"better, {ceiling['qps']:.1f} (other processes used {ceiling['other_cores']:.2f} cores meanwhile).",
            "",
        ]
    lines += [
        "| server | clients | idle QPS | idle p50 / p99 ms | busy QPS | busy p50 / p99 ms | busy / idle QPS "
        "| idle of ceiling | busy p99/p50 | layout idle / busy | errors | other procs idle / busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def threads_seen(run: BusyRun, key: tuple[str, int]) -> str:
        return ",".join(dict.fromkeys(t for t in run.threads.get(key, []) if t)) or "-"

    for mode, run in runs.items():
        for clients in BUSY_CONCURRENCY:
            idle, busy = run.points[("idle", clients)], run.points[("busy", clients)]
            threads = f"{threads_seen(run, ('idle', clients))} / {threads_seen(run, ('busy', clients))}"
            of_ceiling = f"{idle.qps / ceiling['qps']:.0%}" if ceiling and clients > 1 else ""
            lines.append(
                f"| {mode} | {clients} | {idle.qps:.1f} | {idle.p50_ms:.0f} / {idle.p99_ms:.0f} | {busy.qps:.1f} "
                f"| {busy.p50_ms:.0f} / {busy.p99_ms:.0f} | {busy.qps / idle.qps:.0%} | {of_ceiling} | "
                f"{busy.p99_ms / busy.p50_ms:.2f} | {threads} | {run.errors if clients == 1 else ''} "
                f"| {idle.other_cores:.2f} / {busy.other_cores:.2f} |"
            )
    lines += ["", "| target (issue 21) | result | met |", "|---|---|---|"]
    lines += [f"| {target} | {result} | {'PASS' if met else 'FAIL'} |" for target, result, met in targets]
    return "\n".join(lines) + "\n"


def run_busy_neighbour(args, assets, questions: list[str], started: str) -> int:
    """The busy-neighbour case: the ceiling, then each server idle and beside `--busy_cores` busy processes, at 1
    and 256 clients; checks the targets."""
    failed = False
    busy_cpus = BusyCores(args.busy_cores, 0).cpus  # validates --busy_cores before anything starts
    for size in args.sizes:
        corpus_path, index_path = corpus_files(size, assets)
        flags = embedded_default.server_flags(assets.model_dir, index_path, corpus_path, topk=TOPK)
        print(f"corpus {size}, {args.busy_cores} busy core(s) on CPU(s) {busy_cpus}:", flush=True)
        ceiling = best_ceiling(assets, index_path, questions, args) if args.ceiling_reps else None
        runs = {mode: run_busy_server(size, mode, flags, questions, args) for mode in args.modes}
        targets = busy_targets(runs, ceiling)
        text = render_busy(size, runs, busy_cpus, started, targets, ceiling)
        print("\n" + text)
        for target, result, met in targets:
            print(f"{'PASS' if met else 'FAIL'}: {target}: {result}")
        failed |= not all(met for _, _, met in targets)
        if not args.no_write:
            results_md.write_section(f"{BUSY_SECTION} ({size}, {args.busy_cores} busy)", text)
            print(f"wrote {RESULTS_PATH.relative_to(REPO)}")
    return 1 if failed else 0


# The wrapper case: run_qwen2.5_3B_with_retrieval.sh starts the server as it would for training, and its
# TRAIN_CMD is this script's stand-in training, which burns CPU like training and searches like rollouts.


def wrapper_settings(busy: "BusyCores") -> dict[str, dict[str, str]]:
    return {
        "default": {},
        "RETRIEVER_NUM_THREADS=1": {"RETRIEVER_NUM_THREADS": "1"},
        f"RETRIEVER_CPUS={','.join(map(str, busy.free_cpus))}": {"RETRIEVER_CPUS": ",".join(map(str, busy.free_cpus))},
    }


def run_wrapper_case(label: str, settings: dict[str, str], corpus: tuple[Path, Path], model_dir: Path, args) -> dict:
    import tempfile
    import uuid

    from local_dense_retriever.serving.launcher import free_port

    corpus_path, index_path = corpus
    with tempfile.TemporaryDirectory(prefix="retriever-wrapper-bench-") as tmp:
        tmp_dir = Path(tmp)
        (tmp_dir / "tmux").mkdir()
        out = tmp_dir / "standin.json"
        standin = [
            sys.executable, str(Path(__file__).resolve()), "--standin_training", str(out),
            "--busy_cores", str(args.busy_cores), "--repeats", str(args.repeats), "--warmup", str(args.warmup),
            "--duration", str(args.duration), "--max_seconds", str(args.max_seconds),
        ]  # fmt: skip
        env = {name: value for name, value in os.environ.items() if not name.startswith(("TMUX", "RETRIEVER_"))}
        env.update(
            {
                "TMUX_TMPDIR": str(tmp_dir / "tmux"),  # a private tmux server
                "TMUX_SESSION": f"retriever-bench-{uuid.uuid4().hex[:8]}",
                "LOG_DIR": str(tmp_dir / "logs"),
                "RETRIEVAL_SERVER_URL": f"http://127.0.0.1:{free_port()}",
                "RETRIEVER_PYTHON": sys.executable,
                "RETRIEVER_INDEX_PATH": str(index_path),
                "RETRIEVER_CORPUS_PATH": str(corpus_path),
                "RETRIEVER_NAME": embedded_default.RETRIEVER_NAME,
                "RETRIEVER_MODEL": str(model_dir),
                "RETRIEVER_EXTRA_ARGS": f"--max_length {embedded_default.MAX_LENGTH}",
                "RETRIEVER_STARTUP_TIMEOUT": "600",
                "TRAIN_CMD": " ".join(map(shlex.quote, standin)),
                **settings,
            }
        )
        env.pop("SEARCH_BACKEND", None)
        wait_until_quiet(args.wait_for_quiet)
        result = subprocess.run(["bash", str(WRAPPER)], env=env, capture_output=True, text=True)
        if result.returncode != 0 or not out.exists():
            logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted((tmp_dir / "logs").glob("*.log")))
            raise RuntimeError(f"the wrapper ({label}) exited with {result.returncode}:\n{result.stderr}\n{logs}")
        report = json.loads(out.read_text())
    for point in report["points"]:
        print(
            f"  wrapper {label:<26} {point['state']:<4} c={point['concurrency']:<3} {point['qps']:7.1f} QPS  "
            f"p50 {point['p50_ms']:7.0f} ms  p99 {point['p99_ms']:7.0f} ms  errors {point['errors']}",
            flush=True,
        )
    return report


def standin_training(out: Path, args) -> int:
    """The wrapper's TRAIN_CMD here: search like rollouts at 1 and 256 clients, idle, then beside busy processes."""
    import httpx

    url = os.environ["RETRIEVAL_SERVER_URL"]
    questions = load_questions()
    cpu_threads = httpx.get(f"{url}/health", timeout=30).json().get("cpu_threads", {})
    windows: dict[tuple[str, int], list[Point]] = {}
    threads: dict[tuple[str, int], list[str]] = {}
    for _ in range(args.repeats):
        for state in ("idle", "busy"):
            with BusyCores(args.busy_cores if state == "busy" else 0, busy_bound_seconds(args)):
                for clients in BUSY_CONCURRENCY:
                    latencies, errors, window = asyncio.run(
                        closed_loop(url, questions, clients, args.warmup, args.duration, args.max_seconds)
                    )
                    health = httpx.get(f"{url}/health", timeout=30).json()
                    threads.setdefault((state, clients), []).append(tuned_layout(health))
                    lat = np.array(latencies) * 1000 if latencies else np.array([np.nan])
                    point = Point("", state, clients, len(latencies) / window, float(np.percentile(lat, 50)),
                                  float(np.percentile(lat, 99)), len(latencies), errors, window, float("nan"),
                                  float("nan"))  # fmt: skip
                    windows.setdefault((state, clients), []).append(point)
    points = [
        {
            "state": state,
            "concurrency": clients,
            "threads": threads[(state, clients)],
            **{k: v for k, v in asdict(best_of(repeats)).items() if k != "mode"},
        }
        for (state, clients), repeats in windows.items()
    ]
    out.write_text(json.dumps({"cpu_threads": cpu_threads, "points": points}))
    return 0


def render_wrapper(size: str, reports: dict[str, dict], busy_cpus: list[int], started: str) -> str:
    lines = [
        f"### Corpus {size}, {len(busy_cpus)} busy core(s)",
        "",
        f"Measured by `python bench/retriever_load.py {' '.join(sys.argv[1:])}`".rstrip() + f" on {started}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, no GPU. "
        "run_qwen2.5_3B_with_retrieval.sh starts the retrieval server in its tmux session as for training; its "
        "TRAIN_CMD is a stand-in training (this script with `--standin_training`) that searches like rollouts "
        "(closed-loop single-query clients) idle, then while it keeps "
        f"{len(busy_cpus)} process(es) spinning on CPU(s) {busy_cpus}. Rows: the wrapper's settings. "
        "Best of `--repeats` windows; `threads idle / busy`: the count batches of that size ran with at the end of "
        "each window.",
        "",
        "| wrapper settings | server threads | clients | idle QPS | idle p50 / p99 ms | busy QPS "
        "| busy p50 / p99 ms | busy / idle QPS | busy p99/p50 | threads idle / busy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def seen(point: dict) -> str:
        return ",".join(dict.fromkeys(t for t in point.get("threads", []) if t)) or "-"

    for label, report in reports.items():
        points = {(p["state"], p["concurrency"]): p for p in report["points"]}
        threads = describe_threads(report["cpu_threads"])
        affinity = report["cpu_threads"].get("affinity_cpus", "?")
        for clients in BUSY_CONCURRENCY:
            idle, busy = points[("idle", clients)], points[("busy", clients)]
            lines.append(
                f"| {label} | {threads}, {affinity} CPU(s) in its affinity | {clients} | {idle['qps']:.1f} "
                f"| {idle['p50_ms']:.0f} / {idle['p99_ms']:.0f} | {busy['qps']:.1f} "
                f"| {busy['p50_ms']:.0f} / {busy['p99_ms']:.0f} | {busy['qps'] / idle['qps']:.0%} "
                f"| {busy['p99_ms'] / busy['p50_ms']:.2f} | {seen(idle)} / {seen(busy)} |"
            )
    return "\n".join(lines) + "\n"


def run_wrapper_cases(args, assets, started: str) -> int:
    busy = BusyCores(args.busy_cores, 0)
    for size in args.sizes:
        corpus = corpus_files(size, assets)
        print(f"corpus {size}, the wrapper beside {args.busy_cores} busy core(s) on CPU(s) {busy.cpus}:", flush=True)
        reports = {
            label: run_wrapper_case(label, settings, corpus, assets.model_dir, args)
            for label, settings in wrapper_settings(busy).items()
        }
        text = render_wrapper(size, reports, busy.cpus, started)
        print("\n" + text)
        if not args.no_write:
            results_md.write_section(f"{WRAPPER_SECTION} ({size}, {args.busy_cores} busy)", text)
            print(f"wrote {RESULTS_PATH.relative_to(REPO)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10k,100k", help="comma-separated from 10k, 100k, 1m")
    parser.add_argument("--concurrency", default="1,16,64,256", help="comma-separated client counts")
    parser.add_argument(
        "--modes",
        default=None,
        help="servers to run: on, off, passive, public (default: on, off, public); busy case: on, today, even, "
        "passive, spin, public (default: on, spin, public; `today` is the CPU policy of commit "
        f"{TODAY_COMMIT}, `even` the current one with equal shares)",
    )
    # 5 s: the server's tuner re-checks its CPU layout when the load or a neighbour changes (a window and a probe,
    # ~3.5 s at 100k and 256 clients); the measured window is its steady state.
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds (and at least one full wave) per point")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds (and one full wave) per point")
    parser.add_argument("--max_seconds", type=float, default=240.0, help="cap per phase of a point")
    parser.add_argument("--ceiling_reps", type=int, default=15)
    parser.add_argument(
        "--repeats", type=int, default=3, help="measure each point (and the ceiling) this often; report the best"
    )
    parser.add_argument(
        "--wait_for_quiet", type=float, default=180.0, help="max seconds to wait for other CPU users before each point"
    )
    parser.add_argument("--no_write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    parser.add_argument(
        "--layout",
        help="also serve an approximate layout beside Flat (mode `layout`): `tuned` (the index tuner's choice on each "
        "synthetic corpus, FanOutQA questions, recall@3 >= 0.99) or a spec such as HNSW32:efSearch=256",
    )
    parser.add_argument(
        "--max_size_case",
        action="store_true",
        help="instead of the sweep: p50/p99 of single-query clients beside one client sending maximum-size requests",
    )
    parser.add_argument("--max_size_clients", type=int, default=16, help="single-query clients in that case")
    parser.add_argument("--max_size_seconds", type=float, default=60.0, help="seconds per phase of that case")
    parser.add_argument(
        "--busy_cores",
        "--busy-cores",
        type=int,
        default=None,
        help="the busy-neighbour case instead: K processes spinning on K pinned CPUs beside the server; idle and "
        "busy figures at 1 and 256 clients, the issue's targets checked (exit 1 if one fails)",
    )
    parser.add_argument(
        "--wrapper",
        action="store_true",
        help="with --busy_cores: the same through run_qwen2.5_3B_with_retrieval.sh and a CPU-busy stand-in training",
    )
    parser.add_argument("--standin_training", type=Path, help=argparse.SUPPRESS)  # the --wrapper case's TRAIN_CMD
    args = parser.parse_args(argv)
    if args.standin_training:
        return standin_training(args.standin_training, args)
    if args.max_size_case:
        return run_max_size_case(args)
    busy_case = args.busy_cores is not None
    if args.wrapper and not busy_case:
        parser.error("--wrapper needs --busy_cores K")
    if busy_case:
        try:
            BusyCores(args.busy_cores, 0)
        except ValueError as err:
            parser.error(str(err))
    sizes = [s.strip().lower() for s in (args.sizes or "10k,100k").split(",")]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {unknown}; choose from {', '.join(SIZES)}")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    known_modes = BUSY_MODES if busy_case else MODES
    default_modes = DEFAULT_BUSY_MODES if busy_case else DEFAULT_MODES
    modes = [m.strip() for m in (args.modes or ",".join(default_modes)).split(",")]
    if set(modes) - set(known_modes):
        parser.error(f"--modes: choose from {', '.join(known_modes)}")
    args.sizes, args.modes = sizes, modes

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    assets = embedded_default.prepare()
    if args.wrapper:
        return run_wrapper_cases(args, assets, started)
    questions = load_questions()
    if busy_case:
        return run_busy_neighbour(args, assets, questions, started)
    if args.layout and "layout" not in modes:
        modes.append("layout")
    ceilings, runs, layouts = {}, [], {}
    for size in sizes:
        print(f"corpus {size}:", flush=True)
        corpus_path, index_path = corpus_files(size, assets)
        if args.layout and (size != "10k" or args.layout != "tuned"):
            layouts[size] = approximate_layouts.prepare(args.layout, size, index_path, corpus_path, assets.model_dir,
                                                        questions, CACHE_DIR)  # fmt: skip
        ceilings[size] = best_ceiling(assets, index_path, questions, args)
        flags = embedded_default.server_flags(assets.model_dir, index_path, corpus_path, topk=TOPK)
        for mode in modes:
            if mode == "layout" and size not in layouts:
                continue
            runs.append(run_server(size, mode, layouts[size]["flags"] if mode == "layout" else flags, questions, args))
    text = render(ceilings, runs, sizes, started) + approximate_layouts.render(layouts, runs, ceilings=ceilings)
    print("\n" + text)
    if not args.no_write:
        write_section(text, key=",".join(sizes))
        print(f"wrote {RESULTS_PATH.relative_to(REPO)}")
    return 0


def run_max_size_case(args) -> int:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    assets = embedded_default.prepare()
    questions = load_questions()
    flags = embedded_default.server_flags(assets.model_dir, assets.index_path, assets.corpus_path, topk=TOPK)
    with ServerProcess(flags, log_path=CACHE_DIR / "server_max_size.log", startup_timeout=900) as server:
        wait_until_quiet(args.wait_for_quiet, server.process.pid)
        bounds = batch_bounds(server.url)
        load = f"1-minute load average {os.getloadavg()[0]:.1f} as the measurement began (other processes: near 0 on "
        load += "a quiet machine)"
        result = measure_max_size_case(server.url, questions, args.max_size_clients, args.max_size_seconds)
    text = render_max_size_case(result, args.max_size_clients, started, bounds, load)
    print("\n" + text)
    if not args.no_write:
        write_section(text, key="max-size")
        print(f"wrote {RESULTS_PATH.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
