"""The wrapper case of the retriever load benchmark (`python bench/retriever_load.py --busy_cores K --wrapper`):
run_qwen2.5_3B_with_retrieval.sh starts the server as it would for training, and its TRAIN_CMD is a stand-in
training (`bench/retriever_load.py --standin_training`) that searches like rollouts, idle and then beside K busy
processes. Rows compare the wrapper's settings: the server's defaults, `--num_threads 1` in RETRIEVER_ARGS, and
RETRIEVER_CPUS=<the CPUs the busy processes leave free>.
"""

import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import results_md
from cpu_neighbours import BusyCores, wait_until_quiet
from load_busy import CONCURRENCY, busy_bound_seconds
from load_corpora import corpus_files, load_questions
from load_points import TOPK, Point, best_of, describe_threads, load, tuned_layout

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from local_dense_retriever.demo import embedded_default  # noqa: E402
from local_dense_retriever.serving.launcher import free_port  # noqa: E402

SECTION = "Retriever in the wrapper beside a busy training"
WRAPPER = REPO / "run_qwen2.5_3B_with_retrieval.sh"
LOAD_SCRIPT = REPO / "bench" / "retriever_load.py"


def wrapper_settings(busy: BusyCores) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The rows: label -> (server flags added to RETRIEVER_ARGS, wrapper variables set)."""
    free = ",".join(map(str, busy.free_cpus))
    return {
        "default": ([], {}),
        "RETRIEVER_ARGS with --num_threads 1": (["--num_threads", "1"], {}),
        f"RETRIEVER_CPUS={free}": ([], {"RETRIEVER_CPUS": free}),
    }


def wrapper_env(server_flags: list[str], variables: dict[str, str], train_cmd: list[str], tmp_dir: Path,
                environ: dict[str, str]) -> dict[str, str]:  # fmt: skip
    """The wrapper's environment for one row: the caller's, without its tmux and retriever variables, plus a private
    tmux server, logs in `tmp_dir`, a free local port, `server_flags` in RETRIEVER_ARGS, no GPU, the stand-in
    training as TRAIN_CMD, and the row's `variables`."""
    env = {name: value for name, value in environ.items() if not name.startswith(("TMUX", "RETRIEVER_"))}
    env.pop("SEARCH_BACKEND", None)
    env.update(
        {
            "TMUX_TMPDIR": str(tmp_dir / "tmux"),  # a private tmux server
            "LOG_DIR": str(tmp_dir / "logs"),
            "RETRIEVAL_SERVER_URL": f"http://127.0.0.1:{free_port()}",
            "RETRIEVER_PYTHON": sys.executable,
            "RETRIEVER_ARGS": shlex.join(server_flags),
            "RETRIEVER_FAISS_GPU": "0",
            "RETRIEVER_STARTUP_TIMEOUT": "600",
            "TRAIN_CMD": shlex.join(train_cmd),
            **variables,
        }
    )
    return env


def run_wrapper_cases(args, assets, started: str) -> int:
    busy = BusyCores(args.busy_cores, 0)
    for size in args.sizes:
        corpus = corpus_files(size, assets)
        print(f"corpus {size}, the wrapper beside {args.busy_cores} busy core(s) on CPU(s) {busy.cpus}:", flush=True)
        reports = {
            label: run_wrapper_case(label, more_flags, variables, corpus, assets.model_dir, args)
            for label, (more_flags, variables) in wrapper_settings(busy).items()
        }
        text = render_wrapper(size, reports, busy.cpus, started)
        print("\n" + text)
        if not args.no_write:
            results_md.write_section(f"{SECTION} ({size}, {args.busy_cores} busy)", text)
            print(f"wrote {results_md.RESULTS.relative_to(REPO)}")
    return 0


def run_wrapper_case(label: str, more_flags: list[str], variables: dict[str, str], corpus: tuple[Path, Path],
                     model_dir: Path, args) -> dict:  # fmt: skip
    """The wrapper with this row's settings around the stand-in training; the stand-in's report."""
    corpus_path, index_path = corpus
    flags = embedded_default.server_flags(model_dir, index_path, corpus_path, topk=TOPK) + more_flags
    with tempfile.TemporaryDirectory(prefix="retriever-wrapper-bench-") as tmp:
        tmp_dir = Path(tmp)
        (tmp_dir / "tmux").mkdir()
        out = tmp_dir / "standin.json"
        standin = [
            sys.executable, str(LOAD_SCRIPT), "--standin_training", str(out),
            "--busy_cores", str(args.busy_cores), "--repeats", str(args.repeats), "--warmup", str(args.warmup),
            "--duration", str(args.duration), "--max_seconds", str(args.max_seconds),
        ]  # fmt: skip
        env = wrapper_env(flags, variables, standin, tmp_dir, dict(os.environ))
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
                for clients in CONCURRENCY:
                    window = load(url, questions, clients, args)
                    health = httpx.get(f"{url}/health", timeout=30).json()
                    threads.setdefault((state, clients), []).append(tuned_layout(health))
                    windows.setdefault((state, clients), []).append(Point.of(window, "", state, clients))
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
        for clients in CONCURRENCY:
            idle, busy = points[("idle", clients)], points[("busy", clients)]
            lines.append(
                f"| {label} | {threads}, {affinity} CPU(s) in its affinity | {clients} | {idle['qps']:.1f} "
                f"| {idle['p50_ms']:.0f} / {idle['p99_ms']:.0f} | {busy['qps']:.1f} "
                f"| {busy['p50_ms']:.0f} / {busy['p99_ms']:.0f} | {busy['qps'] / idle['qps']:.0%} "
                f"| {busy['p99_ms'] / busy['p50_ms']:.2f} | {seen(idle)} / {seen(busy)} |"
            )
    return "\n".join(lines) + "\n"
