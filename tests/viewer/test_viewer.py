"""The viewer without a browser: reading slime's dumps (made by slime's own Sample.to_dict and dump writers from real
episodes, tests/support/viewer_dumps.py), joining the train side, the tokens' text, the figures, the tool calls,
the page's escaping, and the command line's errors. The page in a real browser: test_viewer_browser.py."""

import json
import re
import subprocess
import sys
from dataclasses import replace
from enum import Enum
from pathlib import Path

import numpy as np
import pytest
import torch

from slime_search_r1.episode import episode_record
from slime_search_r1.training.metrics import health_metrics, search_metrics
from slime_search_r1.viewer.__main__ import main as viewer_main
from slime_search_r1.viewer.dumps import InputError, load_torch_file
from slime_search_r1.viewer.inputs import read_inputs
from slime_search_r1.viewer.page import render_page, sample_detail, sample_row, script_json
from slime_search_r1.viewer.samples import ViewSample
from slime_search_r1.viewer.steps import steps_of, tool_calls
from slime_search_r1.viewer.summary import hook_metrics, viewer_metrics
from slime_search_r1.viewer.vocabulary import TokenTexts
from support.viewer_dumps import ABORT_STEP, GAP, HOSTILE_TEXT, RESUMED_AFTER, train_log_probs

REPO = Path(__file__).resolve().parents[2]


class Colour(Enum):  # a type no slime dump holds: torch.load(weights_only=True) must refuse it
    RED = "red"


@pytest.fixture(scope="module")
def runs(viewer_dumps):
    found = read_inputs([viewer_dumps.folder])
    assert found.warnings == []
    return {run.kind: run for run in found.runs}


def f32(values) -> list[float]:
    return [float(v) for v in np.asarray(values, dtype=np.float32)]


def test_a_dump_details_folder_is_read_as_one_rollout_with_its_train_side_and_one_evaluation(viewer_dumps, runs):
    assert sorted(runs) == ["eval", "rollout"]
    rollout, evaluation = runs["rollout"], runs["eval"]
    assert (rollout.name, rollout.source, rollout.train_sources) == (
        "rollout 3",
        str(viewer_dumps.rollout),
        [str(viewer_dumps.train)],
    )
    assert (evaluation.name, evaluation.source, evaluation.train_sources) == (
        "eval 3",
        str(viewer_dumps.evaluation),
        [],
    )
    assert len(rollout.samples) == len(viewer_dumps.samples)
    assert len(evaluation.samples) == len(viewer_dumps.eval_samples)


def test_every_sample_is_read_as_slime_dumped_it(viewer_dumps, runs):
    for seen, sample in zip(runs["rollout"].samples, viewer_dumps.samples, strict=True):
        prompt_length = len(sample.tokens) - sample.response_length
        assert seen.status == sample.status.value
        assert seen.prompt_ids + seen.response_ids == sample.tokens
        assert len(seen.prompt_ids) == prompt_length
        assert seen.loss_mask == sample.loss_mask
        assert seen.rollout_log_probs == sample.rollout_log_probs
        assert seen.response == sample.response
        assert seen.record == episode_record(sample)
        assert (seen.index, seen.group_index, seen.reward, seen.label) == (
            sample.index,
            sample.group_index,
            sample.reward,
            sample.label,
        )
        assert seen.remove_sample == sample.remove_sample
        assert seen.other["spec_info"] == sample.spec_info.to_dict()  # fields the viewer does not draw are kept


def test_the_train_side_joins_each_sample_by_its_rollout_position(viewer_dumps, runs):
    """The train dump came from two DP ranks holding every other sample; each sample gets its own values."""
    for seen, sample in zip(runs["rollout"].samples, viewer_dumps.samples, strict=True):
        assert seen.series["log_probs"] == f32(train_log_probs(sample))
        assert seen.series["ref_log_probs"] == f32([lp - 0.01 for lp in sample.rollout_log_probs])
        assert seen.series["advantages"] == [float(sample.index % 3) - 1.0] * sample.response_length
        assert len(seen.series["entropy"]) == sample.response_length
        expected_mask = [0] * sample.response_length if sample.remove_sample else sample.loss_mask
        assert seen.series["loss_masks"] == expected_mask  # what slime trained: a removed sample is all zeros
    count = len(viewer_dumps.samples)
    assert runs["rollout"].notes == [f"train dump {viewer_dumps.train}: {count} of {count} samples joined"]


