"""One point of the retriever load benchmark (bench/retriever_load.py): a server mode at one client count,
measured with closed-loop single-query clients (local_dense_retriever/serving/server_load.py) after other processes
went quiet; the best of its repeats; and every distinct answer it gave under load checked against the same question
asked alone. Also what the servers compared are (MODES) and what a server reports of its CPU threads."""

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson
from cpu_neighbours import ForeignCpu, wait_until_quiet

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # support.rankings: answers are compared as the tests compare them

from local_dense_retriever.serving.launcher import SERVER_MODULE, ServerProcess  # noqa: E402
from local_dense_retriever.serving.server_load import Window, closed_loop, encoder_precision, request_body  # noqa: E402

TOPK = 3
# Server modes, (program, extra flags): ours with batching on (defaults) or off, one batch at a time on every CPU,
# and the public servers' request path for reference.
MODES = {
    "on": (SERVER_MODULE, []),
    "off": (SERVER_MODULE, ["--max_batch_size", "1"]),
    # One batch at a time on every usable CPU with passive OpenMP threads and no thread tuner (--num_threads).
    "passive": (SERVER_MODULE, ["--num_threads", str(len(os.sched_getaffinity(0)))]),
    "public": ([str(REPO / "bench" / "public_pattern_server.py")], []),
    "layout": (SERVER_MODULE, []),  # --layout: our server on the approximate layout (flags per corpus)
}
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

    @classmethod
    def of(cls, window: Window, size: str, mode: str, concurrency: int, mean_batch: float = float("nan"),
           other_cores: float = float("nan")) -> "Point":  # fmt: skip
        return cls(size, mode, concurrency, window.qps, window.p50_ms, window.p99_ms, len(window.latencies),
                   window.errors, window.seconds, mean_batch, other_cores)  # fmt: skip


def best_of(repeats: list[Point]) -> Point:
    """The repeat with the highest QPS, carrying the range over all of them."""
    point = max(repeats, key=lambda p: p.qps)
    point.qps_range = (min(p.qps for p in repeats), point.qps)
    return point


def load(url: str, questions: list[str], clients: int, args, answers: dict[int, set[bytes]] | None = None) -> Window:
    """The benchmark's closed loop: top-3 with scores (answers are compared with ties allowed to swap)."""
    return asyncio.run(closed_loop(url, questions, clients, args.warmup, args.duration, args.max_seconds, topk=TOPK,
                                   return_scores=True, answers=answers))  # fmt: skip


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
        window = load(server.url, questions, concurrency, args, answers)
    batches_after, queries_after = batches_seen(server.url)
    # nan for the public pattern, which has no batches (every request is encoded alone)
    batches = batches_after - batches_before
    mean_batch = (queries_after - queries_before) / batches if batches > 0 else float("nan")
    return Point.of(window, size, mode, concurrency, mean_batch, foreign.cores)


def batches_seen(url: str) -> tuple[int, int]:
    import httpx

    stats = httpx.get(f"{url}/health", timeout=30).json()["batches"]
    return stats["batches"], stats["queries"]


def check_answers(url: str, questions: list[str], answers: dict[int, set[bytes]]) -> tuple[int, int]:
    """(answers checked, mismatches): every distinct answer a question got under load against the answer the same
    server gives it alone, one request at a time (same documents in the same order; scores within 1e-4, and
    documents whose scores tie within that may swap; with a reduced-precision encoder, within its rounding)."""
    import httpx

    from local_dense_retriever.retrieval.precision import SCORE_TOLERANCE
    from support.rankings import same_ranking

    tolerance = SCORE_TOLERANCE.get(encoder_precision(url) or "fp32", 1e-4)
    checked = mismatches = 0
    with httpx.Client(timeout=120) as client:
        for index in sorted(answers):
            alone = client.post(f"{url}/retrieve", json=request_body(questions[index], TOPK, True)).json()["result"][0]
            for body in answers[index]:
                checked += 1
                mismatches += not same_ranking(orjson.loads(body)["result"][0], alone, tolerance)
    return checked, mismatches


def tuned_layout(health: dict) -> str:
    """The layout (batches at once x threads each) the server's tuner uses now, from /health ("" if it has none)."""
    threads = health.get("cpu_threads", {})
    if "layout" in threads:
        return threads["layout"]
    return f"1x{threads['torch_threads']}" if "torch_threads" in threads else ""


def describe_threads(report: dict) -> str:
    """The server's CPU thread policy in words, from /health's cpu_threads."""
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
