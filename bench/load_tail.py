"""The tail case of the retriever load benchmark (`python bench/retriever_load.py --tail_case`): the three figures
that bound the batcher's tail, in one table, for this checkout's server and, with --compare_with DIR, another
checkout's (e.g. `git worktree add /tmp/base main`), the two measured in turns in the same minutes:

- busy p99/p50: 256 closed-loop single-query clients on the 100k corpus beside --busy_cores spinning processes
  (load_busy.py); target at most TARGET_BUSY_TAIL;
- the single-query wait beside a maximum-size client: p99 of 16 single-query clients beside one client sending
  512 x 4,096-character requests, over their p99 alone, on the 10k corpus (load_max_size.py); at most
  TARGET_BESIDE_MAX_SIZE;
- idle QPS at 256 clients on the 100k corpus: no worse than the compared server's.

The machine may be shared: each round runs every server once, in turns, and the 1-minute load average is printed
beside each row; compare servers within a round.
"""

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import results_md
from cpu_neighbours import wait_until_quiet
from load_busy import run_busy_server
from load_corpora import CACHE_DIR, corpus_files
from load_max_size import measure_max_size_case
from load_points import TOPK

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from local_dense_retriever.demo import embedded_default  # noqa: E402
from local_dense_retriever.serving.launcher import SERVER_MODULE, ServerProcess  # noqa: E402

SECTION = "Retriever tail: beside a busy core and beside a maximum-size client"
TARGET_BUSY_TAIL = 1.5  # busy p99 over p50, 256 clients, 100k
TARGET_BESIDE_MAX_SIZE = 2.0  # single-query p99 beside a max-size client over alone


@dataclass
class TailRow:
    server: str
    round: int
    began: str
    load: float  # 1-minute load average as the round's server began
    idle_qps: float
    busy_p50_ms: float
    busy_p99_ms: float
    alone_p99_ms: float
    beside_p99_ms: float
    max_size_requests: int
    errors: int

    @property
    def busy_tail(self) -> float:
        return self.busy_p99_ms / self.busy_p50_ms

    @property
    def beside_ratio(self) -> float:
        return self.beside_p99_ms / self.alone_p99_ms


def commit_of(checkout: Path) -> str:
    """The checkout's commit, for the table (a tree with changes says so)."""

    def git(*words: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *words], capture_output=True, text=True).stdout.strip()

    changed = " with changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return (git("rev-parse", "--short", "HEAD") or "unknown") + changed


def server_program(checkout: Path | None) -> list[str]:
    """What `python` runs for this checkout's server (None: this one), with that checkout's package first."""
    if checkout is None:
        return SERVER_MODULE
    return ["-c", f"import sys; sys.path.insert(0, {str(checkout)!r}); "
            "from local_dense_retriever.serving.cli import main; sys.exit(main())"]  # fmt: skip


def measure_server(name: str, program: list[str], round_: int, assets, questions: list[str], args) -> TailRow:
    began, load = time.strftime("%H:%M", time.gmtime()), os.getloadavg()[0]
    corpus_path, index_path = corpus_files("100k", assets)
    flags = embedded_default.server_flags(assets.model_dir, index_path, corpus_path, topk=TOPK)
    busy = run_busy_server("100k", f"tail-{name}", flags, questions, args, program=program, concurrency=(256,))
    idle, beside_busy = busy.points[("idle", 256)], busy.points[("busy", 256)]
    flags = embedded_default.server_flags(assets.model_dir, assets.index_path, assets.corpus_path, topk=TOPK)
    log = CACHE_DIR / f"server_tail_{name}_max_size.log"
    with ServerProcess(flags, log_path=log, startup_timeout=900, program=program) as server:
        wait_until_quiet(args.wait_for_quiet, server.process.pid)
        max_size = measure_max_size_case(server.url, questions, args.max_size_clients, args.max_size_seconds)
    alone, beside = max_size["alone"], max_size["beside"]
    errors = busy.errors + alone["errors"] + beside["errors"] + beside["large_errors"]
    row = TailRow(name, round_, began, load, idle.qps, beside_busy.p50_ms, beside_busy.p99_ms, alone["p99_ms"],
                  beside["p99_ms"], beside["large_requests"], errors)  # fmt: skip
    print(f"  round {round_} {name}: busy p99/p50 {row.busy_tail:.2f}, beside max-size {row.beside_ratio:.2f}x alone, "
          f"idle {row.idle_qps:.1f} QPS (load {load:.1f})", flush=True)  # fmt: skip
    return row