def test_a_train_dump_of_other_samples_is_not_joined_to_them(viewer_dumps, tmp_path):
    payload = dict(viewer_dumps.train_payload)
    payload["samples"] = [dict(s) for s in payload["samples"]]
    payload["samples"][1]["tokens"] = payload["samples"][1]["tokens"][:-1]  # not the rollout's sample 1
    (tmp_path / "rollout_data").mkdir()
    (tmp_path / "train_data").mkdir()
    (tmp_path / "rollout_data" / "3.pt").write_bytes(viewer_dumps.rollout.read_bytes())
    torch.save(payload, tmp_path / "train_data" / "3.pt")
    run = read_inputs([tmp_path]).runs[0]
    assert "log_probs" not in run.samples[1].series
    assert "log_probs" in run.samples[0].series
    assert any("sample 1: its tokens differ from the rollout dump's" in note for note in run.notes)


def test_a_train_dump_without_its_rollout_dump_is_a_warning_not_a_page(viewer_dumps):
    found = read_inputs([viewer_dumps.train, viewer_dumps.evaluation])
    assert [run.kind for run in found.runs] == ["eval"]
    assert found.warnings == [f"{viewer_dumps.train}: no rollout dump with rollout_id 3 among the inputs; not shown"]


def test_the_tokens_text_put_end_to_end_is_the_response_even_where_a_token_holds_half_a_character(
    viewer_dumps, runs, tokenizer
):
    texts = TokenTexts(tokenizer)
    for seen in runs["rollout"].samples + runs["eval"].samples:
        texts.learn(seen.response_ids)
        assert texts.vocabulary.decode(seen.response_ids) == seen.response
    assert texts.byte_level
    multibyte = runs["rollout"].samples[viewer_dumps.names.index("multibyte")]
    assert set(multibyte.response_ids) & set(texts.vocabulary.partial)  # the emoji's tokens are kept as bytes
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in texts.vocabulary.special


def test_the_figures_are_the_log_hooks_own_on_the_same_samples(viewer_dumps, runs):
    assert hook_metrics(runs["rollout"]) == search_metrics(viewer_dumps.samples) | health_metrics(viewer_dumps.samples)
    figures = viewer_metrics(runs["rollout"], threshold=0.5)
    statuses = [s.status.value for s in viewer_dumps.samples]
    assert {k: v for k, v in figures.items() if k.startswith("status/")} == {
        f"status/{s}": statuses.count(s) for s in set(statuses)
    }
    scores = [s.metadata["search_r1"]["reward"]["score"] for s in viewer_dumps.samples if s.reward is not None]
    assert figures["reward/std"] == pytest.approx(np.std(scores))
    assert figures["train_rollout_log_prob_gap/max"] == pytest.approx(GAP, abs=0.01)
    assert viewer_metrics(runs["rollout"], threshold=GAP + 1)["train_rollout_log_prob_gap/over_threshold_share"] == 0


def test_tool_calls_are_read_by_tool_name_with_their_arguments_and_results(viewer_dumps, runs, tokenizer):
    texts = TokenTexts(tokenizer)
    samples = runs["rollout"].samples

    def calls(name):
        sample = samples[viewer_dumps.names.index(name)]
        texts.learn(sample.response_ids)
        return tool_calls(sample, steps_of(sample, texts.vocabulary))

    [hostile] = calls("hostile")
    assert (hostile["turn"], hostile["name"], hostile["arguments"]) == (1, "search", " hostile passage ")
    assert HOSTILE_TEXT in hostile["result"]
    [chat] = calls("chat")
    assert (chat["name"], chat["arguments"]) == ("search", {"query": "capital of France"})
    assert chat["result"].startswith('Doc 1(Title: "Paris")')
    assert [c["result"] for c in calls("failed")] == [None]  # the search failed: nothing answered it
    assert [c["turn"] for c in calls("max turns")] == [1, 2, 3]  # the last turn's search is not run
    assert calls("multibyte") == []


