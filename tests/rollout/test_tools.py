"""Tools by name: a tool is one Tool registered from a file of its own (here, this test file: a third tool beside
search and access) and enabled with the `tools` setting; both protocols, both format rules, the reward and the metrics
follow it, and nothing under slime_search_r1/ changes."""

import pytest

from generate_with_search import generate, reward_func
from qa_em_format import format_problem
from slime.utils.types import Sample
from slime_search_r1.protocols.chat_reward import conversation_format_problem
from slime_search_r1.protocols.xml_tags import TOOL_LINES_AFTER, invalid_action_message, stop_strings
from slime_search_r1.registry import TOOLS
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config
from slime_search_r1.loop import enabled_tools
from slime_search_r1.tools.contract import Tool, ToolError, read_call
from slime_search_r1.tools.access import ACCESS
from slime_search_r1.tools.search import SEARCH_SCHEMA
from slime_search_r1.training.metrics import search_metrics
from support.episodes import CHAT_LABEL, QUESTION, SEARCH_ONLY, chat_messages, info
from support.slime_rollout import chat_prompt, slime_sampling_params


def read_event(arguments: dict) -> dict:
    event = arguments.get("event")
    if not isinstance(event, str) or not event.strip():
        raise ValueError("'event' must be a non-empty string")
    return {"event": event.strip()}


class Calendar:
    """A third-party tool: what it was asked, and whether its service is down."""

    def __init__(self):
        self.asked: list[str] = []
        self.down = False

    async def run(self, arguments: dict, state) -> str:
        if self.down:
            raise ToolError("the calendar service answered HTTP 503")
        self.asked.append(arguments["event"])
        return f"{arguments['event']} was on 14 July 1789."

    def tool(self) -> Tool:
        return Tool(
            name="calendar",
            description="The date of an event.",
            parameters={"type": "object", "properties": {"event": {"type": "string"}}, "required": ["event"]},
            read_arguments=read_event,
            run=self.run,
            usage='Call calendar with {"event": "..."}.',
            xml_argument="event",
            xml_usage="If I want a date, I should put the event between <calendar> and </calendar>.",
            observation_budget=lambda config: 64,
            prompt_line="You can find the date of an event by <calendar> event </calendar>.",
        )


@pytest.fixture
def calendar(search_config):
    """The calendar tool, registered and enabled beside search and access; both undone after the test."""
    calendar = Calendar()
    TOOLS.register("calendar", calendar.tool())
    search_config["tools"] = ["search", "access", "calendar"]
    yield calendar
    TOOLS.unregister("calendar")


CALENDAR_SCHEMA = Calendar().tool().schema


def tools_of(config) -> dict:
    return enabled_tools(resolve_config(config))


def test_an_enabled_tool_is_an_xml_action_and_a_stop_string(calendar, search_config):
    assert stop_strings(tools_of(search_config)) == ("</search>", "</access>", "</calendar>", "</answer>")


def test_the_invalid_action_message_names_every_enabled_tool(calendar, search_config):
    message = invalid_action_message(tools_of(search_config).values())
    assert "If I want a date, I should put the event between <calendar> and </calendar>." in message
    assert message.startswith("\nMy previous action is invalid. If I want to search")


def test_a_registered_tool_that_is_not_enabled_is_unknown(calendar):
    call = read_call("call_0_0", "calendar", {"event": "x"}, SEARCH_ONLY)
    assert call.error == "unknown tool 'calendar'; the only tool is 'search'"


def test_a_tool_reads_its_own_arguments(calendar, search_config):
    tools = tools_of(search_config)
    assert read_call("call_0_0", "calendar", {"event": " Bastille Day "}, tools).parsed == {"event": "Bastille Day"}
    assert read_call("call_0_1", "calendar", {"event": ""}, tools).error == "'event' must be a non-empty string"
    assert (
        read_call("call_0_2", "weather", {}, tools).error
        == "unknown tool 'weather'; the tools are 'search', 'access', 'calendar'"
    )


def test_the_tools_setting_refuses_a_tool_nobody_registered(search_config):
    search_config["tools"] = ["search", "calendar"]
    with pytest.raises(ConfigError, match=r"\['tools'\]=\['search', 'calendar'\] is invalid; .*'calendar' unknown"):
        resolve_config(search_config)


