"""What the model writes and what it is shown: XML tags (<search>, <answer>, <information>, the retry message) and
chat tool calls (tool messages through the chat template, hints, errors), and the reading of a chat turn."""

import copy
import json

import pytest

from generate_with_search import reward_func
from slime.utils.types import Sample
from slime_search_r1.protocols.chat import parse_generated_turn, parse_openai_message
from slime_search_r1.protocols.xml_tags import invalid_action_message
from support.episodes import (
    ANSWER_TURN,
    CALL,
    CALL_TWO,
    CHAT_ANSWER,
    MALFORMED,
    QUESTION,
    SEARCH_ONLY,
    SEARCH_R1_INVALID_ACTION,
    SEARCH_TURN,
    WRONG_TOOL,
    chat_prompt_ids,
    chat_sample,
    conversation,
    info,
    rollout,
    run_chat,
    searches,
)
from support.fidelity import assert_faithful

# ---- XML mode ---------------------------------------------------------------------------------------------------


def test_with_search_alone_the_invalid_action_message_is_search_r1s():
    assert invalid_action_message(SEARCH_ONLY.values()) == SEARCH_R1_INVALID_ACTION


async def test_xml_a_search_runs_its_query_and_the_passages_are_shown_in_information(
    make_args, tokenizer, engine, policy, retriever, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args, sample, prompt_ids = await rollout(make_args, tokenizer)

    assert retriever.queries == ["capital of France"]
    assert '<information>Doc 1(Title: "Paris") Paris is the capital' in sample.response
    assert sample.response.endswith("<answer> Paris </answer>")
    calls = engine.calls_for(prompt_ids)
    assert len(calls) == 2
    assert all(c.return_logprob for c in calls), "a turn was generated without log probs"
    assert_faithful(sample, calls, tokenizer, prompt_ids)
    assert await reward_func(args, sample) == 1.0


async def test_xml_a_turn_without_an_action_is_answered_with_the_retry_message(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = ["I think it is Paris.", ANSWER_TURN]
    args, sample, prompt_ids = await rollout(make_args, tokenizer)
    assert SEARCH_R1_INVALID_ACTION in sample.response
    assert sample.status == Sample.Status.COMPLETED
    assert searches(sample) == 0
    assert info(sample)["turns"] == 2
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)
    # the model's first turn ended with EOS, which makes the format invalid: correct answer, 1 - 0.2
    assert await reward_func(args, sample) == pytest.approx(0.8)


async def test_xml_an_empty_search_query_is_an_invalid_action(
    make_args, tokenizer, engine, policy, retriever, search_config
):
    policy.scripts[QUESTION + "?"] = ["<think>hmm</think>\n<search>  </search>", ANSWER_TURN]
    _, sample, _ = await rollout(make_args, tokenizer)
    assert retriever.queries == []
    assert SEARCH_R1_INVALID_ACTION in sample.response


async def test_xml_long_search_results_are_cut_to_max_obs_tokens(
    make_args, tokenizer, engine, policy, retriever, search_config, monkeypatch
):
    retriever.docs = [{"id": str(i), "contents": f'"Doc {i}"\n' + "France capital Paris " * 80} for i in range(3)]
    monkeypatch.setitem(search_config, "max_obs_tokens", 100)
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    _, sample, prompt_ids = await rollout(make_args, tokenizer)
    calls = engine.calls_for(prompt_ids)
    observation_length = len(calls[1].input_ids) - len(calls[0].input_ids) - len(calls[0].output_ids)
    assert observation_length == 100
    assert "</information>\n\n<think>" in sample.response
    assert info(sample)["truncated_observations"] == 1
    assert_faithful(sample, calls, tokenizer, prompt_ids)


# ---- chat mode --------------------------------------------------------------------------------------------------


async def test_chat_a_tool_call_is_answered_by_a_tool_message_in_the_template_s_rendering(
    make_args, tokenizer, engine, policy, retriever, search_config
):
    policy.scripts[QUESTION + "?"] = [CALL, CHAT_ANSWER]
    args = make_args()
    sample = chat_sample()
    prompt_before = copy.deepcopy(sample.prompt)
    sample = await run_chat(args, search_config, "chat", sample=sample)

    assert sample.prompt == prompt_before, "the caller's messages were changed"
    assert retriever.queries == ["capital of France"]
    turns = conversation(sample)
    assert [m["role"] for m in turns] == ["assistant", "tool", "assistant"]
    assert json.loads(turns[0]["tool_calls"][0]["function"]["arguments"]) == {"query": "capital of France"}
    assert turns[1]["content"].startswith('Doc 1(Title: "Paris")')
    prompt_ids = chat_prompt_ids(tokenizer, sample.prompt)
    calls = engine.calls_for(prompt_ids)
    assert len(calls) == 2
    assert_faithful(sample, calls, tokenizer, prompt_ids)
    # the tool-call tokens the model sampled are in the trajectory as sampled, with mask 1
    assert "<tool_call>" in tokenizer.decode(calls[0].output_ids)
    assert calls[0].output_ids[-1] == 151645, "the first turn does not end with <|im_end|>"
    # the follow-up is the template's: end of turn, tool response, next generation prompt
    followup = tokenizer.decode(calls[1].input_ids[len(calls[0].input_ids) + len(calls[0].output_ids) :])
    assert followup.startswith("\n<|im_start|>user\n<tool_response>\nDoc 1(Title:")
    assert followup.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert await reward_func(args, sample) == 1.0


async def test_chat_a_malformed_tool_call_gets_a_hint(make_args, tokenizer, engine, policy, retriever, search_config):
    policy.scripts[QUESTION + "?"] = [MALFORMED, CALL, CHAT_ANSWER]
    args = make_args()
    sample = await run_chat(args, search_config, "chat")
    turns = conversation(sample)
    assert [m["role"] for m in turns] == ["assistant", "user", "assistant", "tool", "assistant"]
    assert "neither a search tool call nor a final answer" in turns[1]["content"]
    prompt_ids = chat_prompt_ids(tokenizer, sample.prompt)
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)
    assert await reward_func(args, sample) == pytest.approx(0.8)  # right answer, format broken by the hint


