"""The modes and the way to the engine: every LLM_API_MODE x TOKEN_TRACKING_MODE combination, the old slime router
(router_radix, router_handler), the engine transport (aiohttp or slime's post(), retries, routing), and slime's
own settings reaching the rollout."""

import copy
import re
import json
import shutil

import pytest

import generate_with_search
from generate_with_search import generate, reward_func
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import init_http_client
from slime.utils.types import Sample
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.slime_flags import REWARD_POST_PROCESS_PATH
from slime_search_r1.data import search_r1_prompt
from slime_search_r1.tools.search import SEARCH_SCHEMA
from slime_search_r1.tokens import engine as sglang_engine
from slime_search_r1.tokens.legacy_router import RouterTrackingError
from support.episodes import (
    ANSWER_TURN,
    CALL,
    CHAT_ANSWER,
    CHAT_WRONG,
    LONG_THOUGHT,
    MALFORMED,
    QUESTION,
    SEARCH_TURN,
    chat_messages,
    chat_prompt_ids,
    chat_sample,
    info,
    label,
    rollout,
    run_chat,
    sample_for,
)
from support.fake_router import FakeSlimeRouter
from support.fidelity import assert_faithful
from support.loopback import serve_in_thread
from support.slime_rollout import chat_prompt, router_address, slime_sampling_params

# ---- every valid combination ------------------------------------------------------------------------------------

XML_PARIS = "<think>Paris.</think>\n<answer> Paris </answer>"
SCENARIOS = {
    # scenario: (chat turns, XML turns, expected reward)
    "right": ([CALL, CHAT_ANSWER], [SEARCH_TURN, XML_PARIS], 1.0),
    "wrong": ([CALL, CHAT_WRONG], [SEARCH_TURN, "<think>Berlin.</think>\n<answer> Berlin </answer>"], 0.2),
    "malformed": ([MALFORMED, CALL, CHAT_ANSWER], ["<search capital", SEARCH_TURN, CHAT_ANSWER], 0.8),
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
async def test_every_valid_mode_combination_searches_scores_and_is_token_exact(
    make_args, router_args, tokenizer, engine, policy, retriever, search_config, mode, tracking, scenario
):
    chat_turns, xml_turns, expected = SCENARIOS[scenario]
    policy.scripts[QUESTION + "?"] = chat_turns if mode == "chat" else xml_turns
    sample, prompt_ids = sample_for(mode, tokenizer)
    prompt_before = copy.deepcopy(sample.prompt)
    # manual talks to the engine (today's sglang-router forwards input_ids untouched); the others to the router
    args = make_args() if tracking == "manual" else router_args()
    sample = await run_chat(args, search_config, mode, tracking=tracking, sample=sample)

    assert sample.prompt == prompt_before, "the caller's prompt was changed"
    assert sample.status == Sample.Status.COMPLETED
    assert retriever.queries, "no search reached the retriever"
    assert set(retriever.queries) == {"capital of France"}
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)
    assert await reward_func(args, sample) == pytest.approx(expected)


# ---- the old slime router: router_radix and router_handler ------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "tracking"), [("generate", "router_radix"), ("chat", "router_radix"), ("chat", "router_handler")]
)
async def test_the_router_modes_are_token_exact(
    router_args, tokenizer, engine, policy, retriever, search_config, mode, tracking
):
    if mode == "chat":
        policy.scripts[QUESTION + "?"] = [CALL, CHAT_ANSWER]
    else:
        policy.scripts[QUESTION + "?"] = [SEARCH_TURN, XML_PARIS]
    sample, prompt_ids = sample_for(mode, tokenizer)
    args = router_args()
    sample = await run_chat(args, search_config, mode, tracking=tracking, sample=sample)
    assert sample.status == Sample.Status.COMPLETED
    calls = engine.calls_for(prompt_ids)
    assert len(calls) == 2
    assert_faithful(sample, calls, tokenizer, prompt_ids)
    assert await reward_func(args, sample) == 1.0