def run_tail_case(args, assets, questions: list[str], started: str) -> int:
    """Each round: this checkout's server, then --compare_with's; the table and the targets; 1 if one is missed."""
    servers = [("this", None)] + ([("compared", Path(args.compare_with).resolve())] if args.compare_with else [])
    rounds = args.repeats
    args.repeats = 1  # run_busy_server's own repeats: one window per state and round
    rows = [
        measure_server(name, server_program(checkout), round_, assets, questions, args)
        for round_ in range(1, rounds + 1)
        for name, checkout in servers
    ]
    targets = tail_targets(rows)
    text = render_tail(rows, targets, servers, started)
    print("\n" + text)
    if not args.no_write:
        results_md.write_section(SECTION, text)
        print(f"wrote {results_md.RESULTS.relative_to(REPO)}")
    return 0 if all(met for _, _, met in targets) else 1


def tail_targets(rows: list[TailRow]) -> list[tuple[str, str, bool]]:
    """(target, result, met) over the rounds of this checkout's server: medians; idle QPS against the compared
    server's median when there is one."""
    ours = [row for row in rows if row.server == "this"]
    others = [row for row in rows if row.server == "compared"]
    tail = statistics.median(row.busy_tail for row in ours)
    beside = statistics.median(row.beside_ratio for row in ours)
    targets = [
        (f"busy p99 <= {TARGET_BUSY_TAIL}x p50 at 256 clients (median of rounds)", f"{tail:.2f}",
         tail <= TARGET_BUSY_TAIL),
        (f"single-query p99 beside a max-size client <= {TARGET_BESIDE_MAX_SIZE}x alone (median of rounds)",
         f"{beside:.2f}x", beside <= TARGET_BESIDE_MAX_SIZE),
        ("0 errors", f"{sum(row.errors for row in ours)} errors", all(row.errors == 0 for row in ours)),
    ]  # fmt: skip
    if others:
        qps, base = statistics.median(r.idle_qps for r in ours), statistics.median(r.idle_qps for r in others)
        # A shared machine moves QPS by 10-30% between minutes (bench/RESULTS.md): 10% counts as noise.
        targets.append(("idle QPS at 256 clients no worse than the compared server's (within 10%: noise)",
                        f"{qps:.1f} vs {base:.1f} = {qps / base:.2f}", qps >= 0.9 * base))  # fmt: skip
    return targets


def render_tail(rows: list[TailRow], targets, servers, started: str) -> str:
    compared = f"; `compared` = the server of {servers[1][1]} ({commit_of(servers[1][1])})" if len(servers) > 1 else ""
    lines = [
        f"Measured by `python bench/retriever_load.py {' '.join(sys.argv[1:])}`".rstrip() + f" on {started}; "
        f"{os.cpu_count()} CPU cores, no GPU. `this` = this checkout's server ({commit_of(REPO)}){compared}; each "
        "round runs every "
        "server once, in turns. Busy: 256 closed-loop single-query clients on the 100k corpus, idle and then beside "
        "the busy processes (load_busy.py). Max-size: 16 single-query clients on the 10k corpus alone, then beside "
        "one client sending 512 x 4,096-character requests (load_max_size.py). Load: the 1-minute load average as "
        "the server's round began (on a quiet machine, near 0 plus the benchmark's own).",
        "",
        "| server | round | began (UTC) | load | idle QPS | busy p50 / p99 ms | busy p99/p50 | single p99 alone / "
        "beside a max-size client ms | beside / alone | max-size requests | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.server} | {row.round} | {row.began} | {row.load:.1f} | {row.idle_qps:.1f} | "
            f"{row.busy_p50_ms:.0f} / {row.busy_p99_ms:.0f} | {row.busy_tail:.2f} | {row.alone_p99_ms:.0f} / "
            f"{row.beside_p99_ms:.0f} | {row.beside_ratio:.2f}x | {row.max_size_requests} | {row.errors} |"
        )
    lines += ["", "| target | result | met |", "|---|---|---|"]
    lines += [f"| {target} | {result} | {'PASS' if met else 'FAIL'} |" for target, result, met in targets]
    return "\n".join(lines) + "\n"
