"""python -m slime_search_r1.demo (make rollout-demo): the plugin's main job offline, on a CPU, in about a minute.

A scripted stand-in for SGLang (`python -m slime_search_r1.standin`, which anyone can serve) writes each turn from a
script (scripts.py, and a call to every other enabled tool before the answer): it shows the plugin's mechanics, not
a model's quality. Everything else is real:
1. the embedded retriever: MiniLM over the 10,033 Wikipedia summaries (`make demo` builds it once; cached), or the
   retrieval server --retrieval_url names (another index: docs/extending.md);
2. evaluate.py, as you would run it against SGLang, once per protocol: LLM_API_MODE=generate (XML tags) and chat
   (tool calls, on data converted by oai_format_data_preprocess.py); each episode goes through generate() and
   reward_func(), searching the retriever over HTTP; the tools are those SEARCH_R1_TOOLS enables (with
   SEARCH_R1_EXTENSIONS, a tool of your own: docs/extending.md);
3. its reports (results.md, the chart) and the viewer's page of every trajectory, token by token;
4. a few episodes on each model family's real tokenizer and template, in both protocols, the stand-in writing that
   family's calls and thoughts (families.py): a line each.
slime itself is used when it is installed; otherwise evaluate.py uses its stand-in (tests/slime_stub). At the end
it prints the commands that run it again by hand: the servers, then evaluate.py.
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
from local_dense_retriever.serving.launcher import ServerProcess, free_port
from slime_search_r1.demo.families import run_families
from slime_search_r1.demo.scripts import DATA_SOURCE, EPISODES, expected_em
from slime_search_r1.launch.signals import Stopped, children, holding, run_child, stop_on_signals
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config, search_r1_configs
from slime_search_r1.settings.table import PLUGIN, read_by

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"  # tests/support rebuilds Qwen2.5's tokenizer offline and writes Search-R1's parquet
DEFAULT_OUTPUT = REPO / ".cache" / "rollout_demo"
MODES = {"xml": "generate", "chat": "chat"}  # the output folder -> LLM_API_MODE
SHOWN = "Where is Apple Inc. headquartered"  # the episode printed at the end (two searches, then the answer)

BANNER = """\
Offline rollout demo. The 'model' is a scripted stand-in for SGLang: it writes fixed turns and never reads what the
searches return, so this shows the plugin's mechanics, not a model's quality. Real: the retriever, generate(),
reward_func(), evaluate.py's report and the viewer's page.
"""
LOCAL = {"SEARCH_BACKEND": "local"}  # the retriever below, whatever the shell sets


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
    sys.path.insert(0, str(TESTS))
    from support.qwen_tokenizer import qwen25_tokenizer_dir

    try:
        config = resolve_config(search_r1_configs({}, {**os.environ, **LOCAL}))
    except ConfigError as exc:
        print(f"rollout demo: error: {exc}", file=sys.stderr)
        return 2
    say_which_slime()
    env = evaluation_env(config)
    print(f"tools: {', '.join(config.tools)} (SEARCH_R1_TOOLS)", flush=True)
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
        data = write_data(args.output_dir, config.tools)
        port = free_port()
        engine_url, engine_command = f"http://127.0.0.1:{port}", standin_command(tokenizer_dir, port, config)
        with serve_standin(engine_command, args.output_dir / "standin.log"):  # while the retrieval server loads
            if server is not None:
                server.wait_ready()
            retrieval_url = server.url if server is not None else args.retrieval_url.removesuffix("/retrieve")
            print(f"retrieval server ready at {retrieval_url}", flush=True)
            commands = {folder: evaluate_command(data[folder], tokenizer_dir, engine_url, retrieval_url, mode,
                                                 args.output_dir / folder)
                        for folder, mode in MODES.items()}  # fmt: skip
            codes = evaluate_both(commands, env, args.output_dir)
        family_problems = run_families(data, MODES, retrieval_url, env)
        print_rerun(server.command if server is not None else None, engine_command, commands, shell_env(env))
    finally:
        if server is not None:
            server.stop()
    return summary(args.output_dir, codes, config.tools, time.perf_counter() - started, family_problems)


def evaluation_env(config) -> dict[str, str]:
    """What evaluate.py's environment adds: the local retriever, and enough turns for the longest script with a call
    to every other enabled tool (unless SEARCH_R1_MAX_TURNS is set)."""
    needed = max(len(episode.turns) for episode in EPISODES) + sum(name != "search" for name in config.tools)
    if needed <= config.max_turns or "SEARCH_R1_MAX_TURNS" in os.environ:
        return dict(LOCAL)
    print(f"SEARCH_R1_MAX_TURNS={needed}: the longest script, and a call to each tool besides search", flush=True)
    return {**LOCAL, "SEARCH_R1_MAX_TURNS": str(needed)}


def shell_env(env: dict[str, str]) -> dict[str, str]:
    """What the printed commands set, so that they rerun in any terminal: PYTHONPATH and the plugin's variables as
    this shell sets them (secrets left out: set those yourself), then `env`."""
    names = ["PYTHONPATH", *(setting.env for setting in read_by(PLUGIN) if setting.env and not setting.secret)]
    return {**{name: os.environ[name] for name in names if name in os.environ}, **env}


def say_which_slime() -> None:
    """Where the evaluation finds slime: installed, or its stand-in (evaluate.py says so too)."""
    spec = importlib.util.find_spec("slime")
    if spec is not None and spec.origin is not None:
        print(f"slime: {Path(spec.origin).parent}", flush=True)
        return
    print("slime is not installed here: the evaluation uses its stand-in tests/slime_stub (only the names the plugin "
          "imports, see its README.md)", flush=True)  # fmt: skip


def write_data(output_dir: Path, tools: list[str]) -> dict[str, Path]:
    """The questions as Search-R1's test parquet (XML mode), and converted for chat mode by the project's script,
    offering the enabled `tools`."""
    from support.search_r1_data import write_search_r1_parquet

    xml = write_search_r1_parquet(output_dir / "questions.parquet",
                                  [(DATA_SOURCE, e.question, list(e.golden_answers)) for e in EPISODES])  # fmt: skip
    chat = output_dir / "questions_chat.parquet"
    command = [sys.executable, str(REPO / "oai_format_data_preprocess.py"), "--input", str(xml), "--output", str(chat),
               "--tools", ",".join(tools)]  # fmt: skip
    converted = run_child(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if converted.returncode != 0:
        raise RuntimeError(f"oai_format_data_preprocess.py failed:\n{converted.stdout}")
    return {"xml": xml, "chat": chat}


def standin_command(tokenizer_dir: Path, port: int, config) -> list[str]:
    """The scripted stand-in for SGLang on 127.0.0.1:`port`, with the extensions the settings name."""
    command = [sys.executable, "-m", "slime_search_r1.standin", "--tokenizer", str(tokenizer_dir), "--port", str(port)]
    return command + (["--extensions", ",".join(config.extensions)] if config.extensions else [])


@contextlib.contextmanager
def serve_standin(command: list[str], log: Path):
    """The stand-in started from the repository (as printed), held until it listens (its first line says so), and
    stopped on the way out."""
    with open(log, "w") as errors, children() as start:
        engine = start(command, cwd=REPO, stdout=subprocess.PIPE, stderr=errors, text=True)
        print(f"starting the scripted stand-in for SGLang (pid {engine.pid})", flush=True)
        try:
            ready = engine.stdout.readline()  # its first line, once it listens; nothing when it failed
            if "http://" not in ready:
                engine.wait()
                raise RuntimeError(f"the stand-in engine exited with {engine.returncode}:\n{log.read_text()}")
            yield
        finally:
            if engine.poll() is None:
                engine.terminate()
            engine.wait()


def evaluate_command(data: Path, tokenizer_dir: Path, engine_url: str, retrieval_url: str, mode: str,
                     output_dir: Path) -> list[str]:  # fmt: skip
    """evaluate.py on the questions in one protocol, with the viewer's page, as it is run and printed (with
    evaluation_env in its environment)."""
    return [sys.executable, str(REPO / "evaluate.py"),
            "--data", str(data), "--hf-checkpoint", str(tokenizer_dir), "--sglang-url", engine_url,
            "--retrieval-url", f"{retrieval_url}/retrieve", "--llm-api-mode", mode, "--output-dir", str(output_dir),
            "--concurrency", "10", "--viewer", "--overwrite"]  # fmt: skip


def evaluate_both(commands: dict[str, list[str]], env: dict[str, str], output_dir: Path) -> dict[str, int]:
    """Each protocol's evaluate.py command, with `env` in its environment: both at once, each one's output shown whole
    once it is done. Returns their exit codes."""
    print(f"running evaluate.py on {len(EPISODES)} questions in each mode ({', '.join(MODES.values())})", flush=True)
    codes = {}
    with children() as start, contextlib.ExitStack() as logs:
        runs = {}
        for folder, command in commands.items():
            log = output_dir / f"evaluate_{folder}.log"
            out = logs.enter_context(open(log, "w"))
            runs[folder] = (log, start(command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT))
        for folder, (log, process) in runs.items():
            codes[folder] = process.wait()
            print(f"\n==== LLM_API_MODE={MODES[folder]}\n{log.read_text()}", end="", flush=True)
    return codes


def print_rerun(
    retriever: list[str] | None, engine: list[str], evaluations: dict[str, list[str]], env: dict[str, str]
) -> None:
    """The commands that run it again by hand, from the repository: the servers (each in a terminal of its own,
    while it runs), then evaluate.py in either protocol; the stand-in and evaluate.py with `env` set."""
    print(f"\n==== to run it again by hand, from {REPO} (each server in a terminal of its own):")
    assignments = "".join(f"{name}={shlex.quote(value)} " for name, value in env.items())
    if retriever is not None:
        print(f"$ {shlex.join(retriever)}")
    for command in [engine, *evaluations.values()]:
        print(f"$ {assignments}{shlex.join(command)}")


def summary(output_dir: Path, codes: dict[str, int], tools: list[str], seconds: float, problems: list[str]) -> int:
    """A table of both runs, one episode in full, where the pages are; 0 when both ran as scripted, every enabled
    tool called, and no `problems` (the family section's)."""
    others = [name for name in tools if name != "search"]  # called once per episode, before the answer
    print("\n==== summary (the answers are scripted; the searches, trajectories and scores are real)")
    print(f"{'LLM_API_MODE':<13} {'episodes':>8} {'EM':>6} {'searches':>9} {'answer found':>13}"
          + "".join(f" {name + ' calls':>16}" for name in others) + "  viewer page")  # fmt: skip
    problems = list(problems)
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
        calls = {name: sum(r["tools"].get(name, {}).get("calls", 0) for r in records) for name in others}
        print(f"{mode:<13} {len(records):>8} {results['average_em']:>6.3f} {sum(r['searches'] for r in records):>9} "
              f"{f'{found}/{len(searched)}':>13}" + "".join(f" {calls[name]:>16}" for name in others)
              + f"  {page}")  # fmt: skip
        problems += [f"{mode}: the {name} tool was never called" for name in others if not calls[name]]
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
