"""The chat-mode format rule and reward, and the tool-call parsing it relies on."""

import json

import pytest

from slime_search_r1.protocols.chat_reward import read_conversation
from slime_search_r1.protocols.chat import parse_generated_turn, parse_openai_message
from qa_em_format import FormatWeights, score_answer

WEIGHTS = FormatWeights(format_score=0.2, final_format_score=0.1, retrieval_score=0.1)


def call(query, name="search", call_id="call_0"):
    arguments = json.dumps({"query": query})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content="", *calls):
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def tool(content):
    return {"role": "tool", "tool_call_id": "call_0", "name": "search", "content": content}


GOOD = [
    assistant("<think>look</think>", call("capital of France")),
    tool("Doc 1(Title: Paris) Paris is..."),
    assistant("<answer> Paris </answer>"),
]


def score_conversation(conversation, golds, weights):
    """What reward_func does with a chat-mode conversation."""
    reading = read_conversation(conversation)
    return score_answer(reading.answer, golds, reading.format_valid, reading.tool_texts, weights)


def test_generated_turn_parsing():
    text = (
        '<think>a</think>\n<tool_call>\n{"name": "search", "arguments": {"query": ["x", "y"]}}\n</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"z\\"}"}\n</tool_call><|im_end|>'
    )
    turn = parse_generated_turn(text, "<|im_end|>", 2)
    assert turn.content == "<think>a</think>"
    assert [c.queries for c in turn.tool_calls] == [["x", "y"], ["z"]]
    assert [c.call_id for c in turn.tool_calls] == ["call_2_0", "call_2_1"]
    assert turn.to_openai()["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"query": ["x", "y"]}'}

    broken = parse_generated_turn('<tool_call>\n{"name": "search", "arg', "<|im_end|>", 0)
    assert broken.unparsable and not broken.tool_calls and not broken.is_final_answer
    too_many = parse_generated_turn(
        '<tool_call>{"name": "search", "arguments": {"query": ["a","b","c","d","e","f"]}}</tool_call>', "", 0
    )
    assert too_many.tool_calls[0].error == "at most 5 queries per call"
    assert parse_generated_turn("<answer> x </answer><|im_end|>", "<|im_end|>", 0).is_final_answer


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
def test_text_after_the_first_call_is_kept(text, after):
    turn = parse_generated_turn(text + "<|im_end|>", "<|im_end|>", 0)
    assert turn.text_after_tool_calls == after
    assert turn.to_openai().get("text_after_tool_calls") == (after or None)
    assert parse_openai_message(turn.to_openai(), 0).text_after_tool_calls == after  # the reward reads it back


def test_openai_message_parsing():
    turn = parse_openai_message({"role": "assistant", "content": None, "tool_calls": [call("q", call_id="abc")]}, 0)
    assert turn.content == "" and turn.tool_calls[0].call_id == "abc" and turn.tool_calls[0].queries == ["q"]
    bad = parse_openai_message({"content": "", "tool_calls": [{"function": {"name": "search", "arguments": "{"}}]}, 1)
    assert bad.tool_calls[0].error == "arguments are not valid JSON"
