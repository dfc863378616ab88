"""oai_format_data_preprocess.py on small local parquet files shaped like Search-R1's."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slime_search_r1.data import CHAT_SYSTEM_PROMPT
from slime_search_r1.tools.search import SEARCH_SCHEMA
from support.slime_rollout import slime_sampling_params
from generate_with_search import generate, reward_func
from oai_format_data_preprocess import main
from slime_search_r1.training.metrics import eval_search_metrics
from slime.utils.types import Sample
from slime_search_r1.data import search_r1_prompt

ROOT = Path(__file__).resolve().parents[2]


def search_r1_rows():
    rows = []
    for i, (source, question, answers) in enumerate(
        [
            ("nq", "what is the capital of france", ["Paris"]),
            ("nq", "who wrote hamlet", ["William Shakespeare", "Shakespeare"]),
            ("hotpotqa", "Which river is longer, the Amazon or the Nile?", ["Nile"]),
        ]
    ):
        rows.append(
            {
                "id": f"{source}_{i}",
                "question": question,
                "golden_answers": answers,
                "data_source": source,
                "prompt": [{"role": "user", "content": search_r1_prompt(question)}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
                "extra_info": {"split": "test", "index": i},
            }
        )
    return rows


@pytest.fixture
def search_r1_parquet(tmp_path):
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(search_r1_rows()), path)
    return path


def read_like_slime(path):
    """slime's read_file: ParquetFile batches to Python objects."""
    return [row for batch in pq.ParquetFile(path).iter_batches() for row in batch.to_pylist()]


def test_converts_to_chat_format(search_r1_parquet, tmp_path):
    out = tmp_path / "chat.parquet"
    assert main(["--input", str(search_r1_parquet), "--output", str(out)]) == 0
    rows = read_like_slime(out)
    assert len(rows) == 3
    first = rows[0]
    assert first["prompt"] == [
        {"role": "system", "content": CHAT_SYSTEM_PROMPT},
        {"role": "user", "content": "Question: what is the capital of france?"},
    ]
    assert json.loads(first["tools"]) == [SEARCH_SCHEMA]
    assert first["reward_model"] == {"style": "rule", "ground_truth": {"target": ["Paris"]}}
    assert first["data_source"] == "nq"
    assert first["id"] == "nq_0"
    assert first["extra_info"] == {"split": "test", "index": 0}
    assert rows[2]["prompt"][1]["content"] == "Question: Which river is longer, the Amazon or the Nile?"
    assert [row["metadata"] for row in rows] == [{"data_source": s} for s in ("nq", "nq", "hotpotqa")]


def test_keep_prompt_keeps_the_rows_and_adds_the_data_source_as_metadata(search_r1_parquet, tmp_path):
    out = tmp_path / "xml.parquet"
    assert (
        main(["--input", str(search_r1_parquet), "--output", str(out), "--keep-prompt", "--data-sources", "nq"]) == 0
    )
    rows = read_like_slime(out)
    expected = [row for row in search_r1_rows() if row["data_source"] == "nq"]
    assert [{k: v for k, v in row.items() if k != "metadata"} for row in rows] == expected
    assert [row["metadata"] for row in rows] == [{"data_source": "nq"}] * 2


def test_an_existing_metadata_column_is_kept_and_a_bad_one_reported(tmp_path, capsys):
    path = tmp_path / "meta.parquet"
    row = {"question": "q", "data_source": "nq", "golden_answers": ["a"], "prompt": "p", "metadata": {"lang": "en"}}
    pq.write_table(pa.Table.from_pylist([row]), path)
    assert main(["--input", str(path), "--output", str(tmp_path / "o.parquet"), "--keep-prompt"]) == 0
    assert read_like_slime(tmp_path / "o.parquet")[0]["metadata"] == {"lang": "en", "data_source": "nq"}
    pq.write_table(pa.Table.from_pylist([{**row, "metadata": "en"}]), path)
    assert main(["--input", str(path), "--output", str(tmp_path / "o.parquet")]) == 2
    assert "row 0: 'metadata' must be a dict" in capsys.readouterr().err


