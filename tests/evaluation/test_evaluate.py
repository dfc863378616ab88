"""evaluate.py end to end: the plugin's generate + reward over real parquet files, loopback engine and retriever."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import evaluate
import generate_with_search
import oai_format_data_preprocess
from slime_search_r1.evaluation import chart
from support.interrupt import interruptible
from support.loopback import free_port
from support.slime_compat import subprocess_pythonpath
from support.search_r1_data import write_search_r1_parquet
from support.slime_rollout import chat_prompt

REPO = Path(__file__).resolve().parents[2]

QUESTIONS = [
    ("nq", "What is the capital of France", ["Paris"]),
    ("nq", "Who created the Python programming language", ["Guido van Rossum"]),
    ("hotpotqa", "Which physicist won two Nobel Prizes", ["Marie Curie"]),
    ("bamboogle", "What is Earth's highest mountain", ["Mount Everest", "Everest"]),
]
SCRIPTS = {
    "What is the capital of France?": [
        "<think>Let me check.</think>\n<search> capital of France </search>",
        "<think>Paris.</think>\n<answer> Paris </answer>",
    ],
    "Who created the Python programming language?": [
        "<think>Search.</think>\n<search> Python programming language creator </search>",
        "<think>Found it.</think>\n<answer> Guido van Rossum </answer>",
    ],
    "Which physicist won two Nobel Prizes?": [
        "<think>Search.</think>\n<search> physicist two Nobel Prizes </search>",
        "<think>I will guess.</think>\n<answer> Albert Einstein </answer>",
    ],
    "What is Earth's highest mountain?": ["<think>I know this.</think>\n<answer> K2 </answer>"],
}


@pytest.fixture
def data_file(tmp_path):
    return write_search_r1_parquet(tmp_path / "test.parquet", QUESTIONS)


@pytest.fixture
def scripted(policy):
    policy.scripts.update(SCRIPTS)
    return policy


def cli(data_file, engine, tokenizer_dir, output_dir, *extra):
    return [
        "--data",
        str(data_file),
        "--hf-checkpoint",
        tokenizer_dir,
        "--sglang-url",
        engine.url,
        "--output-dir",
        str(output_dir),
        "--concurrency",
        "3",
        *extra,
    ]


def trajectories(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "trajectories.jsonl").read_text().splitlines()]


def test_slime_s_post_works_as_the_engine_transport(
    data_file, engine, scripted, retriever, search_config, tokenizer_dir, tmp_path
):
    """SEARCH_R1_ENGINE_TRANSPORT=slime: slime's post() has no client until init_http_client(args) ran."""
    search_config["engine_transport"] = "slime"
    out = tmp_path / "out"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out)) == 0
    assert [r["status"] for r in trajectories(out)] == ["completed"] * 4
    assert len(engine.calls) == 7  # three samples search, then answer; one answers at once


