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
Corpora (load_corpora.py): 10k is the embedded mini-Wikipedia (10,033 real summaries, real MiniLM embeddings);
100k and 1M are synthetic: the real summaries repeated, their real MiniLM vectors plus Gaussian noise. Queries are
real FanOutQA sub-questions encoded by the real MiniLM.
Each point is measured --repeats times and the best window is kept for every server alike (shared, drifting VM).
Results go to the `## Retriever load` section of bench/RESULTS.md (other sections are left alone).

    python bench/retriever_load.py --busy_cores 1            # beside 1 busy core, 100k (about 15 minutes here)
    python bench/retriever_load.py --busy_cores 1 --wrapper  # the same through run_qwen2.5_3B_with_retrieval.sh
    python bench/retriever_load.py --tail_case --compare_with /tmp/base --repeats 2 --max_size_seconds 30
                                # busy p99/p50, beside a max-size client, idle QPS: one table (load_tail.py)

Busy neighbours (--busy_cores K, load_busy.py): K child processes spin (`while True: pass`, bounded in time, stopped
by PID), each pinned to one of the last K CPUs; each server is measured idle and beside them, in turns, at 1 and 256
clients: our server (`on`), libgomp's default spin-wait with fixed threads (`spin`) and the public request path
(`public`); `--modes on,even` compares our CPU policy (the thread tuner, speed shares) with equal shares (`even`).
It checks the busy-node targets (busy QPS >= 60% of idle and p99 <= 1.5x p50 at 256 clients, idle QPS >= 85% of the
in-process ceiling, p50 at 1 client no worse than the public path's, no errors, answers identical to sequential),
prints and records them as PASS/FAIL, and exits 1 if one fails. With --wrapper (load_wrapper.py) the wrapper starts
the server as for training, and its TRAIN_CMD is a stand-in training (this script, --standin_training) that
searches like rollouts, idle and then beside K busy processes; rows compare the wrapper's default with
`--num_threads 1` in RETRIEVER_ARGS and RETRIEVER_CPUS=<the free CPUs>. Each writes its own section of
bench/RESULTS.md.
"""

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import approximate_layouts
import results_md
from cpu_neighbours import BusyCores
from load_busy import BUSY_MODES, DEFAULT_BUSY_MODES, run_busy_neighbour
from load_ceiling import best_ceiling
from load_corpora import CACHE_DIR, SIZES, corpus_files, load_questions
from load_max_size import run_max_size_case
from load_tail import run_tail_case
from load_points import CHECKED_MODES, MODES, TOPK, Point, best_of, check_answers, measure_point
from load_wrapper import run_wrapper_cases, standin_training

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from local_dense_retriever.demo import embedded_default  # noqa: E402
from local_dense_retriever.serving.launcher import ServerProcess  # noqa: E402
from local_dense_retriever.serving.server_load import PeakRss  # noqa: E402

SECTION = "Retriever load"
DEFAULT_MODES = ("on", "off", "public")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10k,100k", help="comma-separated from 10k, 100k, 1m")
    parser.add_argument("--concurrency", default="1,16,64,256", help="comma-separated client counts")
    parser.add_argument(
        "--modes",
        default=None,
        help="servers to run: on, off, passive, public (default: on, off, public); busy case: on, even, passive, "
        "spin, public (default: on, spin, public; `even` is our server with equal CPU shares)",
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
        type=int,
        default=None,
        help="the busy-neighbour case instead: K processes spinning on K pinned CPUs beside the server; idle and "
        "busy figures at 1 and 256 clients, the busy-node targets checked (exit 1 if one fails)",
    )
    parser.add_argument(
        "--wrapper",
        action="store_true",
        help="with --busy_cores: the same through run_qwen2.5_3B_with_retrieval.sh and a CPU-busy stand-in training",
    )
    parser.add_argument(
        "--tail_case",
        action="store_true",
        help="instead of the sweep: busy p99/p50 (100k, 256 clients, --busy_cores, default 1), single-query p99 "
        "beside a max-size client over alone, and idle QPS, in one table; --repeats rounds (exit 1 if a target fails)",
    )
    parser.add_argument(
        "--compare_with",
        help="with --tail_case: another checkout (e.g. `git worktree add /tmp/base main`) whose server is measured "
        "in turns with this one's",
    )
    parser.add_argument("--standin_training", type=Path, help=argparse.SUPPRESS)  # the --wrapper case's TRAIN_CMD
    args = parser.parse_args(argv)
    if args.standin_training:
        return standin_training(args.standin_training, args)
    if args.max_size_case:
        return run_max_size_case(args)
    if args.compare_with and not args.tail_case:
        parser.error("--compare_with goes with --tail_case")
    if args.tail_case:
        if args.compare_with and not (Path(args.compare_with) / "local_dense_retriever").is_dir():
            parser.error(f"--compare_with {args.compare_with}: accepted is a checkout of this repository")
        args.busy_cores = 1 if args.busy_cores is None else args.busy_cores
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        return run_tail_case(args, embedded_default.prepare(), load_questions(), started)
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
    return run_sweep(args, assets, questions, started)


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


def run_sweep(args, assets, questions: list[str], started: str) -> int:
    """Per corpus size: the ceiling, then each server mode at every concurrency; the tables into RESULTS.md."""
    modes = args.modes
    if args.layout and "layout" not in modes:
        modes.append("layout")
    ceilings, runs, layouts = {}, [], {}
    for size in args.sizes:
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
    text = render(ceilings, runs, args.sizes, started) + approximate_layouts.render(layouts, runs, ceilings=ceilings)
    print("\n" + text)
    if not args.no_write:
        results_md.write_block(SECTION, f"retriever-load {','.join(args.sizes)}", text)
        print(f"wrote {results_md.RESULTS.relative_to(REPO)}")
    return 0


def run_server(size: str, mode: str, flags: list[str], questions: list[str], args) -> ServerRun:
    import httpx

    program, mode_flags = MODES[mode]
    log_path = CACHE_DIR / f"server_{size}_{mode}.log"
    server = ServerProcess(flags + mode_flags, log_path=log_path, startup_timeout=900, program=program)
    server.start()
    rss = PeakRss(server.process.pid)
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
        peak_rss_mb = rss.stop()
    run.peak_rss_mb = peak_rss_mb
    return run


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


if __name__ == "__main__":
    sys.exit(main())