async def test_chat_an_unknown_tool_gets_an_error_message(
    make_args, tokenizer, engine, policy, retriever, search_config
):
    policy.scripts[QUESTION + "?"] = [WRONG_TOOL, CHAT_ANSWER]
    sample = await run_chat(make_args(), search_config, "chat")
    turns = conversation(sample)
    assert turns[1]["role"] == "tool"
    assert turns[1]["content"].startswith("Error: unknown tool 'lookup'")
    assert retriever.queries == []


async def test_chat_a_query_list_searches_each_query_with_one_numbering(
    make_args, tokenizer, engine, policy, retriever, search_config
):
    policy.scripts[QUESTION + "?"] = [CALL_TWO, CHAT_ANSWER]
    sample = await run_chat(make_args(), search_config, "chat")
    assert sorted(retriever.queries) == ["Berlin", "capital of France"]
    assert "Doc 4(Title:" in conversation(sample)[1]["content"]  # one numbering across both queries


# ---- reading a chat turn ----------------------------------------------------------------------------------------

GENERATED = (
    '<think>a</think>\n<tool_call>\n{"name": "search", "arguments": {"query": ["x", "y"]}}\n</tool_call>\n'
    '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"z\\"}"}\n</tool_call><|im_end|>'
)


def test_a_generated_turn_is_read_into_its_text_and_its_tool_calls():
    turn = parse_generated_turn(GENERATED, "<|im_end|>", 2, SEARCH_ONLY)
    assert turn.content == "<think>a</think>"
    assert [c.parsed["queries"] for c in turn.tool_calls] == [
        ["x", "y"],
        ["z"],
    ]  # arguments as an object or a JSON string
    assert [c.call_id for c in turn.tool_calls] == ["call_2_0", "call_2_1"]


def test_a_generated_turn_is_recorded_as_an_openai_message_with_json_arguments():
    turn = parse_generated_turn(GENERATED, "<|im_end|>", 2, SEARCH_ONLY)
    assert turn.to_openai()["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"query": ["x", "y"]}'}


def test_an_unfinished_tool_call_is_unparsable_and_neither_a_call_nor_an_answer():
    broken = parse_generated_turn('<tool_call>\n{"name": "search", "arg', "<|im_end|>", 0, SEARCH_ONLY)
    assert broken.unparsable
    assert not broken.tool_calls
    assert not broken.is_final_answer


def test_a_call_with_more_than_five_queries_is_an_error():
    too_many = parse_generated_turn(
        '<tool_call>{"name": "search", "arguments": {"query": ["a","b","c","d","e","f"]}}</tool_call>',
        "",
        0,
        SEARCH_ONLY,
    )
    assert too_many.tool_calls[0].error == "at most 5 queries per call"


def test_an_answer_without_a_call_is_a_final_answer():
    assert parse_generated_turn("<answer> x </answer><|im_end|>", "<|im_end|>", 0, SEARCH_ONLY).is_final_answer


@pytest.mark.parametrize(
    ("text", "after"),
    [
        (
            '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>\n<tool_response>r</tool_response>',
            "<tool_response>r</tool_response>",
        ),
        ('<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call> so Paris', "so Paris"),
        (
            '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>\n<tool_call>{"name": '
            '"search", "arguments": {"query": "r"}}</tool_call>\n',
            "",
        ),
        (
            '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call><tool_call>{"nam</tool_call>',
            '<tool_call>{"nam</tool_call>',
        ),
    ],
    ids=["invented response", "free text", "two calls", "a broken second call"],
)
def test_text_after_the_first_call_is_kept_for_the_reward(text, after):
    turn = parse_generated_turn(text + "<|im_end|>", "<|im_end|>", 0, SEARCH_ONLY)
    assert turn.text_after_tool_calls == after
    assert turn.to_openai().get("text_after_tool_calls") == (after or None)
    assert (
        parse_openai_message(turn.to_openai(), 0, SEARCH_ONLY).text_after_tool_calls == after
    )  # the reward reads it back


def test_an_openai_message_is_read_with_its_own_call_ids():
    call = {"id": "abc", "type": "function", "function": {"name": "search", "arguments": '{"query": "q"}'}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    turn = parse_openai_message(message, 0, SEARCH_ONLY)
    assert turn.content == ""
    assert turn.tool_calls[0].call_id == "abc"
    assert turn.tool_calls[0].parsed == {"queries": ["q"]}


def test_openai_arguments_that_are_not_json_are_a_call_error():
    bad = parse_openai_message(
        {"content": "", "tool_calls": [{"function": {"name": "search", "arguments": "{"}}]}, 1, SEARCH_ONLY
    )
    assert bad.tool_calls[0].error == "arguments are not valid JSON"