def test_em_per_data_source_reports_and_trajectories(
    data_file, engine, scripted, retriever, search_config, tokenizer, tokenizer_dir, tmp_path
):
    out = tmp_path / "out"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out)) == 0

    results = json.loads((out / "results.json").read_text())
    ems = {source: stats["em"] for source, stats in results["data_sources"].items()}
    assert ems == {"nq": 1.0, "hotpotqa": 0.0, "bamboogle": 0.0}
    assert list(results["data_sources"]) == ["nq", "hotpotqa", "bamboogle"]  # Search-R1's table order
    assert results["average_em"] == pytest.approx(1 / 3)  # mean over data sources, not over rows
    assert results["micro_em"] == pytest.approx(0.5)
    assert results["complete"]
    assert results["n"] == 4
    markdown = (out / "results.md").read_text()
    assert "| nq | 2 | 1.000 |" in markdown
    assert "**0.333**" in markdown
    assert (out / "em_by_source.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the bar chart beside them

    records = {r["question"]: r for r in trajectories(out)}
    assert len(records) == 4
    france = records["What is the capital of France"]
    assert france["status"] == "completed"
    assert france["searches"] == 1
    assert france["em"] == 1.0
    assert '<information>Doc 1(Title: "Paris")' in france["response"]
    # evaluation rewards are pure EM: a wrong but well-formed answer gets 0, not the 0.2 format bonus
    assert records["Which physicist won two Nobel Prizes"]["score"] == 0.0
    assert records["Which physicist won two Nobel Prizes"]["format_valid"] == 1.0
    assert sorted(retriever.queries) == sorted(
        ["capital of France", "Python programming language creator", "physicist two Nobel Prizes"]
    )

    # the prompt is the chat-templated Search-R1 instruction (slime's --apply-chat-template) and sampling is greedy
    prompt_ids = tokenizer.encode(chat_prompt(tokenizer, "What is the capital of France"), add_special_tokens=False)
    calls = engine.calls_for(prompt_ids)
    assert len(calls) == 2
    assert calls[0].sampling_params["temperature"] == 0.0
    assert calls[0].sampling_params["max_new_tokens"] == 2048
    assert {"</search>", "</answer>"} <= set(calls[0].sampling_params["stop"])


def test_subset_limit_and_resume_run_only_missing_rows(
    data_file, engine, scripted, retriever, search_config, tokenizer_dir, tmp_path
):
    out = tmp_path / "out"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--data-sources", "nq", "--limit", "1")) == 0
    first = trajectories(out)
    assert [r["question"] for r in first] == ["What is the capital of France"]
    assert list(json.loads((out / "results.json").read_text())["data_sources"]) == ["nq"]
    calls_before = len(engine.calls)

    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--data-sources", "nq,hotpotqa")) == 0
    records = trajectories(out)
    assert len(records) == 3
    assert len({r["key"] for r in records}) == 3  # the first row was not run again
    assert len(engine.calls) - calls_before == 4  # two rows, two turns each
    results = json.loads((out / "results.json").read_text())
    assert set(results["data_sources"]) == {"nq", "hotpotqa"}
    assert results["data_sources"]["nq"]["n"] == 2

    calls_before = len(engine.calls)
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--data-sources", "nq,hotpotqa")) == 0
    assert len(engine.calls) == calls_before  # nothing left to do


def test_samples_whose_search_failed_are_run_again_on_resume(
    data_file, engine, scripted, retriever, search_config, tokenizer_dir, tmp_path, monkeypatch
):
    monkeypatch.setitem(search_config, "search_attempts", 1)
    out = tmp_path / "out"
    retriever.down = True
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--data-sources", "nq")) == 0
    assert {r["status"] for r in trajectories(out)} == {"failed"}
    assert json.loads((out / "results.json").read_text())["data_sources"]["nq"]["em"] == 0.0

    retriever.down = False
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--data-sources", "nq")) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["data_sources"]["nq"]["em"] == 1.0
    assert results["n"] == 2  # latest record per row wins


def test_changed_settings_refuse_to_resume_unless_overwrite(
    data_file, engine, scripted, retriever, search_config, tokenizer_dir, tmp_path, capsys
):
    out = tmp_path / "out"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--limit", "1")) == 0
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--limit", "1", "--temperature", "0.7")) == 2
    assert "temperature: 0.0 -> 0.7" in capsys.readouterr().err
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--temperature", "0.7", "--overwrite")) == 0
    assert len(trajectories(out)) == 4


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda df: df.drop(columns=["reward_model"]), "lacks column(s) reward_model"),
        (
            lambda df: df.assign(reward_model=[{"style": "rule"}] * len(df)),
            "row 0: column 'reward_model': label has no 'target'",
        ),
    ],
)
def test_bad_columns_are_reported(data_file, tokenizer_dir, engine, search_config, tmp_path, capsys, mutate, message):
    import pandas as pd

    bad = tmp_path / "bad.parquet"
    mutate(pd.read_parquet(data_file)).to_parquet(bad)
    assert evaluate.main(cli(bad, engine, tokenizer_dir, tmp_path / "out")) == 2
    assert message in capsys.readouterr().err


def test_missing_file_and_unknown_data_source_are_reported(
    data_file, tokenizer_dir, engine, search_config, tmp_path, capsys
):
    assert evaluate.main(cli(tmp_path / "nope.parquet", engine, tokenizer_dir, tmp_path / "out")) == 2
    assert "data file not found" in capsys.readouterr().err
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, tmp_path / "o", "--data-sources", "nq,musique")) == 2
    assert "musique not in the file; it has bamboogle, hotpotqa, nq" in capsys.readouterr().err


