"""LLM_API_MODE=chat and the router token-tracking modes, end to end on loopback."""

import copy
import json

import pytest

from slime_search_r1.data import CHAT_SYSTEM_PROMPT, chat_question
from slime_search_r1.protocols.tools import SEARCH_SCHEMA
from conftest import chat_prompt, slime_sampling_params
from generate_with_search import generate, reward_func
from slime_search_r1.tokens.legacy_router import RouterTrackingError
from slime.utils.types import Sample
from support.fake_router import FakeSlimeRouter
from support.fidelity import assert_faithful
from support.loopback import serve_in_thread
from support.slime_rollout import router_address

QUESTION = "What is the capital of France"
CALL = (
    "<think>I should search.</think>\n"
    '<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>'
)
CALL_TWO = '<tool_call>\n{"name": "search", "arguments": {"query": ["capital of France", "Berlin"]}}\n</tool_call>'
ANSWER = "<think>The passage says Paris.</think>\n<answer> Paris </answer>"
WRONG = "<think>Maybe Berlin.</think>\n<answer> Berlin </answer>"
MALFORMED = '<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call>'
WRONG_TOOL = '<tool_call>\n{"name": "lookup", "arguments": {"query": "France"}}\n</tool_call>'
LABEL = {"ground_truth": {"target": ["Paris"]}}


def chat_messages(question=QUESTION):
    return [{"role": "system", "content": CHAT_SYSTEM_PROMPT}, {"role": "user", "content": chat_question(question)}]


def chat_sample(question=QUESTION):
    return Sample(prompt=chat_messages(question), label=LABEL, metadata={"tools": [copy.deepcopy(SEARCH_SCHEMA)]})


def prompt_ids_of(tokenizer, sample_prompt):
    text = tokenizer.apply_chat_template(
        sample_prompt, tools=[SEARCH_SCHEMA], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def conversation(sample):
    return sample.metadata["search_r1"]["conversation"]


async def run_chat(args, config, mode, *, tracking="manual", sample=None, evaluation=False, budget=1024):
    config.update(llm_api_mode=mode, token_tracking_mode=tracking)
    sample = sample or chat_sample()
    return await generate(args, sample, slime_sampling_params(budget), evaluation=evaluation)


INVENTED_RESPONSE = CALL + "\n<tool_response>\nParis is the capital of France.\n</tool_response>"
CALL_BERLIN = '<tool_call>\n{"name": "search", "arguments": {"query": "Berlin"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("mode", "tracking"), [("generate", "router_radix"), ("chat", "router_radix"), ("chat", "router_handler")]
)
async def test_router_modes_are_token_exact(
    router_args, tokenizer, engine, policy, retriever, search_config, mode, tracking
):
    if mode == "chat":
        policy.scripts[QUESTION + "?"] = [CALL, ANSWER]
        sample = chat_sample()
        prompt_ids = prompt_ids_of(tokenizer, sample.prompt)
    else:
        policy.scripts[QUESTION + "?"] = [
            "<think>I need to look this up.</think>\n<search> capital of France </search>",
            "<think>Paris.</think>\n<answer> Paris </answer>",
        ]
        sample = Sample(prompt=chat_prompt(tokenizer, QUESTION), label=LABEL)
        prompt_ids = tokenizer.encode(sample.prompt, add_special_tokens=False)
    args = router_args()
    sample = await run_chat(args, search_config, mode, tracking=tracking, sample=sample)
    assert sample.status == Sample.Status.COMPLETED
    calls = engine.calls_for(prompt_ids)
    assert len(calls) == 2
    assert_faithful(sample, calls, tokenizer, prompt_ids)
    assert await reward_func(args, sample) == 1.0


async def test_today_s_slime_router_is_rejected_with_advice(tokenizer, engine, make_args, search_config):
    router = FakeSlimeRouter(tokenizer, engine.url, legacy_endpoints=False)
    with serve_in_thread(router.app) as url:
        args = make_args(**router_address(url))
        for mode, tracking in (("generate", "router_radix"), ("chat", "router_handler")):
            with pytest.raises(RouterTrackingError, match="answers 404.*TOKEN_TRACKING_MODE=manual is token-exact"):
                await run_chat(args, search_config, mode, tracking=tracking, sample=chat_sample())
    assert engine.calls == []