def test_data_source_filter_limit_and_system_prompt(search_r1_parquet, tmp_path):
    prompt_file = tmp_path / "system.txt"
    prompt_file.write_text("Be brief.\n")
    out = tmp_path / "chat.parquet"
    args = ["--input", str(search_r1_parquet), "--output", str(out), "--data-sources", "nq", "--limit", "1"]
    assert main([*args, "--system-prompt-file", str(prompt_file)]) == 0
    rows = read_like_slime(out)
    assert len(rows) == 1
    assert rows[0]["data_source"] == "nq"
    assert rows[0]["prompt"][0]["content"] == "Be brief."


def test_golden_answers_are_used_without_reward_model(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "data_source": "nq", "golden_answers": ["a"]}]), path)
    assert main(["--input", str(path), "--output", str(tmp_path / "o.parquet")]) == 0
    assert read_like_slime(tmp_path / "o.parquet")[0]["reward_model"]["ground_truth"]["target"] == ["a"]


def gold_rows(*pairs) -> list[dict]:
    """Rows whose reward_model and golden_answers hold these (target, golden_answers) pairs."""
    return [
        {"question": f"q{i}", "data_source": "nq", "prompt": f"p{i}", "golden_answers": listed,
         "reward_model": {"style": "rule", "ground_truth": {"target": labelled}}}
        for i, (labelled, listed) in enumerate(pairs)
    ]  # fmt: skip


@pytest.mark.parametrize("keep_prompt", [[], ["--keep-prompt"]], ids=["chat", "keep-prompt"])
def test_rows_whose_gold_answers_disagree_are_refused_with_a_count_unless_a_column_is_chosen(
    tmp_path, capsys, keep_prompt
):
    path, out = tmp_path / "gold.parquet", tmp_path / "o.parquet"
    # rows 1 and 3 disagree; row 2 holds the same answers as EM compares them (normalised, in another order)
    rows = gold_rows(
        (["Paris"], ["Paris"]),
        (["Paris"], ["Lyon"]),
        (["The Nile", "Nile River"], ["nile river", "nile"]),
        (["Rome"], ["Roma", "Rome"]),
    )
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert main(["--input", str(path), "--output", str(out), *keep_prompt]) == 2
    error = capsys.readouterr().err
    assert (
        "error: 2 of 4 rows hold different gold answers in reward_model and golden_answers (row 1: reward_model "
        "['Paris'] vs golden_answers ['Lyon']; row 3: reward_model ['Rome'] vs golden_answers ['Roma', 'Rome'])"
    ) in error
    assert "--gold-answers reward_model or --gold-answers golden_answers" in error
    assert not out.exists()  # nothing written

    for column, row_1, row_3 in (
        ("golden_answers", ["Lyon"], ["Roma", "Rome"]),
        ("reward_model", ["Paris"], ["Rome"]),
    ):
        assert main(["--input", str(path), "--output", str(out), *keep_prompt, "--gold-answers", column]) == 0
        said = capsys.readouterr().out
        assert (
            "resolved: 2 rows held different gold answers in reward_model and golden_answers; both now hold the "
            f"{column} column's (row 1: reward_model ['Paris'] vs golden_answers ['Lyon']; row 3: "
        ) in said
        written = read_like_slime(out)
        assert [row["reward_model"]["ground_truth"]["target"] for row in written] == [
            ["Paris"], row_1, ["The Nile", "Nile River"], row_3
        ]  # fmt: skip
        assert [row["golden_answers"] for row in written] == [["Paris"], row_1, ["nile river", "nile"], row_3]


