"""The access tool (ASearcher's `<access> URL </access>`): off by default, and then nothing of Search-R1 changes; on,
it reads pages from the local retriever's /access in both protocols, token-exact, scored and counted like search."""

import asyncio
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generate_with_search import generate, reward_func
from qa_em_format import format_problem
from slime.utils.types import Sample
from slime_search_r1.http_client import close_loop_sessions
from slime_search_r1.protocols.chat_reward import conversation_format_problem
from slime_search_r1.protocols.xml_tags import TOOL_LINES_AFTER, invalid_action_message, prompt_text
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config, search_r1_configs
from slime_search_r1.tools.access import ACCESS
from slime_search_r1.loop import enabled_tools
from slime_search_r1.tools.search import SEARCH
from slime_search_r1.training.metrics import search_metrics
from support.episodes import (
    CHAT_LABEL,
    QUESTION,
    SEARCH_R1_INVALID_ACTION,
    chat_messages,
    conversation,
    info,
    label,
)
from support.fake_retriever import page_url
from support.fidelity import assert_faithful
from support.slime_rollout import chat_prompt, slime_sampling_params

PARIS = page_url('"Paris"\n')
SEARCH_THEN_ACCESS = [
    "<think>Search first.</think>\n<search> capital of France </search>",
    f"<think>Read the page.</think>\n<access> {PARIS} </access>",
    "<think>The page says Paris.</think>\n<answer> Paris </answer>",
]


def xml_call(tool: str, argument: str, value: str) -> str:
    return (
        f"<tool_call>\n{json.dumps({'name': tool, 'arguments': {argument: value}}, ensure_ascii=False)}\n</tool_call>"
    )


CHAT_SEARCH_THEN_ACCESS = [
    xml_call("search", "query", "capital of France"),
    xml_call("access", "url", PARIS),
    "<think>The page says Paris.</think>\n<answer> Paris </answer>",
]


@pytest.fixture
def access_on(search_config):
    search_config["tools"] = ["search", "access"]
    return search_config


def xml_sample(tokenizer) -> Sample:
    return Sample(prompt=chat_prompt(tokenizer, QUESTION), label=label("Paris"))


def chat_sample() -> Sample:
    return Sample(prompt=chat_messages(), label=CHAT_LABEL, metadata={"tools": [SEARCH.schema, ACCESS.schema]})


def xml_prompt_ids(args, tokenizer, sample, config) -> list[int]:
    tools = enabled_tools(resolve_config(config))
    return tokenizer.encode(prompt_text(args, tokenizer, sample, tools), add_special_tokens=False)