def test_a_tool_the_plugin_does_not_know_yet_is_shown_by_its_name():
    sample = ViewSample(
        position=0,
        status="completed",
        prompt="p",
        response="<access> https://example.org </access>\n\n<information>the page</information>\n\n<answer>x</answer>",
        response_length=0,
        metadata={"search_r1": {"tools": {"access": {"calls": 1, "failures": 0, "seconds": [0.1]}}}},
    )
    assert tool_calls(sample, steps_of(sample, None)) == [
        {"turn": 1, "name": "access", "arguments": " https://example.org ", "result": "the page"}
    ]


def test_record_keys_the_viewer_does_not_draw_are_shown_as_they_are(runs):
    sample = runs["rollout"].samples[0]
    record = {**sample.record, "from_a_newer_plugin": {"turn": 2, "tokens": 17}}
    detail = sample_detail(replace(sample, metadata={**sample.metadata, "search_r1": record}), None)
    assert detail["record_more"] == {"from_a_newer_plugin": {"turn": 2, "tokens": 17}}
    assert detail["record"]["from_a_newer_plugin"] == {"turn": 2, "tokens": 17}


def test_a_resumed_sample_says_which_response_tokens_earlier_rollouts_sampled(viewer_dumps, runs, tokenizer):
    """--partial-rollout: slime aborted the episode RESUMED_AFTER tokens into its second turn and resumed it."""
    name = "resumed"
    dumped = viewer_dumps.sample(name)
    record = episode_record(dumped)
    sample = runs["rollout"].samples[viewer_dumps.names.index(name)]
    detail = sample_detail(sample, TokenTexts(tokenizer))
    resumed_at = record["resumed_at"]
    assert len(resumed_at) == 1 and detail["earlier_before"] == resumed_at[0]
    # the first turn, its search results and the second turn's tokens up to the abort's (one more step)
    model_steps = [(start, end) for kind, start, end in detail["steps"] if kind == "model"]
    assert resumed_at[0] == model_steps[1][0] + RESUMED_AFTER + ABORT_STEP
    assert record["earlier_policy_tokens"] == (model_steps[0][1] - model_steps[0][0]) + RESUMED_AFTER + ABORT_STEP
    assert "resumed_at" not in detail["record_more"] and "resume" not in detail["record_more"]
    assert sample_row(sample)["resumes"] == 1
    assert sample_row(runs["rollout"].samples[viewer_dumps.names.index("right")])["resumes"] == 0
    assert sample_detail(runs["rollout"].samples[viewer_dumps.names.index("right")], None)["earlier_before"] == 0


def test_nothing_from_a_sample_can_end_its_script_block(viewer_dumps, runs, tokenizer):
    page = render_page(list(runs.values()), tokenizer=tokenizer)
    # the page's own two scripts and one JSON block per sample: no passage opened or closed another one
    blocks = len(runs["rollout"].samples) + len(runs["eval"].samples)
    assert page.count("<script") == 2 + blocks
    assert page.count("</script>") == 2 + blocks
    assert "window.__pwned" in page  # the passage is there, but only inside JSON strings
    assert "<img" not in page and "<b>bold" not in page
    for block in re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page, re.DOTALL):
        json.loads(block)
    # the passage's line and paragraph separators are in the data, escaped: never raw in a script block
    assert "\u2028" not in page and "\u2029" not in page
    assert "line\\u2028and paragraph\\u2029separators" in page
    assert script_json("</script><!--\u2028\u2029&") == '"\\u003c/script\\u003e\\u003c!--\\u2028\\u2029\\u0026"'


def test_only_the_page_s_own_script_may_run(runs, tokenizer):
    import base64
    import hashlib

    page = render_page(list(runs.values()), tokenizer=tokenizer)
    script = (REPO / "slime_search_r1" / "viewer" / "assets" / "viewer.js").read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert f"script-src 'sha256-{digest}'" in policy
    assert "default-src 'none'" in policy  # and nothing is fetched


