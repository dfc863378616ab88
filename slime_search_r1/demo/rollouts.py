"""python -m slime_search_r1.demo (make rollout-demo): the plugin's main job offline, on a CPU, in about a minute.

A stand-in for SGLang that speaks its /generate (tests/support/fake_sglang.py) writes each turn from a script
(scripts.py): it shows the plugin's mechanics, not a model's quality. Everything else is real:
1. the embedded retriever: MiniLM over the 10,033 Wikipedia summaries (`make demo` builds it once; cached);
2. evaluate.py, as you would run it against SGLang, once per protocol: LLM_API_MODE=generate (XML tags) and chat
   (tool calls, on data converted by oai_format_data_preprocess.py); each episode goes through generate() and
   reward_func(), searching the retriever over HTTP;
3. its reports (results.md, the chart) and the viewer's page of every trajectory, token by token.
slime itself is used when it is installed; otherwise its stand-in (tests/slime_stub, the names the plugin imports).
Ctrl-C, SIGTERM or SIGHUP stops it and everything it started.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from local_dense_retriever.demo import embedded_default
from local_dense_retriever.serving.launcher import ServerProcess
from slime_search_r1.demo.scripts import DATA_SOURCE, EPISODES, expected_em, policy_scripts
from slime_search_r1.launch.signals import Stopped, children, holding, run_child, stop_on_signals

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"  # the stand-ins: tests/support (the engine, the tokenizer), tests/slime_stub (slime's names)
SLIME_STUB = TESTS / "slime_stub"
DEFAULT_OUTPUT = REPO / ".cache" / "rollout_demo"
MODES = {"xml": "generate", "chat": "chat"}  # the output folder -> LLM_API_MODE
SHOWN = "Where is Apple Inc. headquartered"  # the episode printed at the end (two searches, then the answer)

BANNER = """\
Offline rollout demo. The 'model' is a scripted stand-in for SGLang: it writes fixed turns and never reads what the
searches return, so this shows the plugin's mechanics, not a model's quality. Real: the retriever, generate(),
reward_func(), evaluate.py's report and the viewer's page.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, default=DEFAULT_OUTPUT, help="where the runs are written")
    parser.add_argument("--cache_dir", type=Path, default=embedded_default.DEFAULT_CACHE_DIR,
                        help="the embedded index's cache (make demo's)")  # fmt: skip
    parser.add_argument("--retrieval_url", default=None,
                        help="use this running retrieval server (e.g. make demo's with --serve) instead of starting "
                        "one")  # fmt: skip
    args = parser.parse_args(argv)
    stop_on_signals()
    try:
        return run(args)
    except Stopped as stopped:
        print(f"\nrollout demo: stopped (exit code {stopped.code})", file=sys.stderr)
        return stopped.code


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    print(BANNER, flush=True)
    sys.path.insert(0, str(TESTS))  # the stand-ins are the test suite's own
    from support.qwen_tokenizer import qwen25_tokenizer_dir

    pythonpath = [str(REPO), *slime_on_path()]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    server = None
    if args.retrieval_url is None:
        assets = embedded_default.prepare(args.cache_dir)
        flags = embedded_default.server_flags(assets.model_dir, assets.index_path, assets.corpus_path,
                                              pages_path=assets.pages_path)  # fmt: skip
        log = args.output_dir / "retrieval_server.log"
        server = ServerProcess(flags, log_path=log, die_with_parent=True)  # stopped however this process ends
    try:
        if server is not None:
            with holding():
                server.spawn()
            print(f"starting the retrieval server on the mini-Wikipedia (pid {server.process.pid})", flush=True)
        tokenizer_dir = qwen25_tokenizer_dir()  # Qwen2.5's tokenizer, rebuilt offline (cached)
        data = write_data(args.output_dir, pythonpath)
        with serve_engines(tokenizer_dir) as engines:  # while the server loads
            if server is not None:
                server.wait_ready()
            retrieval_url = server.url if server is not None else args.retrieval_url.removesuffix("/retrieve")
            print(f"retrieval server ready at {retrieval_url}", flush=True)
            codes = evaluate_both(data, engines, retrieval_url, tokenizer_dir, args.output_dir, pythonpath)
    finally:
        if server is not None:
            server.stop()
    return summary(args.output_dir, codes, time.perf_counter() - started)


def slime_on_path() -> list[str]:
    """Where the evaluation finds slime: installed, or its stand-in (said so)."""
    spec = importlib.util.find_spec("slime")
    if spec is not None and spec.origin is not None:
        print(f"slime: {Path(spec.origin).parent}", flush=True)
        return []
    print(f"slime is not installed here: the evaluation uses its stand-in {SLIME_STUB.relative_to(REPO)} (only the "
          "names the plugin imports, see its README.md)", flush=True)  # fmt: skip
    return [str(SLIME_STUB)]


def write_data(output_dir: Path, pythonpath: list[str]) -> dict[str, Path]:
    """The questions as Search-R1's test parquet (XML mode), and converted for chat mode by the project's script."""
    from support.search_r1_data import write_search_r1_parquet

    xml = write_search_r1_parquet(output_dir / "questions.parquet",
                                  [(DATA_SOURCE, e.question, list(e.golden_answers)) for e in EPISODES])  # fmt: skip
    chat = output_dir / "questions_chat.parquet"
    command = [sys.executable, str(REPO / "oai_format_data_preprocess.py"), "--input", str(xml), "--output", str(chat)]
    converted = run_child(command, env=child_env(pythonpath), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)  # fmt: skip
    if converted.returncode != 0:
        raise RuntimeError(f"oai_format_data_preprocess.py failed:\n{converted.stdout}")
    return {"xml": xml, "chat": chat}


