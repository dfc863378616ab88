"""evaluate.py's scores beside EM end to end: F1, cover EM, an LLM judge (a loopback stand-in), K samples per
question, re-scoring a run without generating, references from a file, and the settings refused before any call."""

import json
from pathlib import Path

import pytest

import evaluate
from slime_search_r1.scoring.answers import exact_match
from support.fake_judge import default_rule, prediction_of
from support.fake_sglang import ScriptedPolicy, question_of
from support.search_r1_data import write_search_r1_parquet

QUESTIONS = [
    ("nq", "What is the capital of France", ["Paris"]),
    ("nq", "Who created the Python programming language", ["Guido van Rossum"]),
    ("hotpotqa", "Which physicist won two Nobel Prizes", ["Marie Curie"]),
    ("bamboogle", "What is Earth's highest mountain", ["Mount Everest", "Everest"]),
]
ANSWERS = {  # answered at once: EM, F1, cover EM, the stand-in judge's verdict (a gold inside the answer)
    "What is the capital of France?": "Paris, France",  # 0, 2/3, 1, correct
    "Who created the Python programming language?": "Guido van Rossum",  # 1, 1, 1, correct
    "Which physicist won two Nobel Prizes?": "Albert Einstein",  # 0, 0, 0, incorrect
    "What is Earth's highest mountain?": "Mt. Everest",  # 0, 2/3, 1, correct
}


class CyclingPolicy(ScriptedPolicy):
    """Answers each question with the next of its answers, call after call: K samples get different answers."""

    def __init__(self, answers: dict[str, list[str]]):
        super().__init__()
        self.answers = answers
        self.calls: dict[str, int] = {}

    def __call__(self, context_text: str) -> str:
        question = question_of(context_text)
        options = self.answers.get(question, ["unknown"])
        n = self.calls[question] = self.calls.get(question, 0) + 1
        return f"<think>I know this.</think>\n<answer> {options[(n - 1) % len(options)]} </answer>"


@pytest.fixture
def policy():
    return CyclingPolicy({question: [answer] for question, answer in ANSWERS.items()})


@pytest.fixture
def data_file(tmp_path):
    return write_search_r1_parquet(tmp_path / "test.parquet", QUESTIONS)


def cli(data_file, engine, tokenizer_dir, output_dir, *extra):
    return [
        *("--data", str(data_file), "--hf-checkpoint", tokenizer_dir, "--sglang-url", engine.url),
        *("--output-dir", str(output_dir), "--concurrency", "3"),
        *extra,
    ]


def judge_flags(judge, *extra):
    return ["--judge-url", judge.url, "--judge-model", "judge-7b", "--judge-attempts", "2", *extra]


def results(output_dir: Path) -> dict:
    return json.loads((output_dir / "results.json").read_text())


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_em_f1_cover_em_and_the_judge_side_by_side(
    data_file, engine, policy, retriever, search_config, tokenizer_dir, judge_server, tmp_path, capsys
):
    out = tmp_path / "out"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, *judge_flags(judge_server))) == 0

    summary = results(out)
    assert summary["scores"] == ["em", "f1", "cover_em", "judge"]
    expected = {
        "nq": {"em": 0.5, "f1": 5 / 6, "cover_em": 1.0, "judge": 1.0},
        "hotpotqa": {"em": 0.0, "f1": 0.0, "cover_em": 0.0, "judge": 0.0},
        "bamboogle": {"em": 0.0, "f1": 2 / 3, "cover_em": 1.0, "judge": 1.0},
    }
    for source, scores in expected.items():
        assert {key: summary["data_sources"][source][key] for key in scores} == pytest.approx(scores)
    assert summary["average_f1"] == pytest.approx(0.5)
    assert summary["average_judge"] == pytest.approx(2 / 3)
    assert summary["unjudged"] == 0
    assert summary["judge"]["model"] == "judge-7b"

    trajectories = {r["question"]: r for r in lines(out / "trajectories.jsonl")}
    for record in trajectories.values():  # the answer kept is the one reward_func scored
        assert record["em"] == exact_match(record["answer"], record["golden_answers"])
    france = trajectories["What is the capital of France"]
    assert (france["answer"], france["em"], france["f1"], france["cover_em"]) == ("Paris, France", 0.0, 2 / 3, 1.0)
    verdicts = {v["key"]: v for v in lines(out / "judgements.jsonl")}
    assert len(verdicts) == 4
    assert verdicts[france["key"]]["status"] == "correct"
    assert verdicts[france["key"]]["reply"].endswith("Verdict: correct")  # the raw reply, kept
    assert verdicts[france["key"]]["answer"] == "Paris, France"

    markdown = (out / "results.md").read_text()
    assert "| data source | n | EM | F1 | cover EM | judge |" in markdown
    assert "| nq | 2 | 0.500 | 0.833 | 1.000 | 1.000 |" in markdown
    assert "| nq | 2 | 0.500 | 0.833 | 1.000 | 1.000 |" in capsys.readouterr().out


