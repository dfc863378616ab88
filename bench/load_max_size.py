"""The max-size case of the retriever load benchmark (`python bench/retriever_load.py --max_size_case`): one client
sends maximum-size valid requests back to back (512 queries of 4,096 characters: every query runs to --max_length
tokens) while single-query clients keep going; their p50/p99 alone and beside it, on the same server. The batcher
splits large requests, so a single query sent meanwhile waits for a slice of one, not the whole of it.
"""

import asyncio
import os
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import results_md
from cpu_neighbours import wait_until_quiet
from load_corpora import CACHE_DIR, load_questions
from load_points import TOPK

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from local_dense_retriever.demo import embedded_default  # noqa: E402
from local_dense_retriever.serving.launcher import ServerProcess  # noqa: E402

SECTION = "Retriever load"


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
        results_md.write_block(SECTION, "retriever-load max-size", text)
        print(f"wrote {results_md.RESULTS.relative_to(REPO)}")
    return 0


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
