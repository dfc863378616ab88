"""A Search-R1 training step beside single-query clients: the peers' traffic shapes on one server, as a table.

    python bench/retriever_peers.py                     # about 5 minutes here
    python bench/retriever_peers.py --write-results     # also writes its section of bench/RESULTS.md

Search-R1 sends every searching sample of a step in one request (train_batch_size 512 x n_agent 5 = 2,560
queries, scores on); slime's, verl's, ASearcher's and RLinf's rollouts send one query per request. On the real CLI
server (127.0.0.1, its defaults) over the embedded 10k mini-Wikipedia with MiniLM, in one run:
1. a step alone: 2,560 queries in one request (Search-R1's client: tests/support/peer_clients.py), --repeats times;
2. the same 2,560 queries as single-query requests from 256 concurrent clients: the same work, split the way the
   other peers send it; the step's time over this one is what batching a whole step costs or saves;
3. --clients closed-loop single-query clients alone, then beside one client sending such steps back to back:
   single-query p50/p99 in both, the steps' times, and errors. Each batch is shared fairly by request, so beside
   many single-query clients a step gets what they leave of each batch (a step still running when the clients
   stop finishes alone; its time counts in the mean).
Targets: the step within 1.25x the time of its 2,560 single queries, single-query p99 beside steps at
most 2x its p99 alone, 0 errors. The machine is shared: the ratios come from one run; compare those.
"""

import argparse
import asyncio
import os
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from local_dense_retriever.demo import embedded_default  # noqa: E402
from local_dense_retriever.serving.launcher import ServerProcess  # noqa: E402
from results_md import write_section  # noqa: E402
from cpu_neighbours import wait_until_quiet  # noqa: E402
from load_corpora import load_questions  # noqa: E402
from support.peer_clients import search_r1_batch_search  # noqa: E402

CACHE_DIR = REPO / ".cache" / "bench"
SECTION = "Retriever beside a Search-R1 step"
STEP = 512 * 5
TOPK = 3
TARGET_STEP_OVER_SINGLES = 1.25
TARGET_P99_BESIDE_OVER_ALONE = 2.0


def step_queries(questions: list[str]) -> list[str]:
    """2,560 queries as a step's samples write them: questions, some blank (`<search></search>`)."""
    queries = [questions[i % len(questions)] for i in range(STEP)]
    for i in range(0, STEP, 97):
        queries[i] = ""
    return queries


def timed_step(url: str, queries: list[str]) -> float:
    started = time.perf_counter()
    passages = search_r1_batch_search(f"{url}/retrieve", queries, TOPK)
    if len(passages) != len(queries):
        raise RuntimeError(f"{len(passages)} answers to {len(queries)} queries")
    return time.perf_counter() - started


async def singles_at_once(url: str, queries: list[str], concurrency: int) -> tuple[float, int]:
    """All `queries` as single-query requests, `concurrency` at a time: (seconds, errors)."""
    import aiohttp

    errors = 0
    pending = iter(queries)

    async def client(session) -> None:
        nonlocal errors
        for query in pending:
            try:
                async with session.post(f"{url}/retrieve", json={"queries": [query], "topk": TOPK}) as response:
                    body = await response.read()
                    errors += response.status != 200 or len(orjson.loads(body)["result"]) != 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                errors += 1

    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return time.perf_counter() - started, errors