def chat_prompt_ids(tokenizer, tools) -> list[int]:
    text = tokenizer.apply_chat_template(chat_messages(), tools=tools, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


# ---- off by default: Search-R1 as it is ---------------------------------------------------------------------------


async def test_off_by_default_the_prompt_stops_and_messages_are_search_r1s(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [f"<access> {PARIS} </access>", "<answer> Paris </answer>"]
    sample = await generate(make_args(), xml_sample(tokenizer), slime_sampling_params(512))
    first = engine.calls[0]
    assert first.input_ids == tokenizer.encode(sample.prompt, add_special_tokens=False)  # the prompt untouched
    assert "</access>" not in first.sampling_params["stop"]
    assert SEARCH_R1_INVALID_ACTION in sample.response  # <access> is no action without the tool
    assert info(sample)["invalid_actions"] == 1


# ---- on: XML ------------------------------------------------------------------------------------------------------


async def test_xml_access_shows_the_page_and_is_scored_like_a_search(
    make_args, tokenizer, engine, policy, retriever, access_on
):
    policy.scripts[QUESTION + "?"] = SEARCH_THEN_ACCESS
    args, sample = make_args(), xml_sample(tokenizer)
    sample = await generate(args, sample, slime_sampling_params(1024))
    assert retriever.accessed == [PARIS]
    assert f"<information>{retriever.pages[PARIS]['contents']}</information>" in sample.response
    assert f"(URL: {PARIS})" in sample.response  # the search results show the URLs access can open
    assert "</access>" in engine.calls[0].sampling_params["stop"]
    assert format_problem(sample.prompt, sample.response, ("search", "access")) is None
    assert await reward_func(args, sample) == 1.0
    assert info(sample)["tools"]["access"]["calls"] == 1
    prompt_ids = xml_prompt_ids(args, tokenizer, sample, access_on)
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids, canonical_observations=True)


async def test_xml_access_adds_one_sentence_to_search_r1s_prompt(make_args, tokenizer, engine, access_on):
    await generate(make_args(), xml_sample(tokenizer), slime_sampling_params(32))
    prompt = tokenizer.decode(engine.calls[0].input_ids)
    assert TOOL_LINES_AFTER + " " + ACCESS.prompt_line + " You can search as many times" in prompt
    assert prompt.count("<access>") == 1


async def test_the_invalid_action_message_names_access_when_it_is_on(make_args, tokenizer, engine, policy, access_on):
    policy.scripts[QUESTION + "?"] = ["I do not know.", "<answer> Paris </answer>"]
    sample = await generate(make_args(), xml_sample(tokenizer), slime_sampling_params(512))
    assert invalid_action_message([SEARCH, ACCESS]) in sample.response
    assert "If I want to read a page, I should put its URL between <access> and </access>." in sample.response


async def test_an_unknown_url_is_an_observation_not_a_failure(
    make_args, tokenizer, policy, engine, retriever, access_on
):
    policy.scripts[QUESTION + "?"] = ["<access> https://nowhere.example/page </access>", "<answer> Paris </answer>"]
    sample = await generate(make_args(), xml_sample(tokenizer), slime_sampling_params(512))
    assert "<information>No page was found at https://nowhere.example/page.</information>" in sample.response
    assert sample.status == Sample.Status.COMPLETED
    assert info(sample)["tools"]["access"] == {
        "calls": 1,
        "failures": 0,
        "seconds": info(sample)["tools"]["access"]["seconds"],
    }


async def test_a_failing_pages_server_ends_the_sample_failed_as_search_does(
    make_args, tokenizer, policy, engine, retriever, access_on
):
    retriever.access_status = 503
    access_on.update(search_attempts=2)
    policy.scripts[QUESTION + "?"] = [f"<access> {PARIS} </access>", "<answer> Paris </answer>"]
    sample = await generate(make_args(), xml_sample(tokenizer), slime_sampling_params(512))
    assert sample.status == Sample.Status.FAILED
    assert sample.remove_sample
    assert info(sample)["tool_error"].startswith("access: ")
    assert "HTTP 503" in info(sample)["tool_error"]
    assert info(sample)["tools"]["access"]["failures"] == 1


async def test_a_server_without_pages_fails_the_sample_with_its_message(
    make_args, tokenizer, policy, engine, retriever, access_on
):
    retriever.access_status = 404
    policy.scripts[QUESTION + "?"] = [f"<access> {PARIS} </access>", "<answer> Paris </answer>"]
    sample = await generate(make_args(), xml_sample(tokenizer), slime_sampling_params(512))
    assert sample.status == Sample.Status.FAILED
    assert "HTTP 404" in info(sample)["tool_error"]


@pytest.mark.parametrize("budget", [16, 40])
async def test_a_page_is_cut_to_max_page_tokens_at_a_token_boundary(
    make_args, tokenizer, policy, engine, retriever, access_on, budget
):
    access_on.update(max_page_tokens=budget)
    policy.scripts[QUESTION + "?"] = [f"<access> {PARIS} </access>", "<answer> Paris </answer>"]
    args, sample = make_args(), xml_sample(tokenizer)
    sample = await generate(args, sample, slime_sampling_params(1024))
    observation = sample.response[sample.response.index("\n\n<information>") :].split("</information>")[0]
    assert len(tokenizer.encode(observation + "</information>\n\n", add_special_tokens=False)) <= budget
    assert info(sample)["truncated_observations"] == 1
    prompt_ids = xml_prompt_ids(args, tokenizer, sample, access_on)
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids, canonical_observations=True)


# ---- on: chat -----------------------------------------------------------------------------------------------------


async def test_chat_access_is_a_tool_message_and_the_chat_format_accepts_it(
    make_args, tokenizer, engine, policy, retriever, access_on
):
    access_on["llm_api_mode"] = "chat"
    policy.scripts[QUESTION + "?"] = CHAT_SEARCH_THEN_ACCESS
    args = make_args()
    sample = await generate(args, chat_sample(), slime_sampling_params(2048))
    messages = conversation(sample)
    assert messages[3] == {
        "role": "tool",
        "tool_call_id": "call_1_0",
        "name": "access",
        "content": retriever.pages[PARIS]["contents"],
    }
    assert conversation_format_problem(messages, enabled_tools(resolve_config(access_on))) is None
    assert await reward_func(args, sample) == 1.0
    prompt_ids = chat_prompt_ids(tokenizer, [SEARCH.schema, ACCESS.schema])
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids, canonical_observations=True)


