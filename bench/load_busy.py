"""The busy-node case of the retriever load benchmark (`python bench/retriever_load.py --busy_cores K`): each server
idle and beside K processes spinning on K pinned CPUs, in turns, at 1 and 256 clients; the in-process ceiling of the
same run; and the targets checked (TARGET_* below), printed and recorded as PASS/FAIL.

The servers (--modes): `on`, our server's defaults (the thread tuner, speed shares for batches side by side);
`even`, the same with equal shares; `passive`, one batch at a time on every CPU with passive OpenMP threads and no
tuner; `spin`, libgomp's default spin-wait and a fixed thread count; `public`, the public servers' request path.
"""

import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import results_md
from cpu_neighbours import BusyCores
from load_ceiling import best_ceiling
from load_corpora import CACHE_DIR, corpus_files
from load_points import (
    CHECKED_MODES,
    MODES,
    TOPK,
    Point,
    best_of,
    check_answers,
    describe_threads,
    measure_point,
    tuned_layout,
)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from local_dense_retriever.demo import embedded_default  # noqa: E402
from local_dense_retriever.serving.launcher import ServerProcess  # noqa: E402

SECTION = "Retriever beside busy processes"
CONCURRENCY = (1, 256)
# `spin`: torch and faiss load before the server sets the OpenMP wait policy, so libgomp keeps its default
# spin-wait; --num_threads fixes os.cpu_count() threads (which also turns the thread tuner off).
SPIN_PROGRAM = [
    "-c",
    "import sys, faiss, torch; from local_dense_retriever.serving.cli import main; sys.exit(main())",
]
# `even`: our server with equal CPU shares for batches side by side, so that `on` against `even` shows what the
# speed shares add.
EVEN_PROGRAM = [
    "-c",
    "import sys; from local_dense_retriever.serving import batcher; init = batcher.DynamicBatcher.__init__; "
    "batcher.DynamicBatcher.__init__ = lambda self, *a, **k: init(self, *a, **{**k, 'speed_shares': False}); "
    "from local_dense_retriever.serving.cli import main; sys.exit(main())",
]
BUSY_MODES = {  # program, extra flags
    "on": MODES["on"],
    "even": (EVEN_PROGRAM, []),
    "passive": MODES["passive"],
    "spin": (SPIN_PROGRAM, ["--num_threads", str(os.cpu_count() or 1)]),
    "public": MODES["public"],
}
DEFAULT_BUSY_MODES = ("on", "spin", "public")
TARGET_BUSY_SHARE = 0.6  # busy QPS over idle QPS at 256 clients
TARGET_P99_OVER_P50 = 1.5  # busy, at 256 clients
TARGET_CEILING_SHARE = 0.85  # idle QPS at 256 clients over the in-process ceiling of the same run
# "C=1 latency no worse than the public path's": p50 at one client moved by up to ~5% between windows here.
TARGET_C1_TOLERANCE = 1.1


def busy_bound_seconds(args) -> float:
    """How long busy processes may live: every point of one state at its caps, with margin (they are stopped first)."""
    return len(CONCURRENCY) * (2 * args.max_seconds + args.wait_for_quiet + 30)


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


def run_busy_neighbour(args, assets, questions: list[str], started: str) -> int:
    """The ceiling, then each server idle and beside `--busy_cores` busy processes, at 1 and 256 clients; checks
    the targets; 1 if one is missed."""
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
            results_md.write_section(f"{SECTION} ({size}, {args.busy_cores} busy)", text)
            print(f"wrote {results_md.RESULTS.relative_to(REPO)}")
    return 1 if failed else 0


def run_busy_server(
    size: str,
    mode: str,
    flags: list[str],
    questions: list[str],
    args,
    program: list[str] | None = None,
    concurrency: tuple[int, ...] = CONCURRENCY,
) -> BusyRun:
    """One server, idle then beside `--busy_cores` busy processes, in turns, `--repeats` times; best window kept.
    `program`: what the server runs instead of the mode's (another checkout's server, for the tail case)."""
    import httpx

    log_path = CACHE_DIR / f"server_{size}_{mode}_busy.log"
    program, mode_flags = (program, []) if program else BUSY_MODES[mode]
    server = ServerProcess(flags + mode_flags, log_path=log_path, startup_timeout=900, program=program)
    server.start()
    try:
        run = BusyRun(mode, httpx.get(f"{server.url}/health", timeout=30).json().get("cpu_threads", {}))
        answers = {} if mode in CHECKED_MODES else None
        windows: dict[tuple[str, int], list[Point]] = {}
        for _ in range(args.repeats):
            for state in ("idle", "busy"):
                with BusyCores(args.busy_cores if state == "busy" else 0, busy_bound_seconds(args)) as busy:
                    for clients in concurrency:
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
    """(target, result, met) for each busy-node target this run can check (those of `on`)."""
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
        "`even` = our server with equal CPU shares for batches side by side (the thread tuner of `on`); "
        "`passive` = one batch at a time on every CPU with OMP_WAIT_POLICY=PASSIVE (`--num_threads` = the usable "
        "CPUs, no thread tuner); "
        "`spin` = torch and faiss loaded before the server sets the wait policy (libgomp's default spin-wait) and "
        "`--num_threads` = the machine's core count (no tuning); "
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
        for clients in CONCURRENCY:
            idle, busy = run.points[("idle", clients)], run.points[("busy", clients)]
            threads = f"{threads_seen(run, ('idle', clients))} / {threads_seen(run, ('busy', clients))}"
            of_ceiling = f"{idle.qps / ceiling['qps']:.0%}" if ceiling and clients > 1 else ""
            lines.append(
                f"| {mode} | {clients} | {idle.qps:.1f} | {idle.p50_ms:.0f} / {idle.p99_ms:.0f} | {busy.qps:.1f} "
                f"| {busy.p50_ms:.0f} / {busy.p99_ms:.0f} | {busy.qps / idle.qps:.0%} | {of_ceiling} | "
                f"{busy.p99_ms / busy.p50_ms:.2f} | {threads} | {run.errors if clients == 1 else ''} "
                f"| {idle.other_cores:.2f} / {busy.other_cores:.2f} |"
            )
    lines += ["", "| target | result | met |", "|---|---|---|"]
    lines += [f"| {target} | {result} | {'PASS' if met else 'FAIL'} |" for target, result, met in targets]
    return "\n".join(lines) + "\n"