async def test_xml_mode_runs_the_tool_and_shows_its_result(make_args, tokenizer, engine, policy, calendar):
    policy.scripts[QUESTION + "?"] = [
        "<think>When?</think>\n<calendar> storming of the Bastille </calendar>",
        "<think>1789.</think>\n<answer> Paris </answer>",
    ]
    args = make_args()
    sample = await generate(
        args, Sample(prompt=chat_prompt(tokenizer, QUESTION), label=CHAT_LABEL), slime_sampling_params(512)
    )
    assert calendar.asked == ["storming of the Bastille"]
    assert "<information>storming of the Bastille was on 14 July 1789.</information>" in sample.response
    assert format_problem(sample.prompt, sample.response, ("search", "access", "calendar")) is None
    assert await reward_func(args, sample) == 1.0


async def test_xml_mode_adds_the_tools_prompt_line_after_search_r1s_instruction(
    make_args, tokenizer, engine, calendar
):
    await generate(
        make_args(), Sample(prompt=chat_prompt(tokenizer, QUESTION), label=CHAT_LABEL), slime_sampling_params(64)
    )
    prompt = tokenizer.decode(engine.calls[0].input_ids)
    lines = [ACCESS.prompt_line, "You can find the date of an event by <calendar> event </calendar>."]
    # each enabled tool's sentence, in the order of the tools setting, after Search-R1's sentence about search
    assert " ".join([TOOL_LINES_AFTER, *lines, "You can search as many"]) in prompt


async def test_chat_mode_runs_the_tool_and_the_chat_reward_accepts_it(
    make_args, engine, policy, search_config, calendar
):
    search_config["llm_api_mode"] = "chat"
    policy.scripts[QUESTION + "?"] = [
        '<tool_call>\n{"name": "calendar", "arguments": {"event": "Bastille Day"}}\n</tool_call>',
        "<think>Found it.</think>\n<answer> Paris </answer>",
    ]
    schemas = [SEARCH_SCHEMA, ACCESS.schema, CALENDAR_SCHEMA]
    sample = Sample(prompt=chat_messages(), label=CHAT_LABEL, metadata={"tools": schemas})
    args = make_args()
    sample = await generate(args, sample, slime_sampling_params(512))
    conversation = sample.metadata["search_r1"]["conversation"]
    assert conversation[1] == {
        "role": "tool",
        "tool_call_id": "call_0_0",
        "name": "calendar",
        "content": "Bastille Day was on 14 July 1789.",
    }
    assert conversation_format_problem(conversation, tools_of(search_config)) is None
    assert await reward_func(args, sample) == 1.0


async def test_chat_mode_refuses_data_that_offers_a_tool_the_settings_do_not_enable(
    make_args, engine, search_config, calendar
):
    search_config["llm_api_mode"] = "chat"
    search_config["tools"] = ["search"]
    sample = Sample(prompt=chat_messages(), label=CHAT_LABEL, metadata={"tools": [SEARCH_SCHEMA, CALENDAR_SCHEMA]})
    with pytest.raises(ConfigError, match="offers 'calendar', which the tools setting does not enable"):
        await generate(make_args(), sample, slime_sampling_params(512))


async def test_a_failing_tool_ends_the_sample_failed_with_its_error(make_args, tokenizer, policy, engine, calendar):
    calendar.down = True
    policy.scripts[QUESTION + "?"] = ["<think>When?</think>\n<calendar> Bastille Day </calendar>"]
    sample = await generate(
        make_args(), Sample(prompt=chat_prompt(tokenizer, QUESTION), label=CHAT_LABEL), slime_sampling_params(512)
    )
    assert sample.status == Sample.Status.FAILED
    assert sample.remove_sample
    assert info(sample)["tool_error"] == "calendar: the calendar service answered HTTP 503"
    assert info(sample)["tools"]["calendar"]["failures"] == 1
    assert info(sample)["finish_reason"] == "tool_failed"


async def test_the_metrics_count_the_tool_by_name(make_args, tokenizer, engine, policy, calendar):
    policy.scripts[QUESTION + "?"] = [
        "<think>When?</think>\n<calendar> Bastille Day </calendar>",
        "<think>1789.</think>\n<answer> Paris </answer>",
    ]
    args = make_args()
    sample = await generate(
        args, Sample(prompt=chat_prompt(tokenizer, QUESTION), label=CHAT_LABEL), slime_sampling_params(512)
    )
    metrics = search_metrics([sample])
    assert metrics["tools/calendar/calls/mean"] == 1.0
    assert metrics["tools/calendar/failures"] == 0
    assert metrics["tools/calendar/latency/p50"] > 0
    assert metrics["searches/mean"] == 0.0