def test_an_error_never_lands_on_the_progress_bar_line(tmp_path, capsys):
    """tqdm draws its bar on stderr without ending the line; an error goes below it, on a line of its own."""
    path = tmp_path / "bad_row.parquet"
    rows = [{"question": q, "data_source": "nq", "golden_answers": ["a"]} for q in ("first", " ", "third")]
    pq.write_table(pa.Table.from_pylist(rows), path)
    for args, message in (([], "error: row 1: 'question' must be a non-empty string"),
                          (["--keep-prompt"], "error: row 0: --keep-prompt needs a 'prompt' column")):  # fmt: skip
        assert main(["--input", str(path), "--output", str(tmp_path / "o.parquet"), *args]) == 2
        err = capsys.readouterr().err
        assert "converting" in err  # the bar was drawn
        lines = err.split("\n")  # tqdm redraws with \r: on a terminal only a newline starts a line
        error_lines = [line for line in lines if "error:" in line]
        assert len(error_lines) == 1 and error_lines[0].startswith(message), error_lines  # no bar before it


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"question": "q"}], "has no column(s) ['data_source']"),
        ([{"question": " ", "data_source": "nq", "golden_answers": ["a"]}], "row 0: 'question' must be a non-empty"),
        ([{"question": "q", "data_source": "nq", "golden_answers": []}], "row 0: no gold answers"),
    ],
)
def test_schema_errors_name_the_problem(tmp_path, capsys, rows, message):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert main(["--input", str(path), "--output", str(tmp_path / "o.parquet")]) == 2
    assert message in capsys.readouterr().err


