"""Load benchmark of the retrieval server: single-query requests at several concurrencies, batching on vs off.

    python bench/retriever_load.py                      # 10k real + 100k synthetic (about 10 minutes here)
    python bench/retriever_load.py --sizes 1m           # the 1M synthetic corpus (about 15 minutes here)
    python bench/retriever_load.py --max_size_case      # single queries beside maximum-size requests (2 minutes)

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
"""

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from local_dense_retriever import embedded_default, mini_wiki  # noqa: E402
from local_dense_retriever.launcher import SERVER_MODULE, ServerProcess  # noqa: E402

RESULTS_PATH = REPO / "bench" / "RESULTS.md"
SECTION = "## Retriever load"
CACHE_DIR = REPO / ".cache" / "bench"
SIZES = {"10k": 10_033, "100k": 100_000, "1m": 1_000_000}
# Server modes: ours with batching on (defaults) or off, and the public servers' request path for reference.
MODES = {
    "on": (SERVER_MODULE, []),
    "off": (SERVER_MODULE, ["--max_batch_size", "1"]),
    "public": ([str(REPO / "bench" / "public_pattern_server.py")], []),
}
NOISE_SIGMA = 0.04
TOPK = 3


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


# ---------------------------------------------------------------------------------------------- corpora


def synthetic_corpus(n: int, assets: embedded_default.MiniWikiAssets) -> tuple[Path, Path]:
    """Corpus jsonl + Flat index of n rows derived from the real summaries and their MiniLM vectors (cached)."""
    import faiss

    out = CACHE_DIR / f"synthetic_{n}"
    corpus_path, index_path, manifest_path = out / "corpus.jsonl", out / "minilm_Flat.index", out / "manifest.json"
    manifest = {"n": n, "sigma": NOISE_SIGMA, "seed": 0, "source": str(assets.embeddings_path)}
    if manifest_path.exists() and json.loads(manifest_path.read_text()) == manifest and index_path.exists():
        return corpus_path, index_path
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
    rng = np.random.default_rng(0)
    index = faiss.IndexFlatIP(real.shape[1])
    for start in range(0, n, 100_000):
        rows = np.arange(start, min(n, start + 100_000))
        vectors = real[rows % base].copy()
        copies = rows >= base
        vectors[copies] += rng.normal(0.0, NOISE_SIGMA, size=(int(copies.sum()), real.shape[1])).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        index.add(vectors)
    faiss.write_index(index, str(index_path))
    manifest_path.write_text(json.dumps(manifest))
    print(f"  generated the {n}-row synthetic corpus and index in {time.perf_counter() - started:.0f} s")
    return corpus_path, index_path


def load_questions() -> list[str]:
    return [sub["question"] for sub in mini_wiki.fanoutqa_sub_questions()]


# ---------------------------------------------------------------------------------------------- ceiling


def measure_ceiling(model_dir: Path, index_path: Path, questions: list[str], batch: int, reps: int) -> dict:
    """Best-case throughput: the batched encode + FAISS search the server does, timed in-process."""
    from local_dense_retriever.backends import DenseSearcher, FaissIndex
    from local_dense_retriever.encoders import TextEncoder, configure_cpu_threads

    encoder = TextEncoder(str(model_dir), retriever_name=embedded_default.RETRIEVER_NAME, device="cpu")
    configure_cpu_threads()
    searcher = DenseSearcher(encoder, FaissIndex(index_path))
    rng = np.random.default_rng(1)
    searcher.search(questions[:batch], TOPK)  # warm-up
    encode_s, search_s = [], []
    for _ in range(reps):
        sample = [questions[i] for i in rng.choice(len(questions), batch, replace=False)]
        started = time.perf_counter()
        vectors = encoder.encode_queries(sample)
        encoded = time.perf_counter()
        searcher.index.search_vectors(vectors, TOPK)
        encode_s.append(encoded - started)
        search_s.append(time.perf_counter() - encoded)
    per_batch = float(np.median(np.array(encode_s) + np.array(search_s)))
    return {
        "batch": batch,
        "encode_ms": 1000 * float(np.median(encode_s)),
        "search_ms": 1000 * float(np.median(search_s)),
        "qps": batch / per_batch,
    }


# ---------------------------------------------------------------------------------------------- load


async def closed_loop(url: str, questions: list[str], concurrency: int, warmup: float, duration: float,
                      max_seconds: float) -> tuple[list[float], int, float]:  # fmt: skip
    """`concurrency` clients, each sending its next request when the last one is answered.

    Warm-up lasts at least `warmup` s and one full wave (as many answers as clients), so queues are in steady
    state; the measured window lasts at least `duration` s and one more full wave, capped at `max_seconds`.
    """
    import aiohttp

    latencies: list[float] = []
    errors = 0
    state = {"measuring": False, "stop": False, "answered": 0}
    counter = iter(range(1 << 62))

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while not state["stop"]:
            question = questions[next(counter) % len(questions)]
            started = time.perf_counter()
            ok = False
            try:
                async with session.post(f"{url}/retrieve", json={"queries": [question], "topk": TOPK}) as response:
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
    """Average cores used by processes other than this benchmark and its server over an interval."""

    def __init__(self, server_pid: int | None = None):
        import psutil

        self._psutil = psutil
        self._ours = [psutil.Process()] + ([psutil.Process(server_pid)] if server_pid else [])

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