def test_servers_that_do_not_answer_fail_fast(data_file, tokenizer_dir, engine, search_config, tmp_path, capsys):
    class Down:
        url = f"http://127.0.0.1:{free_port()}"

    assert evaluate.main(cli(data_file, Down, tokenizer_dir, tmp_path / "a")) == 2
    assert "SGLang does not answer" in capsys.readouterr().err
    dead_retriever = f"http://127.0.0.1:{free_port()}"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, tmp_path / "b", "--retrieval-url", dead_retriever)) == 2
    assert "retrieval server does not answer" in capsys.readouterr().err
    assert not engine.calls  # both failed in the preflight's one request, before any episode's retries


@pytest.mark.timeout(600)  # its guards are against a hang only: a starved machine starts evaluate.py slowly
def test_interrupted_run_keeps_finished_trajectories_and_resumes(
    engine, tokenizer_dir, retriever, search_config, tmp_path
):
    """A real evaluate.py process interrupted with SIGINT (Ctrl-C), then the same command run again."""
    questions = [("nq", f"Question number {i}", ["unknown"]) for i in range(30)]
    data = write_search_r1_parquet(tmp_path / "many.parquet", questions)
    gate = engine.hold_after(6)  # the run waits there until Ctrl-C has been sent
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": subprocess_pythonpath()}
    arguments = cli(data, engine, tokenizer_dir, out, "--retrieval-url", retriever.url)
    arguments[arguments.index("--concurrency") + 1] = "2"
    process = subprocess.Popen(
        interruptible([sys.executable, str(REPO / "evaluate.py"), *arguments]),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert gate.reached.wait(timeout=300), "the run never reached the engine's gate"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        gate.open()
        engine.gate = None
    assert process.returncode == 130, err
    assert "rerun the same command to resume" in err
    done = trajectories(out)
    assert 0 < len(done) < 30

    calls_before = len(engine.calls)
    assert evaluate.main(arguments) == 0
    assert len(engine.calls) - calls_before == 30 - len(done)  # only the rows that had not finished
    records = trajectories(out)
    assert sorted(int(r["key"]) for r in records) == list(range(30))  # each row exactly once
    assert json.loads((out / "results.json").read_text())["complete"] is True


def test_help_runs_as_a_script():
    result = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    assert "--data-sources" in result.stdout
    assert "--concurrency" in result.stdout


def test_missing_slime_exits_2_with_a_message(monkeypatch, capsys):
    real_import = evaluate.importlib.import_module

    def without_slime(name, *args):
        if name.startswith("slime"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args)

    monkeypatch.setattr(evaluate.importlib, "import_module", without_slime)
    with pytest.raises(SystemExit) as exit_info:
        evaluate.load_plugin()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "slime is not importable" in err
    assert "make rollout-demo" in err and "tests/slime_stub" in err  # the offline way is offered


def test_chat_mode_keeps_the_messages_and_reads_tools_from_the_file(
    data_file, engine, policy, retriever, search_config, tokenizer_dir, tmp_path
):
    chat_file = tmp_path / "test_chat.parquet"
    assert oai_format_data_preprocess.main(
        ["--input", str(data_file), "--output", str(chat_file), "--data-sources", "nq"]
    ) in (0, None)
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>'
    policy.scripts["What is the capital of France?"] = [call, "<think>Paris.</think>\n<answer> Paris </answer>"]
    out = tmp_path / "out"
    assert evaluate.main(cli(chat_file, engine, tokenizer_dir, out, "--llm-api-mode", "chat", "--limit", "1")) == 0
    record = trajectories(out)[0]
    assert record["status"] == "completed"
    assert record["searches"] == 1
    assert record["em"] == 1.0
    assert retriever.queries == ["capital of France"]
    assert json.loads((out / "run_config.json").read_text())["llm_api_mode"] == "chat"


def test_stdout_says_what_each_figure_is_and_no_training_warning_is_printed(
    data_file, engine, scripted, retriever, search_config, tokenizer_dir, tmp_path, capsys, caplog, monkeypatch
):
    monkeypatch.setattr(generate_with_search, "_warned", set())  # each warning is logged once per process
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, tmp_path / "out")) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("# Search-R1 evaluation\n")  # results.md, no unlabelled figures before it
    header = "| data source | n | EM | F1 | cover EM | searches / sample | turns / sample | not completed |"
    assert header in captured.out
    assert "n: trajectories (questions x samples)" in captured.out
    # evaluation trains nothing: slime's reward post-processing and FAILED samples' advantages are no concern here
    assert "post-process" not in captured.err + caplog.text


