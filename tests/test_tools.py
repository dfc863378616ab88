"""Tools by name: a new tool is one new entry in the registry, and both protocols and both rewards follow it."""

import pytest

from generate_with_search import generate, reward_func
from qa_em_format import format_problem
from slime.utils.types import Sample
from slime_search_r1.protocols import tools
from slime_search_r1.protocols.chat_reward import conversation_format_problem
from slime_search_r1.protocols.tools import SEARCH_SCHEMA, Tool, check_call
from slime_search_r1.protocols.xml import stop_strings
from support.episodes import CHAT_LABEL, QUESTION, chat_messages
from support.slime_rollout import chat_prompt, slime_sampling_params

CALENDAR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calendar",
        "description": "The date of an event.",
        "parameters": {"type": "object", "properties": {"event": {"type": "string"}}, "required": ["event"]},
    },
}


def read_event(arguments: dict) -> list[str]:
    event = arguments.get("event")
    if not isinstance(event, str) or not event.strip():
        raise ValueError("'event' must be a non-empty string")
    return [event.strip()]


@pytest.fixture
def calendar():
    """A second tool, registered the way the search tool is; unregistered after the test."""
    asked = []

    async def run(state, queries):
        asked.extend(queries)
        return f"{queries[0]} was on 14 July 1789."

    tools.register_tool(
        Tool("calendar", CALENDAR_SCHEMA, read_event, run, 'Call calendar with {"event": "..."}.', "event")
    )
    yield asked
    del tools.TOOLS["calendar"]


def test_a_registered_tool_is_an_xml_action_and_a_stop_string(calendar):
    assert "</calendar>" in stop_strings()


def test_a_registered_tool_call_is_read_with_its_own_arguments(calendar):
    call = check_call("call_0_0", "calendar", {"event": " the storming of the Bastille "})
    assert call.queries == ["the storming of the Bastille"]
    assert check_call("call_0_1", "calendar", {"event": ""}).error == "'event' must be a non-empty string"


def test_an_unknown_tool_names_every_registered_one(calendar):
    assert check_call("call_0_0", "weather", {}).error == "unknown tool 'weather'; the tools are 'search', 'calendar'"


async def test_xml_mode_runs_a_registered_tool_and_shows_its_result(
    make_args, tokenizer, engine, policy, search_config, calendar
):
    policy.scripts[QUESTION + "?"] = [
        "<think>When?</think>\n<calendar> storming of the Bastille </calendar>",
        "<think>1789.</think>\n<answer> Paris </answer>",
    ]
    args = make_args()
    sample = await generate(
        args, Sample(prompt=chat_prompt(tokenizer, QUESTION), label=CHAT_LABEL), slime_sampling_params(512)
    )
    assert calendar == ["storming of the Bastille"]
    assert "<information>storming of the Bastille was on 14 July 1789.</information>" in sample.response
    assert format_problem(sample.prompt + sample.response) is None  # the format rule knows the new tag
    assert await reward_func(args, sample) == 1.0


async def test_chat_mode_runs_a_registered_tool_and_the_chat_reward_accepts_it(
    make_args, engine, policy, search_config, calendar
):
    search_config["llm_api_mode"] = "chat"
    policy.scripts[QUESTION + "?"] = [
        '<tool_call>\n{"name": "calendar", "arguments": {"event": "Bastille Day"}}\n</tool_call>',
        "<think>Found it.</think>\n<answer> Paris </answer>",
    ]
    sample = Sample(prompt=chat_messages(), label=CHAT_LABEL, metadata={"tools": [SEARCH_SCHEMA, CALENDAR_SCHEMA]})
    args = make_args()
    sample = await generate(args, sample, slime_sampling_params(512))
    conversation = sample.metadata["search_r1"]["conversation"]
    assert conversation[1] == {
        "role": "tool",
        "tool_call_id": "call_0_0",
        "name": "calendar",
        "content": "Bastille Day was on 14 July 1789.",
    }
    assert conversation_format_problem(conversation) is None
    assert await reward_func(args, sample) == 1.0