def wait_until_quiet(max_wait: float, server_pid: int | None = None, threshold: float = 0.1) -> None:
    """On a shared machine, wait (bounded) until other processes leave the CPU alone for 3 seconds in a row."""
    deadline = time.perf_counter() + max_wait
    quiet_seconds = 0
    while time.perf_counter() < deadline:
        with ForeignCpu(server_pid) as foreign:
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
        for concurrency in args.concurrency:
            repeats = [measure_point(server, size, mode, concurrency, questions, args) for _ in range(args.repeats)]
            point = max(repeats, key=lambda p: p.qps)
            point.qps_range = (min(p.qps for p in repeats), point.qps)
            run.points.append(point)
            print(
                f"  {size:>4} {mode:<6} c={concurrency:<3} {point.qps:7.1f} QPS  p50 {point.p50_ms:8.0f} ms"
                f"  p99 {point.p99_ms:8.0f} ms  errors {point.errors}  mean batch {point.mean_batch:5.1f}"
                f"  ({point.requests} requests in {point.seconds:.0f} s; others used {point.other_cores:.2f} cores)",
                flush=True,
            )
    finally:
        server.stop()
        peak_rss_mb = monitor.stop()
    run.peak_rss_mb = peak_rss_mb
    return run


def measure_point(server: ServerProcess, size: str, mode: str, concurrency: int, questions: list[str], args) -> Point:
    wait_until_quiet(args.wait_for_quiet, server.process.pid)
    batches_before, queries_before = batches_seen(server.url)
    with ForeignCpu(server.process.pid) as foreign:
        latencies, errors, window = asyncio.run(
            closed_loop(server.url, questions, concurrency, args.warmup, args.duration, args.max_seconds)
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


def render_max_size_case(result: dict, clients: int, started: str) -> str:
    alone, beside = result["alone"], result["beside"]
    return "\n".join(
        [
            "### Single queries beside maximum-size requests",
            "",
            f"Measured by `python bench/retriever_load.py {' '.join(sys.argv[1:])}`".rstrip() + f" on {started}; "
            f"{os.cpu_count()} CPU cores, no GPU, the 10k corpus, the server's defaults (max batch 64). "
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
        "Ceiling = in-process encode + search of a 64-query batch, no HTTP. Corpora: see the docstring of "
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
        "| corpus | ceiling QPS | range | encode ms / 64 | search ms / 64 | other procs (cores) |",
        "|---|---|---|---|---|---|",
    ]
    for size, c in ceilings.items():
        low, high = c["qps_range"]
        lines.append(
            f"| {size} | {c['qps']:.0f} | {low:.0f}-{high:.0f} | {c['encode_ms']:.0f} | {c['search_ms']:.0f} "
            f"| {c['other_cores']:.2f} |"
        )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10k,100k", help="comma-separated from 10k, 100k, 1m")
    parser.add_argument("--concurrency", default="1,16,64,256", help="comma-separated client counts")
    parser.add_argument("--modes", default="on,off,public", help="servers to run: on, off, public")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds (and at least one full wave) per point")
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
        "--max_size_case",
        action="store_true",
        help="instead of the sweep: p50/p99 of single-query clients beside one client sending maximum-size requests",
    )
    parser.add_argument("--max_size_clients", type=int, default=16, help="single-query clients in that case")
    parser.add_argument("--max_size_seconds", type=float, default=60.0, help="seconds per phase of that case")
    args = parser.parse_args(argv)
    if args.max_size_case:
        return run_max_size_case(args)
    sizes = [s.strip().lower() for s in args.sizes.split(",")]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {unknown}; choose from {', '.join(SIZES)}")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    if set(modes) - set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    assets = embedded_default.prepare()
    questions = load_questions()
    ceilings, runs = {}, []
    for size in sizes:
        print(f"corpus {size}:", flush=True)
        if size == "10k":
            corpus_path, index_path = assets.corpus_path, assets.index_path
        else:
            corpus_path, index_path = synthetic_corpus(SIZES[size], assets)
        candidates = []
        for _ in range(args.repeats):
            wait_until_quiet(args.wait_for_quiet)
            with ForeignCpu() as foreign:
                candidates.append(measure_ceiling(assets.model_dir, index_path, questions, 64, args.ceiling_reps))
            candidates[-1]["other_cores"] = foreign.cores
        ceilings[size] = c = max(candidates, key=lambda c: c["qps"])
        c["qps_range"] = (min(candidate["qps"] for candidate in candidates), c["qps"])
        print(f"  ceiling {c['qps']:.0f} queries/s (encode {c['encode_ms']:.0f} ms + search {c['search_ms']:.0f} ms"
              f" per 64; other processes {c['other_cores']:.2f} cores)", flush=True)  # fmt: skip
        flags = embedded_default.server_flags(assets.model_dir, index_path, corpus_path, topk=TOPK)
        for mode in modes:
            runs.append(run_server(size, mode, flags, questions, args))
    text = render(ceilings, runs, sizes, started)
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
        result = measure_max_size_case(server.url, questions, args.max_size_clients, args.max_size_seconds)
    text = render_max_size_case(result, args.max_size_clients, started)
    print("\n" + text)
    if not args.no_write:
        write_section(text, key="max-size")
        print(f"wrote {RESULTS_PATH.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