@contextlib.contextmanager
def serve_engines(tokenizer_dir: Path):
    """One stand-in engine per protocol on 127.0.0.1 (in this process): {folder: its URL}."""
    from transformers import AutoTokenizer

    from support.fake_sglang import FakeSGLangEngine, ScriptedPolicy
    from support.loopback import serve_in_thread

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with contextlib.ExitStack() as stack:
        urls = {}
        for folder, mode in MODES.items():
            engine = FakeSGLangEngine(tokenizer, ScriptedPolicy(policy_scripts(mode)), record=False)
            engine.url = urls[folder] = stack.enter_context(serve_in_thread(engine.app))
        yield urls


def child_env(pythonpath: list[str]) -> dict[str, str]:
    extra = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, *([extra] if extra else [])])}


def evaluate_both(data: dict[str, Path], engines: dict[str, str], retrieval_url: str, tokenizer_dir: Path,
                  output_dir: Path, pythonpath: list[str]) -> dict[str, int]:  # fmt: skip
    """evaluate.py on the questions in each protocol, with the viewer's page: both at once, each one's output shown
    whole once it is done (its command first, to run it by hand). Returns their exit codes."""
    env = child_env(pythonpath) | {"SEARCH_BACKEND": "local"}  # the retriever above, whatever the shell sets
    print(f"running evaluate.py on {len(EPISODES)} questions in each mode ({', '.join(MODES.values())})", flush=True)
    codes = {}
    with children() as start, contextlib.ExitStack() as logs:
        runs = {}
        for folder, mode in MODES.items():
            command = [sys.executable, str(REPO / "evaluate.py"), "--data", str(data[folder]),
                       "--hf-checkpoint", str(tokenizer_dir), "--sglang-url", engines[folder],
                       "--retrieval-url", f"{retrieval_url}/retrieve", "--llm-api-mode", mode,
                       "--output-dir", str(output_dir / folder), "--concurrency", "10", "--viewer",
                       "--overwrite"]  # fmt: skip
            log = output_dir / f"evaluate_{folder}.log"
            out = logs.enter_context(open(log, "w"))
            runs[folder] = (command, log, start(command, env=env, stdout=out, stderr=subprocess.STDOUT))
        for folder, (command, log, process) in runs.items():
            codes[folder] = process.wait()
            print(f"\n==== LLM_API_MODE={MODES[folder]}\n$ {shlex.join(command)}\n{log.read_text()}", end="",
                  flush=True)  # fmt: skip
    return codes


def summary(output_dir: Path, codes: dict[str, int], seconds: float) -> int:
    """A table of both runs, one episode in full, where the pages are; 0 when both ran as scripted."""
    print("\n==== summary (the answers are scripted; the searches, trajectories and scores are real)")
    print(f"{'LLM_API_MODE':<13} {'episodes':>8} {'EM':>6} {'searches':>9} {'answer found':>13}  viewer page")
    problems = []
    for folder, mode in MODES.items():
        results_path = output_dir / folder / "results.json"
        if codes[folder] != 0 or not results_path.is_file():
            problems.append(f"evaluate.py in {mode} mode exited with {codes[folder]}")
            continue
        results = json.loads(results_path.read_text())
        records = [json.loads(line) for line in (output_dir / folder / "trajectories.jsonl").read_text().splitlines()]
        searched = [r for r in records if r["searches"]]
        found = sum(bool(r["retrieval_hit"]) for r in searched)
        failures = sum(r["search_failures"] for r in records)
        page = output_dir / folder / "viewer" / "index.html"
        print(f"{mode:<13} {len(records):>8} {results['average_em']:>6.3f} {sum(r['searches'] for r in records):>9} "
              f"{f'{found}/{len(searched)}':>13}  {page}")  # fmt: skip
        if abs(results["average_em"] - expected_em()) > 1e-9 or failures:
            problems.append(f"{mode}: EM {results['average_em']:.3f} (scripted: {expected_em():.3f}), "
                            f"{failures} failed searches")  # fmt: skip
    print("'answer found': episodes whose searches returned a gold answer (reward_func's retrieval_hit)")
    show_episode(output_dir / "xml" / "trajectories.jsonl")
    print(f"\nreports: {output_dir}/{{xml,chat}}/results.md; the viewer's pages, in a browser:")
    for folder in MODES:
        print(f"  {(output_dir / folder / 'viewer' / 'index.html').resolve().as_uri()}")
    print(f"done in {seconds:.0f} s")
    for problem in problems:
        print(f"rollout demo: error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def show_episode(trajectories: Path, width: int = 116) -> None:
    """One XML episode's response as the policy wrote it and the retriever answered, documents cut to a line."""
    if not trajectories.is_file():
        return
    records = [json.loads(line) for line in trajectories.read_text().splitlines()]
    record = next((r for r in records if r["question"] == SHOWN), None)
    if record is None:
        return
    print(f"\n==== one episode (XML): {record['question']}? reward {record['score']:g}, status {record['status']}")
    for line in record["response"].splitlines():
        if line.strip():
            print(line if len(line) <= width else line[: width - 3] + "...")