def test_a_judge_that_is_down_marks_the_samples_and_rescore_asks_again_without_generating(
    data_file, engine, policy, retriever, search_config, tokenizer_dir, judge_server, tmp_path, capsys
):
    out = tmp_path / "out"
    judge_server.always = "http500"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, *judge_flags(judge_server))) == 1
    err = capsys.readouterr().err
    assert "4 trajectories have no usable verdict" in err
    summary = results(out)
    assert summary["unjudged"] == 4
    assert summary["data_sources"]["nq"]["judge"] is None  # marked, not a silent 0
    assert summary["data_sources"]["nq"]["em"] == 0.5  # the other scores stand
    assert {v["status"] for v in lines(out / "judgements.jsonl")} == {"error"}

    calls = len(engine.calls)
    judge_server.always = None
    assert evaluate.main(["rescore", str(out), *judge_flags(judge_server)]) == 0
    assert len(engine.calls) == calls  # nothing generated again
    summary = results(out)
    assert summary["unjudged"] == 0
    assert summary["average_judge"] == pytest.approx(2 / 3)

    judged = len(judge_server.bodies)
    assert evaluate.main(["rescore", str(out), *judge_flags(judge_server)]) == 0  # every answer has its verdict
    assert evaluate.main(["rescore", str(out)]) == 0  # no judge flags: the judge that ran here, nobody asked
    assert len(judge_server.bodies) == judged
    assert results(out)["average_judge"] == pytest.approx(2 / 3)


def test_a_row_run_again_with_a_new_answer_is_judged_again_not_scored_by_its_old_verdict(
    data_file, engine, retriever, search_config, tokenizer_dir, judge_server, tmp_path, monkeypatch
):
    """Run 1: the search is down, the sample fails without an answer and is judged (no answer: 0, nobody asked).
    Run 2 resumes the failed row: it searches and answers Paris (EM 1). Its old verdict judged another answer."""
    engine.policy = ScriptedPolicy(
        {
            "What is the capital of France?": [
                "<think>Let me check.</think>\n<search> capital of France </search>",
                "<think>Paris.</think>\n<answer> Paris </answer>",
            ]
        }
    )
    monkeypatch.setitem(search_config, "search_attempts", 1)
    out = tmp_path / "out"
    first = cli(data_file, engine, tokenizer_dir, out, "--data-sources", "nq", "--limit", "1")
    retriever.down = True
    assert evaluate.main([*first, *judge_flags(judge_server)]) == 0
    [verdict] = lines(out / "judgements.jsonl")
    assert (verdict["status"], verdict["answer"], results(out)["average_judge"]) == ("no_answer", None, 0.0)

    retriever.down = False
    assert evaluate.main(first) == 0  # resumed without the judge flags: the judge that ran here is reported
    summary = results(out)
    assert (summary["average_em"], summary["unjudged"], summary["average_judge"]) == (1.0, 1, None)

    assert evaluate.main(["rescore", str(out), *judge_flags(judge_server)]) == 0
    assert len(judge_server.bodies) == 1  # asked about "Paris", the answer the trajectory holds now
    assert prediction_of(judge_server.bodies[0]["messages"][0]["content"]) == "Paris"
    summary = results(out)
    assert (summary["average_em"], summary["unjudged"], summary["average_judge"]) == (1.0, 0, 1.0)
    assert lines(out / "judgements.jsonl")[-1]["answer"] == "Paris"


def test_another_judge_prompt_is_asked_again_and_its_verdicts_counted(
    data_file, engine, policy, retriever, search_config, tokenizer_dir, judge_server, tmp_path
):
    out = tmp_path / "out"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, *judge_flags(judge_server))) == 0
    prompt = tmp_path / "strict.txt"
    prompt.write_text("Strict. Q: {question}\nGold: {gold_answers}\nAnswer: {prediction}\n")
    judge_server.rule = lambda text: "Verdict: incorrect"
    assert evaluate.main(["rescore", str(out), *judge_flags(judge_server, "--judge-prompt", str(prompt))]) == 0
    assert len(judge_server.bodies) == 8
    assert judge_server.bodies[-1]["messages"][0]["content"].startswith("Strict. Q: ")
    assert results(out)["average_judge"] == 0.0
    assert results(out)["judge"]["prompt_file"] == str(prompt)