def test_the_command_writes_one_page_and_finds_the_tokenizer_dump_details_saved(viewer_dumps, tmp_path, capsys):
    assert viewer_main([str(viewer_dumps.folder), "--output", str(tmp_path / "out")]) == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["index.html"]
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="viewer-data">(.*?)</script>', page, re.DOTALL).group(1))
    assert data["tokenizer"] == str(viewer_dumps.folder / "tokenizer")
    assert len(data["vocab"]["t"]) > 100
    assert f"2 runs, {len(viewer_dumps.samples) + len(viewer_dumps.eval_samples)} samples" in capsys.readouterr().err


def test_without_a_tokenizer_the_page_shows_ids_and_says_so(viewer_dumps, tmp_path, capsys):
    alone = tmp_path / "3.pt"  # no tokenizer/ beside it
    alone.write_bytes(viewer_dumps.rollout.read_bytes())
    assert viewer_main([str(alone), "--output", str(tmp_path)]) == 0
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="viewer-data">(.*?)</script>', page, re.DOTALL).group(1))
    assert data["vocab"] == {"t": {}, "b": {}, "s": []}
    assert "no tokenizer found beside the inputs" in capsys.readouterr().err


def test_max_samples_per_source_keeps_the_first_of_each_source_and_the_figures_of_all(viewer_dumps, tmp_path):
    assert viewer_main([str(viewer_dumps.rollout), "--output", str(tmp_path), "--max-samples-per-source", "1"]) == 0
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="viewer-data">(.*?)</script>', page, re.DOTALL).group(1))
    [run] = data["runs"]
    sources = [s.metadata["data_source"] for s in viewer_dumps.samples]
    first = sorted({sources.index(source) for source in sources})
    assert [row["p"] for row in run["rows"]] == first
    assert run["total"] == len(sources)
    assert run["hooks"]["samples"] == len(sources)


def error_of(argv, capsys) -> str:
    assert viewer_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_bad_inputs_exit_2_with_one_line_naming_the_file(tmp_path, capsys):
    missing = tmp_path / "nowhere.pt"
    assert error_of([str(missing), "--output", str(tmp_path / "o")], capsys) == (
        f"viewer: error: {missing}: no such file or directory"
    )
    text = tmp_path / "notes.pt"
    text.write_text("not a dump")
    assert error_of([str(text), "--output", str(tmp_path / "o")], capsys).startswith(
        f"viewer: error: {text}: not a file written by torch.save"
    )
    other = tmp_path / "weights.pt"
    torch.save({"layer.weight": torch.zeros(2)}, other)
    message = error_of([str(other), "--output", str(tmp_path / "o")], capsys)
    assert message.startswith(f"viewer: error: {other}: not a slime rollout dump")
    assert "found a dict with keys 'layer.weight'" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no slime dump (*.pt) and no evaluate.py trajectories.jsonl under it" in error_of(
        [str(empty), "--output", str(tmp_path / "o")], capsys
    )
    version_1 = tmp_path / "version_1.pt"
    torch.save({"format_version": 1, "samples": []}, version_1)
    assert "the viewer reads version 2" in error_of([str(version_1), "--output", str(tmp_path / "o")], capsys)
    assert not (tmp_path / "o").exists()


def test_a_dump_holding_an_unexpected_type_is_refused_unless_that_type_is_allowed(viewer_dumps, tmp_path, capsys):
    payload = torch.load(viewer_dumps.rollout, weights_only=True)
    payload["samples"][0]["metadata"]["colour"] = Colour.RED
    path = tmp_path / "rollout_3.pt"
    torch.save(payload, path)
    message = error_of([str(path), "--output", str(tmp_path / "o")], capsys)
    assert message == (
        f"viewer: error: {path}: holds {__name__}.Colour, which torch.load(weights_only=True) does not load "
        "(slime's dumps hold only plain values and tensors); if you trust this file, allow exactly that type with "
        f"--allow-global {__name__}.Colour"
    )
    assert load_torch_file(path, [Colour])["samples"][0]["metadata"]["colour"] is Colour.RED
    assert Colour not in torch.serialization.get_safe_globals()  # allowed for that load only
    with pytest.raises(InputError):
        load_torch_file(path)