@pytest.mark.parametrize(
    ("mode", "tracking"), [("generate", "router_radix"), ("chat", "router_radix"), ("chat", "router_handler")]
)
async def test_the_router_modes_offer_each_turn_what_is_left_of_the_response_budget(
    router_args, tokenizer, engine, policy, retriever, search_config, mode, tracking
):
    # The router drivers count the response themselves (its tokens come from the router only at the end): the
    # count runs on across turns, so the second turn is offered the budget less the first turn and its reply.
    policy.scripts[QUESTION + "?"] = [CALL if mode == "chat" else SEARCH_TURN, LONG_THOUGHT + CHAT_ANSWER]
    budget = 160
    sample, prompt_ids = sample_for(mode, tokenizer)
    sample = await run_chat(router_args(), search_config, mode, tracking=tracking, sample=sample, budget=budget)
    calls = engine.calls_for(prompt_ids)
    assert len(calls) == 2
    for call in calls:
        assert call.sampling_params["max_new_tokens"] == budget - (len(call.input_ids) - len(prompt_ids))
    assert sample.status == Sample.Status.TRUNCATED
    assert info(sample)["finish_reason"] == "token_budget"
    assert sample.response_length == budget


async def test_today_s_slime_router_is_rejected_with_advice(tokenizer, engine, make_args, search_config):
    router = FakeSlimeRouter(tokenizer, engine.url, legacy_endpoints=False)
    with serve_in_thread(router.app) as url:
        args = make_args(**router_address(url))
        for mode, tracking in (("generate", "router_radix"), ("chat", "router_handler")):
            with pytest.raises(RouterTrackingError, match="answers 404.*TOKEN_TRACKING_MODE=manual is token-exact"):
                await run_chat(args, search_config, mode, tracking=tracking, sample=chat_sample())
    assert engine.calls == []


async def test_chat_with_router_radix_warns_once(router_args, engine, policy, search_config, caplog, monkeypatch):
    monkeypatch.setattr(generate_with_search, "_warned", set())
    policy.scripts[QUESTION + "?"] = [CHAT_ANSWER]
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
    monkeypatch.setattr(sglang_engine, "ENGINE_RETRY_WAIT_S", 0.01)
    router.failures_left = 2
    policy.scripts[QUESTION + "?"] = [CHAT_ANSWER]
    sample, _ = sample_for(mode, tokenizer)
    sample = await run_chat(router_args(), search_config, mode, tracking=tracking, sample=sample)
    assert sample.status == Sample.Status.COMPLETED
    assert router.failures_left == 0


async def test_router_handler_cannot_keep_what_the_template_renders_differently(
    make_args, router_args, tokenizer, engine, policy, retriever, search_config
):
    # The model writes compact JSON; the template re-renders the call with spaces. manual keeps the sampled
    # tokens; router_handler gets the re-rendered ones back as cache misses (loss mask 0, log prob 0.0).
    compact = '<tool_call>\n{"name":"search","arguments":{"query":"capital of France"}}\n</tool_call>'
    policy.scripts[QUESTION + "?"] = [compact, CHAT_ANSWER]
    prompt_ids = chat_prompt_ids(tokenizer, chat_messages())

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


async def test_the_test_engine_speaks_openai_chat_completions_with_tools(tokenizer, engine, policy):
    import httpx

    policy.scripts[QUESTION + "?"] = [CALL, CHAT_ANSWER]
    # the chat protocol's stop ids: <|im_end|> ends the turn although the served base model's EOS set lacks it
    request = {"model": "default", "messages": chat_messages(), "tools": [SEARCH_SCHEMA], "max_tokens": 200}
    request["stop_token_ids"] = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    async with httpx.AsyncClient() as client:
        first = (await client.post(engine.url + "/v1/chat/completions", json=request)).json()
        choice = first["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] == "<think>I should search.</think>"
        function = choice["message"]["tool_calls"][0]["function"]
        assert function["name"] == "search"
        assert json.loads(function["arguments"]) == {"query": "capital of France"}
        assert first["usage"]["completion_tokens"] == len(engine.calls[-1].output_ids)

        request["messages"] += [choice["message"], {"role": "tool", "content": "Paris is the capital."}]
        second = (await client.post(engine.url + "/v1/chat/completions", json=request)).json()
    assert second["choices"][0]["finish_reason"] == "stop"
    assert second["choices"][0]["message"]["content"] == CHAT_ANSWER


# ---- the engine transport ---------------------------------------------------------------------------------------


async def test_the_engine_transport_can_be_slime_s_post(make_args, tokenizer, engine, policy, search_config):
    search_config["engine_transport"] = "slime"
    init_http_client(make_args())  # slime's rollout manager does this before the first rollout
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    _, sample, prompt_ids = await rollout(make_args, tokenizer)
    assert sample.status == Sample.Status.COMPLETED
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)