async def test_engine_speaks_openai_chat_completions_with_tools(tokenizer, engine, policy):
    import httpx

    policy.scripts[QUESTION + "?"] = [CALL, ANSWER]
    request = {"model": "default", "messages": chat_messages(), "tools": [SEARCH_SCHEMA], "max_tokens": 200}
    async with httpx.AsyncClient() as client:
        first = (await client.post(engine.url + "/v1/chat/completions", json=request)).json()
        choice = first["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] == "<think>I should search.</think>"
        function = choice["message"]["tool_calls"][0]["function"]
        assert function["name"] == "search" and json.loads(function["arguments"]) == {"query": "capital of France"}
        assert first["usage"]["completion_tokens"] == len(engine.calls[-1].output_ids)

        request["messages"] += [choice["message"], {"role": "tool", "content": "Paris is the capital."}]
        second = (await client.post(engine.url + "/v1/chat/completions", json=request)).json()
    assert second["choices"][0]["finish_reason"] == "stop"
    assert second["choices"][0]["message"]["content"] == ANSWER


async def test_router_handler_cannot_keep_what_the_template_renders_differently(
    make_args, router_args, tokenizer, engine, policy, retriever, search_config
):
    # The model writes compact JSON; the template re-renders the call with spaces. manual keeps the sampled
    # tokens; router_handler gets the re-rendered ones back as cache misses (loss mask 0, log prob 0.0).
    compact = '<tool_call>\n{"name":"search","arguments":{"query":"capital of France"}}\n</tool_call>'
    policy.scripts[QUESTION + "?"] = [compact, ANSWER]
    prompt_ids = prompt_ids_of(tokenizer, chat_messages())

    manual = await run_chat(make_args(), search_config, "chat")
    assert_faithful(manual, engine.calls_for(prompt_ids), tokenizer, prompt_ids)

    engine.calls.clear()
    handler = await run_chat(router_args(), search_config, "chat", tracking="router_handler")
    assert handler.status == Sample.Status.COMPLETED
    calls = engine.calls_for(prompt_ids)
    for call in calls:  # what the engine conditioned on is still a prefix of the trajectory
        assert handler.tokens[: len(call.input_ids)] == call.input_ids
    first_turn = handler.tokens[len(prompt_ids) : len(prompt_ids) + len(calls[0].output_ids)]
    assert first_turn != calls[0].output_ids
    assert tokenizer.decode(first_turn).startswith('<tool_call>\n{"name": "search", "arguments": ')
    masked = handler.loss_mask[: len(calls[0].output_ids)]
    assert 0 in masked


XML_SEARCH = "<think>I need to look this up.</think>\n<search> capital of France </search>"
SCENARIOS = {
    # scenario: (chat turns, XML turns, expected reward)
    "right": ([CALL, ANSWER], [XML_SEARCH, "<think>Paris.</think>\n<answer> Paris </answer>"], 1.0),
    "wrong": ([CALL, WRONG], [XML_SEARCH, "<think>Berlin.</think>\n<answer> Berlin </answer>"], 0.2),
    "malformed": ([MALFORMED, CALL, ANSWER], ["<search capital", XML_SEARCH, ANSWER], 0.8),
}
COMBINATIONS = [
    ("generate", "manual"),
    ("generate", "router_radix"),
    ("chat", "manual"),
    ("chat", "router_handler"),
    ("chat", "router_radix"),
]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize(("mode", "tracking"), COMBINATIONS)
async def test_every_valid_mode_combination(
    make_args, router_args, tokenizer, engine, policy, retriever, search_config, mode, tracking, scenario
):
    chat_turns, xml_turns, expected = SCENARIOS[scenario]
    policy.scripts[QUESTION + "?"] = chat_turns if mode == "chat" else xml_turns
    if mode == "chat":
        sample = chat_sample()
        prompt_ids = prompt_ids_of(tokenizer, sample.prompt)
    else:
        sample = Sample(prompt=chat_prompt(tokenizer, QUESTION), label=LABEL)
        prompt_ids = tokenizer.encode(sample.prompt, add_special_tokens=False)
    prompt_before = copy.deepcopy(sample.prompt)
    # manual talks to the engine (today's sglang-router forwards input_ids untouched); the others to the router
    args = make_args() if tracking == "manual" else router_args()
    sample = await run_chat(args, search_config, mode, tracking=tracking, sample=sample)

    assert sample.prompt == prompt_before
    assert sample.status == Sample.Status.COMPLETED
    assert retriever.queries and set(retriever.queries) == {"capital of France"}
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)
    assert await reward_func(args, sample) == pytest.approx(expected)


async def test_chat_with_router_radix_warns_once(router_args, engine, policy, search_config, caplog, monkeypatch):
    import generate_with_search

    monkeypatch.setattr(generate_with_search, "_warned", set())
    policy.scripts[QUESTION + "?"] = [ANSWER]
    for _ in range(2):
        await run_chat(router_args(), search_config, "chat", tracking="router_radix")
    assert caplog.text.count("sends rendered text, not messages, through the router") == 1
    caplog.clear()
    await run_chat(router_args(), search_config, "chat", tracking="router_handler")
    assert "sends rendered text" not in caplog.text


@pytest.mark.parametrize(("mode", "tracking"), [("generate", "router_radix"), ("chat", "router_handler")])
async def test_router_errors_are_retried_like_the_engine(
    router, router_args, tokenizer, engine, policy, retriever, search_config, monkeypatch, mode, tracking
):
    from slime_search_r1.tokens import engine as sglang_engine

    monkeypatch.setattr(sglang_engine, "ENGINE_RETRY_WAIT_S", 0.01)
    router.failures_left = 2
    policy.scripts[QUESTION + "?"] = [ANSWER]
    sample = chat_sample() if mode == "chat" else Sample(prompt=chat_prompt(tokenizer, QUESTION), label=LABEL)
    sample = await run_chat(router_args(), search_config, mode, tracking=tracking, sample=sample)
    assert sample.status == Sample.Status.COMPLETED and router.failures_left == 0
