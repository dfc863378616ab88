"""A newcomer's additions, one file each, as examples/ ships them and SEARCH_R1_EXTENSIONS loads them: a calculator
tool (both protocols, the reward's format rule and retrieval bonus, the data script) and an answer score of one's own
(the reward built on it, its metric). Nothing under slime_search_r1/ is touched by either."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from generate_with_search import generate, reward_func
from qa_em_format import format_problem
from slime.utils.types import Sample
from slime_search_r1.data import search_r1_prompt
from slime_search_r1.registry import ANSWER_SCORES, TOOLS
from slime_search_r1.settings.sources import resolve_config
from slime_search_r1.tools.search import SEARCH_SCHEMA
from slime_search_r1.training.metrics import search_metrics
from support.episodes import QUESTION, chat_messages, info, label
from support.slime_rollout import chat_prompt, slime_sampling_params

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CALL = "<think>Compute it.</think>\n<calculator> 2 * (3 + 4) </calculator>"
CHAT_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 * (3 + 4)"}}\n</tool_call>'


@pytest.fixture
def extensions(monkeypatch, search_config):
    """Loads examples/<name>.py through the extensions setting, as SEARCH_R1_EXTENSIONS would; undone after."""
    monkeypatch.syspath_prepend(str(EXAMPLES))

    def load(*names: str) -> None:
        search_config["extensions"] = list(names)
        resolve_config(search_config)  # imports them

    yield load
    for registry, name, module in (
        (TOOLS, "calculator", "calculator"),
        (ANSWER_SCORES, "all_words", "all_words_score"),
    ):
        if name in registry.names():
            registry.unregister(name)
        sys.modules.pop(module, None)


@pytest.fixture
def calculator(extensions, search_config):
    extensions("calculator")
    search_config.update(tools=["search", "calculator"], format_score=0.2, retrieval_score=0.1)


async def xml_episode(make_args, tokenizer, answer: str) -> tuple:
    args = make_args()
    sample = Sample(prompt=chat_prompt(tokenizer, QUESTION), label=label("14"))
    sample = await generate(args, sample, slime_sampling_params(512))
    return sample, await reward_func(args, sample)


async def test_the_calculator_runs_in_xml_mode_between_its_own_tags(make_args, tokenizer, engine, policy, calculator):
    policy.scripts[QUESTION + "?"] = [CALL, "<think>It is 14.</think>\n<answer> 14 </answer>"]
    sample, reward = await xml_episode(make_args, tokenizer, "14")
    assert "<result>2 * (3 + 4) = 14</result>" in sample.response and "<information>" not in sample.response
    assert (
        format_problem(sample.prompt, sample.response, {name: TOOLS.get(name) for name in ("search", "calculator")})
        is None
    )
    assert reward == 1.0
    assert search_metrics([sample])["tools/calculator/calls/mean"] == 1.0


async def test_a_calculator_value_that_is_the_gold_answer_earns_no_retrieval_bonus(
    make_args, tokenizer, engine, policy, calculator
):
    # a wrong answer in a valid format after the calculator showed the gold "14": the format bonus alone
    policy.scripts[QUESTION + "?"] = [CALL, "<think>It is 15.</think>\n<answer> 15 </answer>"]
    sample, reward = await xml_episode(make_args, tokenizer, "15")
    assert "= 14</result>" in sample.response
    assert reward == 0.2 and info(sample)["reward"]["retrieval_hit"] == 0.0


async def test_the_calculator_runs_in_chat_mode_without_retrieval_bonus(
    make_args, engine, policy, search_config, calculator
):
    search_config["llm_api_mode"] = "chat"
    policy.scripts[QUESTION + "?"] = [CHAT_CALL, "<think>It is 15.</think>\n<answer> 15 </answer>"]
    schemas = [SEARCH_SCHEMA, TOOLS.get("calculator").schema]
    args = make_args()
    sample = Sample(prompt=chat_messages(), label={"ground_truth": {"target": ["14"]}}, metadata={"tools": schemas})
    sample = await generate(args, sample, slime_sampling_params(512))
    tool_message = info(sample)["conversation"][1]
    assert (tool_message["name"], tool_message["content"]) == ("calculator", "2 * (3 + 4) = 14")
    assert await reward_func(args, sample) == 0.2  # valid format, wrong answer, no retrieval bonus


def convert(tmp_path, *extra: str, extensions: str | None = None) -> subprocess.CompletedProcess:
    source = tmp_path / "test.parquet"
    row = {"question": "what is 2 times 7", "golden_answers": ["14"], "data_source": "nq"}
    row["prompt"] = [{"role": "user", "content": search_r1_prompt(row["question"])}]
    pq.write_table(pa.Table.from_pylist([row]), source)
    environ = {**os.environ, "PYTHONPATH": str(EXAMPLES)}
    environ.pop("SEARCH_R1_EXTENSIONS", None)
    if extensions is not None:
        environ["SEARCH_R1_EXTENSIONS"] = extensions
    command = [sys.executable, "oai_format_data_preprocess.py", "--input", str(source), *extra]
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)


def test_the_data_script_offers_a_tool_of_an_extension(tmp_path):
    output = tmp_path / "chat.parquet"
    refused = convert(tmp_path, "--output", str(output), "--tools", "search,calculator")
    assert refused.returncode == 2 and "--tools 'search,calculator': accepted: names from search, access" in (
        refused.stderr
    )
    converted = convert(tmp_path, "--output", str(output), "--tools", "search,calculator", extensions="calculator")
    assert converted.returncode == 0, converted.stderr
    (row,) = pq.read_table(output).to_pylist()
    assert [tool["function"]["name"] for tool in json.loads(row["tools"])] == ["search", "calculator"]
    by_flag = convert(tmp_path, "--output", str(output), "--tools", "calculator", "--extensions", "calculator")
    assert by_flag.returncode == 0, by_flag.stderr


async def test_a_reward_built_on_an_answer_score_of_ones_own(
    make_args, tokenizer, engine, policy, search_config, extensions
):
    extensions("all_words_score")
    search_config.update(reward="all_words", format_score=0.2)
    policy.scripts[QUESTION + "?"] = ["<think>Found it.</think>\n<answer> the city of Paris in France </answer>"]
    args = make_args()
    sample = Sample(prompt=chat_prompt(tokenizer, QUESTION), label=label("Paris France"))
    sample = await generate(args, sample, slime_sampling_params(512))
    # every word of the gold answer: s = 1 in Search-R1's table, where EM (s = 0) would give the format bonus alone
    assert await reward_func(args, sample) == 1.0
    reward = info(sample)["reward"]
    assert (reward["scored_by"], reward["all_words"], reward["em"]) == ("all_words", 1.0, 0.0)
    assert search_metrics([sample])["all_words"] == 1.0


def test_evaluate_reports_an_answer_score_of_ones_own(extensions):
    from slime_search_r1.evaluation.summary import summarize
    from slime_search_r1.scoring.answers import rule_scores

    extensions("all_words_score")
    golds = ["Paris France"]
    records = []
    for index, answer in enumerate(["the city of Paris in France", "Paris"]):
        scores = rule_scores(answer, golds)
        records.append({"key": str(index), "data_source": "nq", "status": "completed", **scores})
    summary = summarize(records, {"nq": 2})
    assert summary["scores"] == ["em", "f1", "cover_em", "all_words"]
    assert (summary["data_sources"]["nq"]["all_words"], summary["data_sources"]["nq"]["em"]) == (0.5, 0.0)