async def test_consistent_hashing_keeps_a_sample_on_one_engine(make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    sample = Sample(prompt=chat_prompt(tokenizer, QUESTION), label=label("Paris"), session_id="session-42")
    _, sample, prompt_ids = await rollout(make_args, tokenizer, sample=sample, router_policy="consistent_hashing")
    calls = engine.calls_for(prompt_ids)
    assert len(calls) == 2
    assert [c.headers.get("x-smg-routing-key") for c in calls] == ["session-42", "session-42"]


async def test_engine_5xx_is_retried_until_it_recovers(make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    engine.fail_next(2, status=503)
    _, sample, prompt_ids = await rollout(make_args, tokenizer)
    assert engine.failures_left == 0
    assert sample.status == Sample.Status.COMPLETED
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)


async def test_engine_4xx_fails_the_sample_fast_with_the_engine_message(make_args, tokenizer, engine, search_config):
    engine.fail_next(1, status=400)
    _, sample, _ = await rollout(make_args, tokenizer)
    assert engine.failures_left == 0 and len(engine.calls) == 0  # not retried
    assert sample.status == Sample.Status.FAILED and sample.remove_sample
    assert info(sample)["finish_reason"] == "engine_error"
    assert re.search(r"HTTP 400: .*injected failure", info(sample)["engine_error"])


async def test_an_engine_that_never_recovers_fails_the_sample_after_its_attempts(
    make_args, tokenizer, engine, search_config, monkeypatch
):
    monkeypatch.setattr(sglang_engine, "ENGINE_ATTEMPTS", 3)
    monkeypatch.setattr(sglang_engine, "ENGINE_RETRY_WAIT_S", 0.01)
    engine.fail_next(10, status=502)
    _, sample, _ = await rollout(make_args, tokenizer)
    assert sample.status == Sample.Status.FAILED
    assert re.search(r"answered errors to all 3 attempts.*HTTP 502", info(sample)["engine_error"])
    assert engine.failures_left == 7


async def test_the_engine_is_reached_through_slime_s_model_routers(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [ANSWER_TURN]
    # --sglang-config: the policy ("actor") has its own router; slime's default router address is elsewhere
    routers = {"actor": tuple(router_address(engine.url).values()), "ref": ("127.0.0.1", 9)}
    elsewhere = {"sglang_router_ip": "127.0.0.1", "sglang_router_port": 9}
    _, sample, _ = await rollout(make_args, tokenizer, **elsewhere, sglang_model_routers=routers)
    assert sample.status == Sample.Status.COMPLETED
    assert len(engine.calls) == 1


# ---- slime's own settings reach the rollout ---------------------------------------------------------------------


async def test_slime_s_sampling_params_are_not_mutated_and_reach_every_turn_with_the_stop_strings(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    params = slime_sampling_params(512)
    params["stop"] = ["<|endoftext|>"]
    before = copy.deepcopy(params)
    args = make_args()
    prompt = chat_prompt(tokenizer, QUESTION)
    await generate(args, Sample(prompt=prompt, label=label("Paris")), params, evaluation=True)
    assert params == before
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    for call in engine.calls_for(prompt_ids):
        assert call.sampling_params["stop"] == ["<|endoftext|>", "</search>", "</answer>"]
        assert call.sampling_params["temperature"] == 1.0
        assert call.sampling_params["no_stop_trim"] is True


async def test_min_new_tokens_never_exceeds_what_a_turn_is_offered(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args = make_args()
    prompt = chat_prompt(tokenizer, QUESTION)
    params = slime_sampling_params(120) | {"min_new_tokens": 100}
    sample = await generate(args, Sample(prompt=prompt, label=label("Paris")), params, evaluation=True)
    calls = engine.calls_for(tokenizer.encode(prompt, add_special_tokens=False))
    assert len(calls) >= 2
    assert sample.status != Sample.Status.FAILED
    for call in calls:
        assert call.sampling_params["min_new_tokens"] <= call.sampling_params["max_new_tokens"]
    assert params["min_new_tokens"] == 100


async def test_a_messages_prompt_is_rendered_with_the_chat_template(
    make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    messages = [{"role": "user", "content": search_r1_prompt(QUESTION)}]
    sample = Sample(prompt=messages, label=label("Paris"))
    args, sample, prompt_ids = await rollout(make_args, tokenizer, sample=sample)
    assert prompt_ids == sample.tokens[: len(prompt_ids)]
    assert sample.status == Sample.Status.COMPLETED
    assert await reward_func(args, sample) == 1.0


@pytest.fixture
def note_template_dir(tokenizer_dir, tmp_path):
    """The Qwen2.5 tokenizer with a chat template that takes a keyword, as Qwen3's enable_thinking does."""
    folder = tmp_path / "tokenizer"
    shutil.copytree(tokenizer_dir, folder)
    template = folder / "chat_template.jinja"
    template.write_text("{%- if note is defined %}{{- 'NOTE: ' + note + '\\n' }}{%- endif %}" + template.read_text())
    return str(folder)


@pytest.mark.parametrize(
    ("flag", "own", "expected"),
    [
        ({"note": "from slime's flag"}, {}, "from slime's flag"),
        ({"note": "flag"}, {"note": "the sample's"}, "the sample's"),
    ],
    ids=["slime flag", "sample's own wins"],
)
@pytest.mark.parametrize("mode", ["generate", "chat"])
async def test_apply_chat_template_kwargs_reach_the_template(
    make_args, note_template_dir, engine, policy, search_config, mode, flag, own, expected
):
    search_config["llm_api_mode"] = mode
    args = make_args(hf_checkpoint=note_template_dir, apply_chat_template_kwargs=flag)
    messages = [{"role": "user", "content": f"Question: {QUESTION}?"}]  # XML mode without --apply-chat-template
    sample = Sample(prompt=messages, label=label("Paris"), apply_chat_template_kwargs=own)
    await generate(args, sample, slime_sampling_params(64))
    tokenizer = GenerateState(args).tokenizer
    assert tokenizer.decode(engine.calls[0].input_ids).startswith(f"NOTE: {expected}\n")


async def test_partial_rollout_with_a_router_mode_is_refused_at_the_first_sample(
    make_args, tokenizer, engine, search_config
):
    search_config["token_tracking_mode"] = "router_radix"
    with pytest.raises(ConfigError, match="--partial-rollout resumes an aborted episode from the tokens it wrote"):
        await rollout(make_args, tokenizer, partial_rollout=True)
    assert engine.calls == []


async def test_a_registered_mode_that_cannot_resume_is_refused_with_partial_rollout(
    make_args, tokenizer, engine, search_config
):
    from slime_search_r1.registry import TOKEN_DRIVERS
    from slime_search_r1.tokens.manual import ManualDriver

    TOKEN_DRIVERS.register("one_shot", type("OneShotDriver", (ManualDriver,), {"resumable": False}))
    search_config["token_tracking_mode"] = "one_shot"
    try:
        with pytest.raises(ConfigError, match="TOKEN_TRACKING_MODE=one_shot cannot continue"):
            await rollout(make_args, tokenizer, partial_rollout=True, mask_offpolicy_in_partial_rollout=False)
    finally:
        TOKEN_DRIVERS.unregister("one_shot")
    assert engine.calls == []


async def test_a_missing_reward_post_process_is_warned_about_once(
    make_args, tokenizer, engine, policy, search_config, caplog, monkeypatch
):
    monkeypatch.setattr(generate_with_search, "_warned", set())
    policy.scripts[QUESTION + "?"] = [ANSWER_TURN]
    for _ in range(2):
        await rollout(make_args, tokenizer, n_samples_per_prompt=8)
    warnings = [r for r in caplog.records if "siblings' advantages" in r.getMessage()]
    assert len(warnings) == 1
    caplog.clear()
    monkeypatch.setattr(generate_with_search, "_warned", set())
    await rollout(make_args, tokenizer, custom_reward_post_process_path=REWARD_POST_PROCESS_PATH)
    assert not [r for r in caplog.records if "siblings' advantages" in r.getMessage()]