def test_k_samples_per_question_give_avg_and_pass_at_k(
    data_file, engine, retriever, search_config, tokenizer_dir, tmp_path, policy
):
    policy.answers = {"What is the capital of France?": ["Paris", "Lyon", "Lyon", "Lyon"]}
    out = tmp_path / "out"
    extra = ("--data-sources", "nq", "--samples-per-question", "4", "--temperature", "0.7", "--top-p", "0.9")
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, *extra)) == 0

    assert len(engine.calls) == 8  # two questions, four samples each
    assert {call.sampling_params["temperature"] for call in engine.calls} == {0.7}
    keys = sorted(r["key"] for r in lines(out / "trajectories.jsonl"))
    assert keys == ["0#0", "0#1", "0#2", "0#3", "1#0", "1#1", "1#2", "1#3"]
    nq = results(out)["data_sources"]["nq"]
    assert (nq["n"], nq["questions"], nq["selected"]) == (8, 2, 8)
    assert nq["em"] == pytest.approx((0.25 + 0.0) / 2)  # avg@4: France 1 of 4, Python none
    assert nq["em_pass@4"] == pytest.approx((1.0 + 0.0) / 2)  # pass@4: France yes, Python no
    assert results(out)["scores"] == ["em", "f1", "cover_em", "em_pass@4", "f1_pass@4", "cover_em_pass@4"]
    config = json.loads((out / "run_config.json").read_text())
    assert (config["samples_per_question"], config["temperature"], config["top_p"]) == (4, 0.7, 0.9)
    markdown = (out / "results.md").read_text()
    assert "| nq | 8 | 0.125 | 0.125 | 0.125 | 0.500 | 0.500 | 0.500 |" in markdown
    assert "EM avg@4 | F1 avg@4 | cover EM avg@4 | EM pass@4 |" in markdown


def test_a_reference_file_puts_f1_and_judge_figures_beside_the_run(
    data_file, engine, policy, retriever, search_config, tokenizer_dir, judge_server, tmp_path, capsys
):
    table = tmp_path / "baseline.json"
    table.write_text(
        json.dumps(
            {
                "method": "our last model",
                "source": "eval/step_100, judged by judge-7b",
                "scores": {"f1": {"nq": 0.5, "hotpotqa": 0.25}, "judge": {"nq": 0.75}},
            }
        )
    )
    out = tmp_path / "out"
    extra = ("--reference", str(table), *judge_flags(judge_server))
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, *extra)) == 0
    f1, judge = results(out)["references"]
    assert (f1["score"], judge["score"]) == ("f1", "judge")
    assert f1["rows"]["nq"]["difference"] == pytest.approx(5 / 6 - 0.5)
    assert f1["average"]["sources"] == ["nq", "hotpotqa"]
    assert judge["rows"]["nq"] == {"n": 2, "questions": 2, "run": 1.0, "paper": 0.75, "difference": 0.25}
    printed = capsys.readouterr().out
    assert "| data source | n | F1 (this run) | paper: F1 | difference | judge (this run) | paper: judge |" in printed
    assert "| nq | 2 | 0.833 | 0.500 | +0.333 | 1.000 | 0.750 | +0.250 |" in printed


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"method": "m", "source": "s", "scores": {"em": {"nqq": 0.4}}}, "unknown data source 'nqq' in scores.em"),
        ({"method": "m", "source": "s", "scores": {"em": {"nq": 42.1}}}, "write percentages as fractions (42.1 ->"),
        (
            {"method": "m", "source": "s", "scores": {"bleu": {"nq": 0.4}}},
            "unknown score 'bleu' in 'scores'; accepted: em, f1, cover_em, judge",
        ),
        ({"method": "m", "scores": {"em": {"nq": 0.4}}}, "'source' must be a non-empty string"),
    ],
)
def test_a_bad_reference_file_is_refused_before_any_engine_call(
    data_file, engine, search_config, tokenizer_dir, tmp_path, capsys, document, message
):
    table = tmp_path / "table.json"
    table.write_text(json.dumps(document))
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, tmp_path / "out", "--reference", str(table))) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not engine.calls