def test_the_command_runs_without_slime(viewer_dumps, tmp_path):
    """A laptop with the project and no slime: only the repository on the path, and slime never imported."""
    code = (
        "import sys\n"
        "from slime_search_r1.viewer.__main__ import main\n"
        "status = main(sys.argv[1:])\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'slime'], 'slime was imported'\n"
        "sys.exit(status)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", code, str(viewer_dumps.folder), "--output", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,  # only against a hang (under pytest's 300 s): torch and transformers load slowly when busy
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "index.html").stat().st_size > 10_000


def test_rollouts_picks_which_rollouts_dumps_are_read(viewer_dumps, tmp_path, capsys):
    """slime dumps every rollout; --rollouts shows some: ids, or a slice of the ids found (every Nth, the latest)."""
    payload = torch.load(viewer_dumps.rollout, weights_only=True)
    for rollout_id in range(4):
        torch.save({**payload, "rollout_id": rollout_id}, tmp_path / f"rollout_{rollout_id}.pt")
    (tmp_path / "rollout_eval_3.pt").write_bytes(viewer_dumps.evaluation.read_bytes())

    def names(spec: str) -> list[str]:
        assert viewer_main([str(tmp_path), "--output", str(tmp_path / "out"), f"--rollouts={spec}"]) == 0
        page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
        return [
            run["name"] for run in json.loads(re.search(r'id="viewer-data">(.*?)</script>', page, re.S)[1])["runs"]
        ]

    assert names("::2") == ["rollout 0", "rollout 2"]
    assert names("-1:") == ["rollout 3", "eval 3"]
    assert names("1,3") == ["rollout 1", "rollout 3", "eval 3"]
    capsys.readouterr()
    assert error_of([str(tmp_path), "--output", str(tmp_path / "o"), "--rollouts", "7"], capsys) == (
        "viewer: error: --rollouts chose none of the rollout ids the dumps' names hold (0, 1, 2, 3)"
    )
    assert "expected rollout ids (10,20) or a slice" in error_of(
        [str(tmp_path), "--output", str(tmp_path / "o"), "--rollouts", "a:b"], capsys
    )


def test_a_sample_two_weight_versions_sampled_says_which_tokens_each_sampled(viewer_dumps, runs, tokenizer):
    """The resumed episode: slime pushed new weights between the rollout that aborted it and the one that resumed it,
    so the second turn is two engine calls of two versions."""
    sample = runs["rollout"].samples[viewer_dumps.names.index("resumed")]
    detail = sample_detail(sample, TokenTexts(tokenizer))
    cut = detail["earlier_before"]
    model_steps = [(start, end) for kind, start, end in detail["steps"] if kind == "model"]
    (first, first_end), (second, second_end) = model_steps
    assert detail["versions"] == {
        "names": ["1", "2"],
        "lags": [1, 0],
        "spans": [[first, first_end, 0], [second, cut, 0], [cut, second_end, 1]],
    }
    assert not {"versions", "engine_aborts", "restarts", "lag_masked_tokens"} & set(detail["record_more"])
    right = sample_detail(runs["rollout"].samples[viewer_dumps.names.index("right")], None)["versions"]
    assert right["names"] == ["1"] and [k for *_, k in right["spans"]] == [0, 0]


def test_an_evaluate_line_shows_the_answer_evaluate_py_scored_and_a_line_without_one_the_one_its_response_gives():
    from slime_search_r1.viewer.trajectories import sample_from_line

    line = {"key": "k", "status": "completed", "response": "<think>x</think>\n<answer> Paris </answer>"}
    assert sample_from_line(0, line).answer == "Paris"  # no "answer" in the line: read from its response
    assert sample_from_line(0, {**line, "answer": "Lyon"}).answer == "Lyon"  # read with the run's enabled tools
    assert sample_from_line(0, {**line, "answer": None}).answer is None  # it gave no answer
    assert "answer" not in sample_from_line(0, {**line, "answer": "Lyon"}).other