async def test_chat_access_with_a_bad_argument_is_told_what_to_fix(make_args, engine, policy, access_on):
    access_on["llm_api_mode"] = "chat"
    policy.scripts[QUESTION + "?"] = [xml_call("access", "url", " "), "<answer> Paris </answer>"]
    sample = await generate(make_args(), chat_sample(), slime_sampling_params(1024))
    assert conversation(sample)[1]["content"] == (
        'Error: \'url\' must be a non-empty string: a URL from the search results. Call access with {"url": "..."}.'
    )


# ---- metrics and settings -----------------------------------------------------------------------------------------


async def test_the_metrics_count_access_apart_from_search(make_args, tokenizer, engine, policy, access_on):
    policy.scripts[QUESTION + "?"] = SEARCH_THEN_ACCESS
    args = make_args()
    samples = [await generate(args, xml_sample(tokenizer), slime_sampling_params(1024)) for _ in range(2)]
    metrics = search_metrics(samples)
    assert metrics["tools/access/calls/mean"] == 1.0
    assert metrics["tools/search/calls/mean"] == 1.0
    assert metrics["searches/mean"] == 1.0
    assert metrics["tools/access/failures"] == 0
    assert metrics["tools/access/latency/p50"] > 0


def test_the_setting_turns_access_on_from_the_environment():
    assert resolve_config(search_r1_configs({}, {"SEARCH_R1_TOOLS": "search,access"})).tools == ["search", "access"]


def test_access_with_google_search_is_refused_at_launch():
    env = {"SEARCH_R1_TOOLS": "search,access", "SEARCH_BACKEND": "google", "GOOGLE_API_KEY": "k"}
    with pytest.raises(ConfigError, match="the access tool reads pages from the local retriever"):
        resolve_config(search_r1_configs({}, env))


# ---- token-exact on random episodes -------------------------------------------------------------------------------

WORDS = [
    "Paris",
    "capital",
    "é",
    "東京",
    "🙂",
    "  ",
    "\n",
    "<",
    "&",
    "amora.",
    ".\n",
    "<|im_end|>",
    "</tool_response>",
]
page_text = st.lists(st.sampled_from(WORDS), min_size=10, max_size=300).map(" ".join)  # often over the budget
URLS = [PARIS, "https://en.wikipedia.org/w/index.php/Paris", "https://nowhere.example/x", "  "]
xml_turn = st.one_of(
    st.just("<think>s</think>\n<search> capital </search>"),
    st.sampled_from(URLS).map(lambda url: f"<think>r</think>\n<access> {url} </access>"),
    st.just("<answer> Paris </answer>"),
    st.just("no action"),
)
chat_turn = st.one_of(
    st.just(xml_call("search", "query", "capital")),
    st.sampled_from(URLS).map(lambda url: xml_call("access", "url", url)),
    st.just("<answer> Paris </answer>"),
)


@settings(
    max_examples=int(os.environ.get("FIDELITY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    mode=st.sampled_from(["generate", "chat"]),
    first_url=st.sampled_from(URLS[:2]),  # every episode opens a page first (the stored one, or by index.php/)
    xml_turns=st.lists(xml_turn, min_size=0, max_size=3),
    chat_turns=st.lists(chat_turn, min_size=0, max_size=3),
    page=page_text,
    max_page_tokens=st.integers(16, 120),
    budget=st.integers(60, 900),
    non_canonical=st.booleans(),
)
def test_random_episodes_with_access_are_token_exact(
    make_args, tokenizer, engine, policy, retriever, access_on,
    mode, first_url, xml_turns, chat_turns, page, max_page_tokens, budget, non_canonical,
):  # fmt: skip
    if mode == "generate":
        turns = [f"<think>r</think>\n<access> {first_url} </access>", *xml_turns]
    else:
        turns = [xml_call("access", "url", first_url), *chat_turns]
    policy.scripts = {QUESTION + "?": turns}
    engine.calls.clear()
    engine.split_every = 2 if non_canonical else 0
    retriever.pages[PARIS] = {"url": PARIS, "contents": page}
    retriever.pages["https://en.wikipedia.org/w/index.php?title=Paris"] = {"url": PARIS, "contents": page}
    access_on.update(llm_api_mode=mode, max_page_tokens=max_page_tokens, max_turns=4)
    args = make_args()
    sample = xml_sample(tokenizer) if mode == "generate" else chat_sample()
    if mode == "generate":
        prompt_ids = xml_prompt_ids(args, tokenizer, sample, access_on)
    else:
        prompt_ids = chat_prompt_ids(tokenizer, [SEARCH.schema, ACCESS.schema])

    async def episode():
        try:
            done = await generate(args, sample, slime_sampling_params(budget))
            return done, await reward_func(args, done)
        finally:
            await close_loop_sessions()

    sample, reward = asyncio.run(episode())
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids, canonical_observations=True)
    assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    assert 0.0 <= reward <= 1.0
