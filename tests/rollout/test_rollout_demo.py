"""`python -m slime_search_r1.demo` (make rollout-demo) as a newcomer runs it: the scripted stand-in engine, the real
retriever it starts, evaluate.py in both protocols with the viewer's page; and a signal stops all it started.

The demo runs for real on a small corpus (the scripted questions' evidence articles and a spread of others), so that
the searches are MiniLM's and can miss; only the summaries it loads are that small set."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from local_dense_retriever.demo import embedded_default, mini_wiki
from slime_search_r1.demo.families import QUESTIONS as FAMILY_QUESTIONS
from slime_search_r1.demo.scripts import EPISODES, expected_em
from support import process_tree
from support.fake_retriever import FakeRetriever
from support.interrupt import interruptible
from support.loopback import serve_in_thread
from support.model_tokenizers import CHECKPOINTS
from support.slime_compat import SITE, slime_root, slime_src_env, using_real_slime

REPO = Path(__file__).resolve().parents[2]
SMALL_DEMO = (
    "import json, sys\n"
    "from local_dense_retriever.demo import mini_wiki\n"
    "titles = json.load(open(sys.argv[1]))\n"
    "by_title = {summary['title']: summary for summary in mini_wiki.load_summaries()}\n"
    "mini_wiki.load_summaries = lambda: [by_title[title] for title in titles]\n"
    "from slime_search_r1.demo.rollouts import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> tuple[Path, Path]:
    """The evidence articles and every 250th summary: their titles' file, and their index, built here (the demo
    finds it in its cache and reuses it: the same content)."""
    folder = tmp_path_factory.mktemp("small_corpus")
    summaries = mini_wiki.load_summaries()
    by_title = {summary["title"]: summary for summary in summaries}
    titles = list(dict.fromkeys([e.evidence for e in EPISODES] + [s["title"] for s in summaries[::250]]))
    (folder / "titles.json").write_text(json.dumps(titles))
    embedded_default.prepare(folder / "index", progress=False, summaries=[by_title[title] for title in titles])
    return folder / "titles.json", folder / "index"


def demo_command(small_corpus, tmp_path: Path, *flags: str) -> tuple[list[str], dict[str, str]]:
    """The demo over the small corpus, writing under tmp_path; and its environment (slime itself on the path only
    when the suite runs against it: otherwise the demo must find the stand-in)."""
    titles, index = small_corpus
    command = [sys.executable, "-c", SMALL_DEMO, str(titles), "--cache_dir", str(index),
               "--output_dir", str(tmp_path / "out"), *flags]  # fmt: skip
    paths = [str(REPO), *([str(slime_root()), str(SITE)] if using_real_slime() else [])]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLIME_SRC")}
    return command, {**env, **slime_src_env(), "PYTHONPATH": os.pathsep.join(paths)}


def records(folder: Path) -> dict[str, dict]:
    return {json.loads(line)["question"]: json.loads(line) for line in (folder / "trajectories.jsonl").open()}


def test_the_offline_rollout_demo_runs_both_modes_with_real_searches(small_corpus, tmp_path):
    command, env = demo_command(small_corpus, tmp_path)
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "The 'model' is a scripted stand-in for SGLang" in out  # said plainly, first
    assert "not a model's quality" in out
    assert "building the index" not in result.stderr  # the index built above, found by its content
    if using_real_slime():
        assert f"slime: {slime_root() / 'slime'}" in out
    else:
        assert "slime is not installed here: the evaluation uses its stand-in tests/slime_stub" in out

    for folder, mode in (("xml", "generate"), ("chat", "chat")):
        run = tmp_path / "out" / folder
        results = json.loads((run / "results.json").read_text())
        assert results["n"] == len(EPISODES) and results["complete"]
        assert json.loads((run / "run_config.json").read_text())["llm_api_mode"] == mode
        assert results["average_em"] == pytest.approx(expected_em())  # what the scripts answer, scored as such
        by_question = records(run)
        for episode in EPISODES:
            record = by_question[episode.question]
            searches = sum(kind == "search" for kind, _ in episode.turns)
            assert (record["status"], record["searches"], record["search_failures"]) == ("completed", searches, 0)
            assert record["em"] == float(episode.turns[-1][1] in episode.golden_answers)
            if searches:  # MiniLM found the article that holds the answer, among the others
                assert f'(Title: "{episode.evidence}")' in record["response"], (mode, episode.question)
                assert record["retrieval_hit"]
        page = (run / "viewer" / "index.html").read_text()
        assert all(episode.question in page for episode in EPISODES)
        assert (run / "em_by_source.png").is_file()
        assert (run / "results.md").read_text().startswith("# Search-R1 evaluation of a scripted stand-in\n")

    assert "==== one episode (XML): Where is Apple Inc. headquartered?" in out
    rerun = out.split("==== to run it again by hand", 1)[1].split("==== summary", 1)[0]
    printed = [line.removeprefix("$ ") for line in rerun.splitlines() if line.startswith("$ ")]
    assert "-m local_dense_retriever.retrieval_server" in printed[0] and "-m slime_search_r1.standin" in printed[1]
    assert all(" SEARCH_BACKEND=local " in line and "evaluate.py" in line for line in printed[2:4])
    assert '<information>Doc 1(Title: "' in out
    assert_each_family_ran(out)
    server_pid = int(out.split("starting the retrieval server on the mini-Wikipedia (pid ")[1].split(")")[0])
    assert not psutil.pid_exists(server_pid) or "retrieval_server" not in " ".join(
        psutil.Process(server_pid).cmdline()
    )  # the server it started is gone with it


def assert_each_family_ran(out: str) -> None:
    """The family section, titled as scripted: a line per checkpoint and mode, its episodes completed, with a search,
    each family's call as its model writes it (Qwen3.5's <function=search>)."""
    assert "==== each model family, scripted:" in out
    section = out.split("==== each model family, scripted:", 1)[1].split("==== to run it again by hand", 1)[0]
    lines = {tuple(line.split()[:3:2]): line for line in section.splitlines()[2:] if line.strip()}
    assert set(lines) == {(checkpoint, mode) for checkpoint in CHECKPOINTS for mode in ("generate", "chat")}, section
    for (_, mode), line in lines.items():
        episodes, searches = line.split()[3], line.split()[5]  # "2/2 completed", then the searches
        assert episodes == f"{FAMILY_QUESTIONS}/{FAMILY_QUESTIONS}" and int(searches) > 0, line
        assert "<search>" in line if mode == "generate" else "<search>" not in line, line
    assert "<tool_call>\\n<function=search>" in lines["qwen3.5-4b", "chat"]
    assert '<|python_tag|>{"name": "search", "parameters"' in lines["llama-3.2-3b-instruct", "chat"]


def test_a_signal_stops_the_demo_and_the_evaluation_it_runs(small_corpus, tmp_path):
    """Held in its first search (a stand-in retriever given with --retrieval_url), SIGTERM stops the demo and the
    evaluate.py it runs, found by PID."""
    retriever = FakeRetriever()
    hold = retriever.hold_next()
    with serve_in_thread(retriever.app) as url:
        command, env = demo_command(small_corpus, tmp_path, "--retrieval_url", url)
        demo = subprocess.Popen(interruptible(command), env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        started = []
        try:
            assert hold.reached.wait(240), "the first search never came"  # a bound against a hang only
            started = process_tree.tree(demo.pid)
            assert any("evaluate.py" in p.command for p in started)
            demo.send_signal(signal.SIGTERM)
            out, err = demo.communicate(timeout=120)
            assert process_tree.survivors(started) == []
            assert demo.returncode == 143, out + err
            assert "rollout demo: stopped (exit code 143)" in err
        finally:
            hold.release()
            if demo.poll() is None:
                demo.kill()
                demo.communicate()
            process_tree.kill(started)
