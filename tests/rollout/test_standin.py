"""The scripted stand-in for SGLang that anyone can serve (python -m slime_search_r1.standin), as a newcomer uses it:
served on loopback, it answers /generate as SGLang does and says on every answer that it is scripted; evaluate.py,
run exactly as the offline demo prints it, evaluates against it; its policy calls every tool the prompt offers, an
extension's calculator included; and the reports made from its answers say they were scripted."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

import evaluate
import oai_format_data_preprocess
from slime_search_r1.data import CHAT_SYSTEM_PROMPT, chat_system_prompt, search_r1_prompt
from slime_search_r1.demo import rollouts
from slime_search_r1.registry import TOOLS
from slime_search_r1.standin import SCRIPTED_LABEL, SCRIPTED_WEIGHT_VERSION
from slime_search_r1.standin.policy import StandInPolicy
from slime_search_r1.standin.server import StandInEngine
from support.loopback import free_port, serve_in_thread
from support.search_r1_data import write_search_r1_parquet
from support.slime_compat import SITE, slime_root, using_real_slime

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
QUESTIONS = [
    ("nq", "Which is the largest continent", ["Asia"]),  # one of the demo's scripts: its query, its answer
    ("nq", "What is the capital of France", ["Paris"]),  # any other: searched as written, the first title answers
]
CALCULATOR_RESULT = "<result>2 * (3 + 4) = 14</result>"


def user_env(**variables: str) -> dict[str, str]:
    """A newcomer's shell: the plugin's checkout and examples/ on PYTHONPATH, slime only when the suite runs against
    it (otherwise evaluate.py must find its stand-in itself)."""
    paths = [str(REPO), str(EXAMPLES), *([str(slime_root()), str(SITE)] if using_real_slime() else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEARCH_R1_") and k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": os.pathsep.join(paths), **variables}


@contextlib.contextmanager
def served_standin(command: list[str], env: dict[str, str]):
    """The stand-in started as printed, from the repository; yields it and its first line (once it listens)."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield process, process.stdout.readline()
    finally:
        if process.poll() is None:
            process.terminate()
        process.communicate(timeout=60)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_the_stand_in_answers_generate_on_loopback_marked_scripted_and_stops_on_sigterm(tokenizer, tokenizer_dir):
    port = free_port()
    command = [sys.executable, "-m", "slime_search_r1.standin", "--tokenizer", tokenizer_dir, "--port", str(port)]
    with served_standin(command, user_env()) as (process, first_line):
        assert f"{SCRIPTED_LABEL} for SGLang 0.5.15.post1 at http://127.0.0.1:{port}" in first_line
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": search_r1_prompt("What is the capital of France")}],
            tokenize=False,
            add_generation_prompt=True,
        )
        params = {"max_new_tokens": 64, "stop": ["</search>", "</answer>"], "no_stop_trim": True}
        answer = post(
            f"http://127.0.0.1:{port}/generate",
            {"input_ids": tokenizer.encode(prompt), "sampling_params": params, "return_logprob": True},
        )
        meta = answer["meta_info"]
        assert meta["weight_version"] == SCRIPTED_WEIGHT_VERSION
        assert meta["finish_reason"] == {"type": "stop", "matched": "</search>"}
        assert answer["text"].endswith("<search> What is the capital of France </search>")
        assert tokenizer.decode(answer["output_ids"]) == answer["text"]
        assert [pair[1] for pair in meta["output_token_logprobs"]] == answer["output_ids"]
        assert meta["completion_tokens"] == len(answer["output_ids"])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/model_info", timeout=60) as response:
            assert SCRIPTED_LABEL in json.loads(response.read())["model_path"]
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 143 and "stand-in: stopped (exit code 143)" in err