def test_a_data_source_of_the_file_is_accepted_in_a_reference(
    engine, policy, retriever, search_config, tokenizer_dir, tmp_path
):
    data = write_search_r1_parquet(tmp_path / "mine.parquet", [("my_set", "What is the capital of France", ["Paris"])])
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"method": "m", "source": "s", "scores": {"f1": {"my_set": 0.5}}}))
    assert evaluate.main(cli(data, engine, tokenizer_dir, tmp_path / "out", "--reference", str(table))) == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--judge-url", "http://127.0.0.1:9/v1"), "--judge-url needs --judge-model"),
        (("--judge-model", "m"), "--judge-model needs --judge-url"),
        (("--judge-url", "judge:8000", "--judge-model", "m"), "--judge-url: must be an http(s) URL"),
        (("--samples-per-question", "0"), "argument --samples-per-question: must be >= 1, got 0"),
        (("--samples-per-question", "4"), "--samples-per-question 4 needs --temperature > 0"),
        (("--judge-concurrency", "0"), "argument --judge-concurrency: must be >= 1, got 0"),
        (("--reference", "deepresearcher-f1"), "argument --reference: invalid choice: 'deepresearcher-f1'"),
    ],
)
def test_bad_settings_are_one_line_before_any_engine_call(
    data_file, engine, tokenizer_dir, tmp_path, capsys, extra, message
):
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(cli(data_file, engine, tokenizer_dir, tmp_path / "out", *extra))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.strip().splitlines()[-1].startswith("evaluate.py: error: ")
    assert not engine.calls
    assert not (tmp_path / "out").exists()


def test_a_prompt_file_without_its_placeholders_is_refused(data_file, engine, tokenizer_dir, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Is {prediction} right?")
    extra = ("--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "m", "--judge-prompt", str(prompt))
    with pytest.raises(SystemExit):
        evaluate.main(cli(data_file, engine, tokenizer_dir, tmp_path / "out", *extra))
    assert "--judge-prompt: " in capsys.readouterr().err
    assert not engine.calls


def test_the_api_key_reaches_the_judge_and_nothing_written(
    data_file, engine, policy, retriever, search_config, tokenizer_dir, judge_server, tmp_path, capsys, monkeypatch
):
    key = "sk-live-a1b2c3d4e5f6"
    monkeypatch.setenv("JUDGE_API_KEY", key)
    out = tmp_path / "out"
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, *judge_flags(judge_server))) == 0
    assert set(judge_server.authorizations) == {f"Bearer {key}"}
    captured = capsys.readouterr()
    assert key not in captured.out + captured.err
    for path in out.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


DOCUMENTED_ANSWERS = {  # the test engine's four samples of each question (docs/evaluation.md)
    "What is the capital of France?": ["Paris", "Paris, France", "Lyon", "Paris"],
    "Who created the Python programming language?": [
        "Guido van Rossum",
        "van Rossum",
        "Guido van Rossum",
        "Larry Wall",
    ],
    "Which physicist won two Nobel Prizes?": ["Albert Einstein", "Pierre Curie", "Albert Einstein", "Einstein"],
    "What is Earth's highest mountain?": ["Mt. Everest", "K2", "Mount Everest", "Everest"],
}


def documented_judge(prompt: str) -> str:
    """The stand-in judge of docs/evaluation.md's run: a gold answer inside the answer, or a short form of one."""
    reply = default_rule(prompt)
    if reply.endswith("incorrect") and prediction_of(prompt) == "van Rossum":
        return "The surname names the same person.\nVerdict: correct"
    return reply


def test_the_documented_run_every_score_side_by_side(
    data_file, engine, retriever, search_config, tokenizer_dir, judge_server, tmp_path, policy, capsys
):
    """The run docs/evaluation.md shows: four samples per question, judged by a stand-in."""
    policy.answers = DOCUMENTED_ANSWERS
    judge_server.rule = documented_judge
    out = tmp_path / "eval_output"
    extra = ("--samples-per-question", "4", "--temperature", "0.7", "--reference", "asearcher-local-7b")
    assert evaluate.main(cli(data_file, engine, tokenizer_dir, out, *extra, *judge_flags(judge_server))) == 0
    printed = capsys.readouterr().out
    print(printed)  # pytest -s shows what docs/evaluation.md pastes
    summary = results(out)["data_sources"]
    # France: EM 1,0,0,1  F1 1,2/3,0,1  cover 1,1,0,1  judge 1,1,0,1; Python: EM 1,0,1,0  F1 1,.8,1,0  cover 1,0,1,0
    # and judge 1,1,1,0 ("van Rossum"); Nobel: EM 0, F1 0,.5,0,0, cover and judge 0: pass@4 0 but F1's 0.5
    assert summary["nq"]["f1"] == pytest.approx((2 + 2 / 3 + 2.8) / 8)
    assert (summary["nq"]["cover_em"], summary["nq"]["judge"]) == (0.625, 0.75)
    assert (summary["hotpotqa"]["em_pass@4"], summary["hotpotqa"]["f1_pass@4"]) == (0.0, 0.5)
    assert "| nq | 8 | 0.500 | 0.683 | 0.625 | 0.750 | 1.000 | 1.000 | 1.000 | 1.000 |" in printed
    assert "| F1 avg@4 (this run) | paper: F1 | difference | judge avg@4 (this run) | paper: judge |" in printed
    assert "| nq | 8 | 0.683 | 0.556 | +0.127 | 0.750 | 0.545 | +0.205 |" in printed