def test_reference_puts_the_paper_s_figures_beside_the_run_s(
    data_file, engine, scripted, retriever, search_config, tokenizer_dir, tmp_path, capsys, monkeypatch
):
    charted, real_figure = [], chart.em_bar_figure

    def em_bar_figure(summary, title, references=None):
        charted.append(references)
        return real_figure(summary, title, references)

    monkeypatch.setattr(chart, "em_bar_figure", em_bar_figure)
    out = tmp_path / "out"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--reference", "search-r1-base-grpo")) == 0
    assert charted == [json.loads((out / "results.json").read_text())["references"]]  # the paper's bars drawn
    [reference] = json.loads((out / "results.json").read_text())["references"]  # one per score the paper gives
    assert (reference["name"], reference["table"]) == ("search-r1-base-grpo", "Table 3 (GRPO)")
    assert reference["score"] == "em"
    assert reference["rows"] == {
        "nq": {"n": 2, "questions": 2, "run": 1.0, "paper": 0.421, "difference": pytest.approx(1.0 - 0.421)},
        "hotpotqa": {"n": 1, "questions": 1, "run": 0.0, "paper": 0.297, "difference": pytest.approx(-0.297)},
        "bamboogle": {"n": 1, "questions": 1, "run": 0.0, "paper": 0.128, "difference": pytest.approx(-0.128)},
    }
    # three of the seven sources: the paper's Avg column is not comparable, its figures for the same three are
    average = reference["average"]
    assert average["sources"] == ["nq", "hotpotqa", "bamboogle"]
    assert average["paper"] == pytest.approx((0.421 + 0.297 + 0.128) / 3)
    assert average["paper_over"] == "the paper's figures for the same sources"
    printed = capsys.readouterr().out
    for text in (
        "| nq | 2 | 1.000 | 0.421 | +0.579 |",
        "Search-R1 (Jin et al., arXiv 2503.09516 v5), Table 3 (GRPO), Qwen2.5-3B, Search-R1-base, GRPO",
        "third-party transcriptions of the paper's tables, not checked against the PDF",
        "- **few questions** (under 100): nq 2 (±0.69), hotpotqa 1 (±0.98), bamboogle 1 (±0.98).",
    ):
        assert text in printed
        assert text in (out / "results.md").read_text()


def test_an_unknown_reference_is_refused_with_the_names_there_are(data_file, tokenizer_dir, engine, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(cli(data_file, engine, tokenizer_dir, tmp_path / "out", "--reference", "search-r1-7b"))
    assert exit_info.value.code == 2
    assert "invalid choice: 'search-r1-7b'" in capsys.readouterr().err


def test_viewer_records_the_tokens_and_writes_the_run_s_page(
    data_file, engine, scripted, retriever, search_config, tokenizer, tokenizer_dir, tmp_path, capsys
):
    out = tmp_path / "out"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, "--viewer")) == 0
    france = next(r for r in trajectories(out) if r["question"] == "What is the capital of France")
    tokens = france["tokens"]
    assert len(tokens["response_ids"]) == len(tokens["loss_mask"]) == len(tokens["rollout_log_probs"])
    assert tokenizer.decode(tokens["response_ids"]) == france["response"]
    assert tokenizer.decode(tokens["prompt_ids"]) == france["prompt"]
    assert france["episode"]["tools"]["search"]["calls"] == 1
    assert france["episode"]["reward"]["em"] == 1.0

    page = (out / "viewer" / "index.html").read_text(encoding="utf-8")
    data = json.loads(page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0])
    [run] = data["runs"]
    assert (run["kind"], run["total"], len(run["rows"])) == ("evaluate", 4, 4)
    results = json.loads((out / "results.json").read_text())
    assert run["hooks"]["em"] == results["micro_em"]
    assert run["hooks"]["em_by_source/nq"] == results["data_sources"]["nq"]["em"]
    assert data["tokenizer"]  # the evaluation's own tokenizer
    assert "viewer page" in capsys.readouterr().err