def test_evaluate_as_the_demo_prints_it_runs_the_calculator_against_the_stand_in(
    tokenizer_dir, retriever, tmp_path, capsys, monkeypatch
):
    """The demo's printed commands with SEARCH_R1_EXTENSIONS=calculator in the shell: the stand-in, then evaluate.py
    in XML mode, each run as printed in a terminal that sets nothing; each episode searches, calls the calculator,
    answers."""
    data = write_search_r1_parquet(tmp_path / "questions.parquet", QUESTIONS)
    port = free_port()
    engine = rollouts.standin_command(Path(tokenizer_dir), port, config_with(["calculator"]))
    run = rollouts.evaluate_command(
        data, Path(tokenizer_dir), f"http://127.0.0.1:{port}", retriever.url, "generate", tmp_path / "xml"
    )
    shell = user_env(SEARCH_R1_EXTENSIONS="calculator", SEARCH_R1_TOOLS="search,calculator")
    for name in ("PYTHONPATH", "SEARCH_R1_EXTENSIONS", "SEARCH_R1_TOOLS"):
        monkeypatch.setenv(name, shell[name])
    rollouts.print_rerun(None, engine, {"xml": run}, rollouts.shell_env({"SEARCH_BACKEND": "local"}))
    printed = [line.removeprefix("$ ") for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert len(printed) == 2
    for assignment in ("SEARCH_R1_TOOLS=search,calculator", "SEARCH_R1_EXTENSIONS=calculator", "SEARCH_BACKEND=local"):
        assert f"{assignment} " in printed[1]
    bare = {k: v for k, v in os.environ.items() if not k.startswith("SEARCH_R1_") and k != "PYTHONPATH"}
    with served_standin(["bash", "-c", printed[0]], bare) as (_, first_line):
        assert "calculator" in first_line  # the extension's tool is registered
        result = subprocess.run(["bash", "-c", printed[1]], cwd=REPO, env=bare, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    if not using_real_slime():
        assert "evaluate.py: slime is not installed here: using its stand-in" in result.stderr
    records = {r["question"]: r for r in map(json.loads, (tmp_path / "xml" / "trajectories.jsonl").open())}
    for question, gold in (("Which is the largest continent", "Asia"), ("What is the capital of France", "Paris")):
        record = records[question]
        assert (record["status"], record["searches"], record["tools"]["calculator"]["calls"]) == ("completed", 1, 1)
        assert CALCULATOR_RESULT in record["response"] and record["answer"] == gold and record["scripted"]
    results_md = (tmp_path / "xml" / "results.md").read_text()
    assert results_md.startswith(f"# Search-R1 evaluation of a {SCRIPTED_LABEL}\n")
    assert f"- model: none, a {SCRIPTED_LABEL} wrote every turn" in results_md
    page = (tmp_path / "xml" / "viewer" / "index.html").read_text()
    assert f"<title>evaluate.py: {Path(tokenizer_dir).name} ({SCRIPTED_LABEL})</title>" in page


def config_with(extensions: list[str]):
    """The settings the demo reads, as far as standin_command looks at them."""
    return type("Config", (), {"extensions": extensions})()


@pytest.fixture
def calculator(monkeypatch, search_config):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    search_config.update(extensions=["calculator"], tools=["search", "calculator"], max_turns=4)
    yield
    if "calculator" in TOOLS.names():
        TOOLS.unregister("calculator")
    sys.modules.pop("calculator", None)


def test_the_stand_in_calls_an_extension_s_tool_in_chat_mode_named_in_the_system_prompt(
    tokenizer, tokenizer_dir, retriever, search_config, calculator, tmp_path
):
    xml = write_search_r1_parquet(tmp_path / "questions.parquet", QUESTIONS)
    chat = tmp_path / "questions_chat.parquet"
    tools = ["--tools", "search,calculator", "--extensions", "calculator"]
    assert oai_format_data_preprocess.main(["--input", str(xml), "--output", str(chat), *tools]) == 0
    system = pq.read_table(chat).to_pylist()[0]["prompt"][0]["content"]
    assert system == chat_system_prompt(["search", "calculator"])
    assert "the search and calculator tools" in system and "a search tool" not in system
    assert chat_system_prompt(["search"]) == CHAT_SYSTEM_PROMPT  # search alone: the prompt as it always was

    engine = StandInEngine(tokenizer, StandInPolicy(), tokenizer_path=tokenizer_dir)
    with serve_in_thread(engine.app) as url:
        out = tmp_path / "chat"
        arguments = ["--data", str(chat), "--hf-checkpoint", tokenizer_dir, "--sglang-url", url, "--output-dir",
                     str(out), "--llm-api-mode", "chat", "--viewer"]  # fmt: skip
        assert evaluate.main(arguments) == 0
    for line in (out / "trajectories.jsonl").open():
        record = json.loads(line)
        conversation = record["episode"]["conversation"]
        called = [call["function"]["name"] for m in conversation for call in m.get("tool_calls") or []]
        assert called == ["search", "calculator"] and record["status"] == "completed"
        assert {"role": "tool", "name": "calculator", "content": "2 * (3 + 4) = 14"}.items() <= next(
            m for m in conversation if m.get("name") == "calculator"
        ).items()
        assert record["scripted"]


@pytest.mark.parametrize("scripted", [True, False])
def test_the_report_and_the_chart_say_scripted_when_the_stand_in_answered(scripted, tmp_path, monkeypatch):
    """What the trajectory lines say (the stand-in's weight version, recorded per engine call) decides the titles."""
    from slime_search_r1.evaluation import chart
    from slime_search_r1.evaluation.reports import markdown_report
    from slime_search_r1.evaluation.summary import summarize

    titles = []
    monkeypatch.setattr(chart, "em_bar_figure", lambda summary, title, references=None: titles.append(title))
    monkeypatch.setattr(chart, "save_png", lambda figure, path: None)
    record = {"key": "0", "data_source": "nq", "status": "completed", "em": 1.0, "scripted": scripted}
    summary = summarize([record], {"nq": 1})
    run_config = {"hf_checkpoint": "/models/qwen2.5-tokenizer", "llm_api_mode": "generate"}
    chart.write_em_chart(tmp_path, summary, run_config)
    title, model = markdown_report(summary, run_config).splitlines()[0:3:2]
    if scripted:
        assert titles == [f"{SCRIPTED_LABEL} (tokenizer qwen2.5-tokenizer): EM per data source (1 of 1 trajectories)"]
        assert title == f"# Search-R1 evaluation of a {SCRIPTED_LABEL}"
        assert model.startswith(f"- model: none, a {SCRIPTED_LABEL} wrote every turn")
    else:  # a model's run reads as it always did
        assert titles == ["qwen2.5-tokenizer: EM per data source (1 of 1 trajectories)"]
        assert (title, model) == ("# Search-R1 evaluation", "- model: `/models/qwen2.5-tokenizer`")


@pytest.mark.parametrize("checkpoint", ["llama-3.2-3b-instruct", "qwen3.5-4b"])
def test_the_stand_in_writes_calls_in_the_model_family_s_format(checkpoint, retriever, search_config, tmp_path):
    """Chat mode on another family's tokenizer: the stand-in places the template in its family (as the plugin does)
    and writes its calls as that family's SGLang parser reads them (Llama's JSON with "parameters", Qwen3.5's
    <function=...>), so the plugin reads each one."""
    from support.model_tokenizers import checkpoint_dir

    from slime_search_r1.families.detection import tokenizer_family

    tokenizer_dir = str(checkpoint_dir(checkpoint))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    xml = write_search_r1_parquet(tmp_path / "questions.parquet", QUESTIONS)
    chat = tmp_path / "questions_chat.parquet"
    assert oai_format_data_preprocess.main(["--input", str(xml), "--output", str(chat)]) == 0
    family = tokenizer_family("auto", tokenizer)
    engine = StandInEngine(tokenizer, StandInPolicy(family=family), tokenizer_path=tokenizer_dir)
    with serve_in_thread(engine.app) as url:
        arguments = ["--data", str(chat), "--hf-checkpoint", tokenizer_dir, "--sglang-url", url, "--output-dir",
                     str(tmp_path / "out"), "--llm-api-mode", "chat"]  # fmt: skip
        assert evaluate.main(arguments) == 0
    records = {r["question"]: r for r in map(json.loads, (tmp_path / "out" / "trajectories.jsonl").open())}
    for question, gold in (("Which is the largest continent", "Asia"), ("What is the capital of France", "Paris")):
        record = records[question]
        assert (record["status"], record["searches"], record["answer"]) == ("completed", 1, gold), record["response"]
        assert record["scripted"]