def test_cli_errors_and_help(tmp_path, capsys):
    assert main(["--input", str(tmp_path / "missing.parquet"), "--output", str(tmp_path / "o.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--input", "x.parquet", "--output", "out.json"])
    assert "--output must end with .parquet" in capsys.readouterr().err
    result = subprocess.run(
        [sys.executable, "oai_format_data_preprocess.py", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0
    for option in (
        "--input",
        "--output",
        "--split",
        "--data-sources",
        "--limit",
        "--system-prompt-file",
        "--keep-prompt",
        "--gold-answers",
    ):
        assert option in result.stdout


async def test_converted_rows_train_in_chat_mode(
    search_r1_parquet, tmp_path, make_args, engine, policy, search_config
):
    out = tmp_path / "chat.parquet"
    main(["--input", str(search_r1_parquet), "--output", str(out)])
    row = read_like_slime(out)[0]
    # what slime builds from a row with --input-key prompt --label-key reward_model --tool-key tools
    sample = Sample(prompt=row["prompt"], label=row["reward_model"], metadata={"tools": json.loads(row["tools"])})
    policy.scripts["what is the capital of france?"] = [
        '<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>',
        "<answer> Paris </answer>",
    ]
    search_config["llm_api_mode"] = "chat"
    args = make_args()
    sample = await generate(args, sample, slime_sampling_params(1024))
    assert sample.status == Sample.Status.COMPLETED
    assert await reward_func(args, sample) == 1.0


# ---- Bad inputs get one line, not a traceback ------------------------------------------------------------------


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("converting")]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def truncated_parquet(path):
    pq.write_table(pa.Table.from_pylist(search_r1_rows()), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("make_input", "message"),
    [
        (lambda p: p.write_text("question,data_source\nq,nq\n"), "is not a readable parquet file"),
        (lambda p: p.write_bytes(b""), "is not a readable parquet file"),
        (truncated_parquet, "is not a readable parquet file"),
        (lambda p: p.mkdir(), "is a directory; --input takes one parquet file"),
        (
            lambda p: pq.write_table(pa.table({"question": pa.array([], pa.string()), "data_source": []}), p),
            "has no rows",
        ),
    ],
    ids=["csv-text", "empty-file", "truncated", "directory", "zero-rows"],
)
def test_an_unreadable_input_is_one_error_line(tmp_path, capsys, make_input, message):
    source = tmp_path / "input.parquet"
    make_input(source)
    assert main(["--input", str(source), "--output", str(tmp_path / "o.parquet")]) == 2
    line = one_error_line(capsys)
    assert str(source) in line
    assert message in line


def test_a_filter_that_keeps_no_row_names_the_data_sources_present(search_r1_parquet, tmp_path, capsys):
    args = ["--input", str(search_r1_parquet), "--output", str(tmp_path / "o.parquet"), "--data-sources", "triviaqa"]
    assert main(args) == 2
    assert "no rows with data_source in ['triviaqa']; the input has ['hotpotqa', 'nq']" in one_error_line(capsys)


class HubRecorder:
    """Stands in for datasets.load_dataset: records the ids it is asked for."""

    def __init__(self, result=None, error=None):
        self.calls, self.result, self.error = [], result, error

    def __call__(self, source, split):
        self.calls.append((source, split))
        if self.error:
            raise self.error
        return self.result


@pytest.mark.parametrize(
    "name",
    ["missing_questions", "data/missing", "nq/test.jsonl", "./owner/name", "{tmp}/absent"],
    ids=["bare-name", "local-dir-prefix", "file-extension", "relative-path", "absolute-path"],
)
def test_a_missing_local_path_fails_at_once_without_asking_the_hub(tmp_path, capsys, monkeypatch, name):
    import datasets

    hub = HubRecorder(error=AssertionError("the hub must not be asked"))
    monkeypatch.setattr(datasets, "load_dataset", hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    source = name.format(tmp=tmp_path)
    assert main(["--input", source, "--output", str(tmp_path / "o.parquet")]) == 2
    line = one_error_line(capsys)
    assert f"{source} does not exist" in line
    assert hub.calls == []


def test_an_owner_name_id_is_loaded_from_the_hub(tmp_path, capsys, monkeypatch):
    import datasets

    hub = HubRecorder(result=datasets.Dataset.from_list(search_r1_rows()))
    monkeypatch.setattr(datasets, "load_dataset", hub)
    monkeypatch.chdir(tmp_path)
    assert main(["--input", "PeterJinGo/nq_hotpotqa_train", "--output", "o.parquet", "--split", "test"]) == 0
    assert hub.calls == [("PeterJinGo/nq_hotpotqa_train", "test")]
    assert len(read_like_slime(tmp_path / "o.parquet")) == 3


def test_a_hub_dataset_that_cannot_be_loaded_is_one_error_line(tmp_path, capsys, monkeypatch):
    import datasets

    error = ConnectionError("Couldn't reach 'someone/absent' on the Hub (LocalEntryNotFoundError)\nmore detail")
    monkeypatch.setattr(datasets, "load_dataset", HubRecorder(error=error))
    assert main(["--input", "someone/absent", "--output", str(tmp_path / "o.parquet")]) == 2
    line = one_error_line(capsys)
    assert "cannot load hub dataset someone/absent (split train)" in line
    assert "Couldn't reach 'someone/absent' on the Hub" in line


async def test_kept_prompt_rows_evaluate_with_em_per_data_source(
    search_r1_parquet, tmp_path, make_args, tokenizer, engine, policy, search_config
):
    out = tmp_path / "xml.parquet"
    main(["--input", str(search_r1_parquet), "--output", str(out), "--keep-prompt"])
    args = make_args()
    samples = []
    for row in read_like_slime(out):
        # what slime builds with --apply-chat-template --label-key reward_model --metadata-key metadata
        prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        policy.scripts[row["question"] + "?"] = ["<think>Sure.</think>\n<answer> Paris </answer>"]
        sample = Sample(prompt=prompt, label=row["reward_model"], metadata=row["metadata"])
        sample = await generate(args, sample, slime_sampling_params(256), evaluation=True)
        sample.reward = await reward_func(args, sample)
        samples.append(sample)
    metrics = eval_search_metrics({"test": {"rewards": [s.reward for s in samples], "samples": samples}})
    assert metrics["eval/search_r1/test/em_by_source/nq"] == 0.5  # Paris is right for France only
    assert metrics["eval/search_r1/test/em_by_source/hotpotqa"] == 0.0