async def single_clients(url: str, questions: list[str], clients: int, duration: float) -> tuple[list[float], int]:
    """`clients` closed-loop single-query clients for `duration` s: latencies (s) and errors."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + duration
    counter = iter(range(1 << 62))

    async def client(session) -> None:
        nonlocal errors
        while time.perf_counter() < stop:
            body = {"queries": [questions[next(counter) % len(questions)]], "topk": TOPK}
            started = time.perf_counter()
            try:
                async with session.post(f"{url}/retrieve", json=body) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return latencies, errors


def beside_steps(url: str, questions: list[str], args) -> dict:
    """Single-query clients while one Search-R1 client sends steps back to back (in a thread, as its requests
    client blocks)."""
    steps: list[float] = []
    step_errors = []
    done = threading.Event()

    def search_r1() -> None:
        queries = step_queries(questions)
        while not done.is_set():
            try:
                steps.append(timed_step(url, queries))
            except Exception as err:  # counted, and the run goes on
                step_errors.append(f"{type(err).__name__}: {err}")

    thread = threading.Thread(target=search_r1, daemon=True)
    thread.start()
    time.sleep(0.5)  # the first step is being served
    latencies, errors = asyncio.run(single_clients(url, questions, args.clients, args.duration))
    done.set()
    thread.join(600)
    return {"latencies": latencies, "errors": errors, "steps": steps, "step_errors": len(step_errors)}


def percentiles(latencies: list[float]) -> tuple[float, float]:
    values = np.array(latencies or [np.nan]) * 1000
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def render(result: dict, args, started: str) -> tuple[str, list[tuple[str, str, bool]]]:
    alone_p50, alone_p99 = percentiles(result["alone"]["latencies"])
    beside_p50, beside_p99 = percentiles(result["beside"]["latencies"])
    step_s = min(result["step_alone"])
    singles_s = min(result["singles"])
    errors = (
        result["alone"]["errors"]
        + result["beside"]["errors"]
        + result["beside"]["step_errors"]
        + result["singles_errors"]
    )
    targets = [
        (
            f"a 2,560-query step within {TARGET_STEP_OVER_SINGLES}x the time of its 2,560 single queries",
            f"{step_s:.2f} / {singles_s:.2f} s = {step_s / singles_s:.2f}",
            step_s / singles_s <= TARGET_STEP_OVER_SINGLES,
        ),
        (
            f"single-query p99 beside steps at most {TARGET_P99_BESIDE_OVER_ALONE:g}x its p99 alone",
            f"{beside_p99:.0f} / {alone_p99:.0f} ms = {beside_p99 / alone_p99:.2f}",
            beside_p99 / alone_p99 <= TARGET_P99_BESIDE_OVER_ALONE,
        ),
        ("0 errors", f"{errors}", errors == 0),
    ]
    steps_beside = result["beside"]["steps"]
    lines = [
        f"Measured by `python bench/retriever_peers.py {' '.join(sys.argv[1:])}`".rstrip() + f" on {started}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, no GPU; the real CLI server on "
        "the embedded 10k mini-Wikipedia (MiniLM, FAISS Flat), its defaults (batches of up to 64). A step = "
        f"Search-R1's request for a whole training step: {STEP:,} queries (every 97th blank), top-{TOPK}, scores "
        "on, sent by its client code (tests/support/peer_clients.py). Times are the best of "
        f"{args.repeats}; the machine is shared: compare the ratios, which come from one run.",
        "",
        "| case | requests | p50 ms | p99 ms | steps answered | step s (mean) | errors |",
        "|---|---|---|---|---|---|---|",
        f"| a step alone | {args.repeats} | | | {len(result['step_alone'])} | {step_s:.2f} (best) | 0 |",
        f"| its {STEP:,} queries as single requests, {args.concurrency} clients | {STEP * args.repeats} | | | "
        f"| {singles_s:.2f} (best) | {result['singles_errors']} |",
        f"| {args.clients} single-query clients alone | {len(result['alone']['latencies'])} | {alone_p50:.0f} "
        f"| {alone_p99:.0f} | | | {result['alone']['errors']} |",
        f"| {args.clients} single-query clients beside steps | {len(result['beside']['latencies'])} "
        f"| {beside_p50:.0f} | {beside_p99:.0f} | {len(steps_beside)} "
        f"| {np.mean(steps_beside) if steps_beside else float('nan'):.2f} "
        f"| {result['beside']['errors'] + result['beside']['step_errors']} |",
        "",
        "| target | result | met |",
        "|---|---|---|",
        *[f"| {target} | {value} | {'PASS' if met else 'FAIL'} |" for target, value, met in targets],
    ]
    return "\n".join(lines) + "\n", targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64, help="single-query clients beside the steps")
    parser.add_argument("--concurrency", type=int, default=256, help="clients sending a step's queries one by one")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of single-query clients per phase")
    parser.add_argument("--repeats", type=int, default=3, help="steps alone, and their single-query equivalents")
    parser.add_argument("--wait_for_quiet", type=float, default=180.0, help="max seconds to wait for other CPU users")
    parser.add_argument("--write-results", action="store_true", help="write the table to bench/RESULTS.md")
    args = parser.parse_args(argv)

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    assets = embedded_default.prepare()
    questions = load_questions()
    flags = embedded_default.server_flags(assets.model_dir, assets.index_path, assets.corpus_path, topk=TOPK)
    with ServerProcess(flags, log_path=CACHE_DIR / "peers_server.log", startup_timeout=900) as server:
        wait_until_quiet(args.wait_for_quiet, server.process.pid)
        timed_step(server.url, step_queries(questions))  # warm-up
        result: dict = {"step_alone": [], "singles": [], "singles_errors": 0}
        for _ in range(args.repeats):  # in turns, so both see the same drift of a shared machine
            result["step_alone"].append(timed_step(server.url, step_queries(questions)))
            seconds, errors = asyncio.run(singles_at_once(server.url, step_queries(questions), args.concurrency))
            result["singles"].append(seconds)
            result["singles_errors"] += errors
            print(f"  step {result['step_alone'][-1]:.2f} s, as single requests {seconds:.2f} s", flush=True)
        latencies, errors = asyncio.run(single_clients(server.url, questions, args.clients, args.duration))
        result["alone"] = {"latencies": latencies, "errors": errors}
        print(f"  {args.clients} clients alone: p50/p99 {percentiles(latencies)} ms", flush=True)
        result["beside"] = beside_steps(server.url, questions, args)
        print(f"  beside steps: p50/p99 {percentiles(result['beside']['latencies'])} ms", flush=True)
    text, targets = render(result, args, started)
    print("\n" + text)
    for target, value, met in targets:
        print(f"{'PASS' if met else 'FAIL'}: {target}: {value}")
    if args.write_results:
        write_section(SECTION, text)
        print("wrote bench/RESULTS.md")
    return 0 if all(met for _, _, met in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
