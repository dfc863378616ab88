"""The engine's limits as SGLang enforces them, through generate() (slime_search_r1/standin/sglang_rules.py cites
the source of each rule the test engine follows): an episode that reaches the served context length ends TRUNCATED
`context_length` and is trained, never FAILED, with or without speculative decoding's reserved slots and whether the
flags told the plugin the length or the engine's refusal did; no engine answer crashes a rollout, over either
transport; an aborted answer is checked against what was sent; and an episode that starts over keeps every counter
it keeps over attempts."""

import asyncio
import socket
from types import SimpleNamespace

import aiohttp
import pytest

from generate_with_search import generate
from slime.rollout.sglang_rollout import GenerateState, abort
from slime.utils.http_utils import init_http_client
from slime.utils.types import Sample
from slime_search_r1.episode import EpisodeStats, FinishReason
from slime_search_r1.loop import Budget
from slime_search_r1.tokens import engine as engine_module
from slime_search_r1.tokens.engine import EngineUnavailable
from slime_search_r1.tokens.engine_rules import (
    EngineLimits,
    config_context_length,
    reserved_draft_slots,
    stated_limits,
)
from support import slime_compat
from support.fake_sglang import Hold
from support.episodes import ANSWER, MODE_IDS, MODES, QUESTION, SEARCH, info, sample_for, searches
from slime_search_r1.standin.sglang_rules import SGLANG_0_5_15, SGLANG_0_5_23, VERSIONS
from support.slime_rollout import slime_sampling_params

# A long answer after one search: the episode that runs into the context length.
LONG_ANSWER = {mode: "<think>" + "Paris is the capital. " * 30 + "</think>" + ANSWER[mode] for mode in MODES}
# EAGLE with 3 steps, top-k 1 and 4 draft tokens: the tokenizer manager reserves max(1 * 3, 4) = 4 slots.
EAGLE_FLAGS = dict(
    sglang_speculative_algorithm="EAGLE",
    sglang_speculative_num_steps=3,
    sglang_speculative_eagle_topk=1,
    sglang_speculative_num_draft_tokens=4,
)
EAGLE_SLOTS = 4


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def one_episode(mode, make_args, tokenizer, search_config, *, budget=1024, **flags) -> Sample:
    search_config.update(llm_api_mode=mode)
    sample, _ = sample_for(mode, tokenizer)
    return await generate(make_args(**flags), sample, slime_sampling_params(budget))


async def second_turn_input(mode, make_args, tokenizer, engine, policy, search_config) -> int:
    """The tokens the answer turn is sent, measured on an engine with room to spare."""
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], LONG_ANSWER[mode]]
    sample = await one_episode(mode, make_args, tokenizer, search_config)
    assert sample.status == Sample.Status.COMPLETED and searches(sample) == 1
    return len(engine.calls[-1].input_ids)


def assert_truncated_at_the_context_length(sample: Sample) -> None:
    """Ended by the engine's limit, and trained as a budget end is (slime keeps it, with its tokens)."""
    assert sample.status == Sample.Status.TRUNCATED and not sample.remove_sample
    assert info(sample)["finish_reason"] == "context_length" and info(sample)["engine_error"] is None
    assert searches(sample) == 1 and sample.response_length > 0


def assert_every_request_fits(engine, context_length: int, reserved: int = 0) -> None:
    """Nothing SGLang refuses or silently shortens was asked for."""
    assert engine.refused == []
    for call in engine.calls:
        assert len(call.input_ids) <= context_length - max(7, reserved + 1)
        assert len(call.input_ids) + call.sampling_params["max_new_tokens"] <= context_length - max(2, reserved)


# ---- item 1: the budget knows the engine -------------------------------------------------------------------------


def test_the_engines_limits_as_slimes_flags_and_sglangs_refusals_state_them(tmp_path):
    # EAGLE reserves max(topk * steps, draft tokens); sizes left to SGLang are taken at its largest automatic choice
    assert reserved_draft_slots(SimpleNamespace(**EAGLE_FLAGS)) == 4
    assert reserved_draft_slots(SimpleNamespace(sglang_speculative_algorithm="eagle3")) == max(4 * 5, 8)
    assert reserved_draft_slots(SimpleNamespace(sglang_speculative_algorithm="NGRAM")) == 0
    assert reserved_draft_slots(SimpleNamespace(sglang_speculative_algorithm=None)) == 0
    # the checkpoint's context length as SGLang derives it (utils/hf_transformers/common.py)
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 4096, "rope_scaling": {"factor": 4.0}}')
    assert config_context_length(str(tmp_path)) == 16384
    # each refusal's figures: C and the input it counted (so the reservation), or the scheduler's longest input
    total = "Requested token count exceeds the model's maximum context length of 100 tokens. You requested a total of "
    assert stated_limits(total + "101 tokens: 94 tokens from the input messages and 7 tokens", 90) == EngineLimits(
        100, 4
    )
    longer = "The input (100 tokens) is longer than the model's context length (100 tokens)."
    assert stated_limits(longer, 96) == EngineLimits(100, 4)
    scheduler = "Input length (94 tokens) exceeds the maximum allowed length (94 tokens). Use a shorter input or"
    assert stated_limits(scheduler, 94) == EngineLimits(100, 0)
    assert stated_limits("unknown field `seed`", 3) is None


def test_the_budget_offers_what_the_engine_grants_and_says_which_limit_ended_it():
    driver = SimpleNamespace(context_length=90, response_length=10)
    own = Budget(response=1000, context=1000)
    assert (own.left(driver), own.reason(driver)) == (910, FinishReason.TOKEN_BUDGET)
    engine = Budget(response=1000, context=100, engine=EngineLimits(100))
    assert (engine.left(driver), engine.reason(driver)) == (8, FinishReason.CONTEXT_LENGTH)  # C - input - 2
    assert engine.left(driver, reply=4) == 0  # an input of 94 = C - 6 tokens is refused
    eagle = Budget(response=1000, context=100, engine=EngineLimits(100, 4))
    assert eagle.left(driver) == 6  # C - input - 4
    assert Budget(response=15, context=100, engine=EngineLimits(100)).reason(driver) == FinishReason.TOKEN_BUDGET


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("below", [1, 3, 6], ids=lambda n: f"C-{n}")
async def test_a_turn_the_scheduler_would_refuse_for_length_is_not_sent_and_the_episode_trains(
    below, mode, version, make_args, tokenizer, engine, policy, search_config
):
    """The budget equal to the served context length C (--sglang-context-length): the answer turn's input lands within
    6 tokens of C, which the scheduler refuses (HTTP 400, "Input length ... exceeds the maximum allowed length");
    the episode ends TRUNCATED context_length instead, and nothing was refused."""
    engine.version = version
    context = await second_turn_input(mode, make_args, tokenizer, engine, policy, search_config) + below
    engine.context_length, engine.calls = context, []
    search_config.update(max_context_length=context)
    sample = await one_episode(mode, make_args, tokenizer, search_config, sglang_context_length=context)
    assert_truncated_at_the_context_length(sample)
    assert_every_request_fits(engine, context)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_speculative_decodings_reserved_slots_are_left_out_of_every_request(
    mode, make_args, tokenizer, engine, policy, search_config
):
    """With EAGLE's 4 reserved slots the tokenizer manager refuses input + 4 + max_new_tokens > C ("Requested token
    count exceeds the model's maximum context length"): the first turn is offered C - input - 4, and the episode
    that runs into C ends TRUNCATED context_length."""
    context = await second_turn_input(mode, make_args, tokenizer, engine, policy, search_config) + 40
    engine.context_length, engine.speculative_reserved, engine.calls = context, EAGLE_SLOTS, []
    search_config.update(max_context_length=context)
    sample = await one_episode(mode, make_args, tokenizer, search_config, sglang_context_length=context, **EAGLE_FLAGS)
    assert_truncated_at_the_context_length(sample)
    assert_every_request_fits(engine, context, EAGLE_SLOTS)
    last = engine.calls[-1]  # the answer turn, cut by the engine's length after what it was offered
    assert last.finish == {"type": "length", "length": context - len(last.input_ids) - EAGLE_SLOTS}
    assert len(last.output_ids) == last.sampling_params["max_new_tokens"]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_the_plugin_asks_for_the_new_tokens_the_scheduler_leaves_it(
    mode, make_args, tokenizer, engine, policy, search_config
):
    """The scheduler lowers max_new_tokens to C - input - 2 without a word: the plugin asks for that much, gets all
    of it, and the turn that uses it up ends the episode at the context length (not the plugin's budget)."""
    context = await second_turn_input(mode, make_args, tokenizer, engine, policy, search_config) + 40
    engine.context_length, engine.calls = context, []
    search_config.update(max_context_length=context)
    sample = await one_episode(mode, make_args, tokenizer, search_config, sglang_context_length=context)
    assert_truncated_at_the_context_length(sample)
    last = engine.calls[-1]
    assert last.sampling_params["max_new_tokens"] == context - len(last.input_ids) - 2 == len(last.output_ids)


@pytest.mark.parametrize("transport", ["aiohttp", "slime"])
@pytest.mark.parametrize("reserved", [0, EAGLE_SLOTS], ids=["plain", "eagle"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_an_engine_that_refuses_a_request_for_length_states_the_limit_the_episode_ends_at(
    mode, reserved, transport, make_args, tokenizer, engine, policy, search_config
):
    """Flags that tell neither the context length nor the speculative reservation (a KV pool smaller than a context
    refuses alike), the budget equal to C: SGLang's HTTP 400 for length is never retried as such, over either
    transport. The scheduler's refusal of the answer turn's input is the limit reached: TRUNCATED context_length,
    the engine's words in the record. With EAGLE's slots the first turn is refused first: the refusal states C and
    the slots, and the turn is asked again within them (later episodes start within them)."""
    context = await second_turn_input(mode, make_args, tokenizer, engine, policy, search_config) + 3
    engine.context_length, engine.speculative_reserved, engine.calls = context, reserved, []
    search_config.update(max_context_length=context, engine_transport=transport)
    args = make_args()
    init_http_client(args)
    sample, prompt_ids = sample_for(mode, tokenizer)
    sample = await generate(args, sample, slime_sampling_params(1024))
    assert_truncated_at_the_context_length(sample)
    (refusal,) = engine.refused  # one try: a 4xx is never retried
    message = refusal["error"]["message"]
    if reserved:
        assert message.startswith(f"Requested token count exceeds the model's maximum context length of {context} ")
        assert engine.calls[0].sampling_params["max_new_tokens"] == context - len(prompt_ids) - reserved
        assert info(sample)["length_refusal"] is None  # the episode went on within the stated limits
        engine.calls = []
        await one_episode(mode, make_args, tokenizer, search_config)
        assert engine.refused == [refusal] and engine.calls  # the next episode asked within them at once
    else:
        assert message.startswith(f"Input length ({context - 3} tokens) exceeds the maximum allowed length")
        assert message[:80] in info(sample)["length_refusal"]


async def slime_rollout(args, groups, *, abort_at: Hold | None = None):
    """One rollout through slime's own path (GenerateState -> generate_and_rm_group -> generate_and_rm -> generate();
    SLIME_SRC runs slime's); with `abort_at`, slime's abort() once that request holds its tokens, which hands the
    partial groups back. Returns the finished groups, or the ones handed back."""
    state = GenerateState(args)
    state.submit_generate_tasks(groups)
    if abort_at is None:
        done = await asyncio.gather(*state.pendings)
        state.reset()
        return list(done)
    await asyncio.to_thread(abort_at.reached.wait)
    buffered = await abort(args, 0)
    state.reset()
    return buffered


async def test_slimes_partial_rollout_resumes_an_episode_and_trains_it_at_the_context_length(
    make_args, tokenizer, engine, policy, search_config
):
    """Through slime's own rollout with --partial-rollout: slime aborts the answer turn 10 tokens in; the resumed
    episode goes on within the context length C (its turn offered C - input - 2 after what it had sampled), meets it,
    ends TRUNCATED context_length, and is scored and kept for training, nothing refused."""
    context = await second_turn_input("generate", make_args, tokenizer, engine, policy, search_config) + 40
    engine.context_length, engine.calls = context, []
    search_config.update(max_context_length=context, max_turns=4)
    args = make_args(partial_rollout=True, sglang_context_length=context)
    init_http_client(args)
    slime_compat.reset_generate_state()
    sample, _ = sample_for("generate", tokenizer)
    sample.index, sample.group_index = 0, 0
    buffered = await slime_rollout(args, [[sample]], abort_at=engine.hold_call(2, 10))
    assert buffered[0][0].status == Sample.Status.ABORTED and info(buffered[0][0])["resume"]["stage"] == "turn"
    ((done,),) = await slime_rollout(args, buffered)
    assert_truncated_at_the_context_length(done)
    assert done.reward is not None and info(done)["resumes"] == 1
    assert_every_request_fits(engine, context)
    first, aborted, resumed = engine.calls
    assert len(aborted.output_ids) == 11  # the 10 held, and the one more step every abort runs
    assert len(resumed.input_ids) + len(resumed.output_ids) == context - 2  # all the scheduler grants


# ---- item 2: no engine answer crashes a rollout ------------------------------------------------------------------


@pytest.fixture
def quick_retries(monkeypatch):
    """The engine's retries 0 s apart (60 of them, as slime's post())."""
    monkeypatch.setattr(engine_module, "ENGINE_RETRY_WAIT_S", 0.0)


@pytest.mark.parametrize("transport", ["aiohttp", "slime"])
async def test_a_rejected_request_is_tried_once_and_fails_its_sample(
    transport, make_args, tokenizer, engine, policy, search_config
):
    """A 4xx would be refused again: one try, the sample FAILED with the engine's words, over either transport (slime's
    post() on its own retries every error 60 times)."""
    policy.scripts[QUESTION + "?"] = [ANSWER["generate"]]
    search_config.update(engine_transport=transport)
    args = make_args()
    init_http_client(args)
    engine.fail_next(1, status=422)
    sample = await generate(args, sample_for("generate", tokenizer)[0], slime_sampling_params(1024))
    assert engine.failures_answered == 1 and engine.calls == []
    assert sample.status == Sample.Status.FAILED and sample.remove_sample
    assert "HTTP 422" in info(sample)["engine_error"] and "injected failure" in info(sample)["engine_error"]


@pytest.mark.parametrize("transport", ["aiohttp", "slime"])
async def test_an_engine_that_answers_errors_to_every_try_fails_the_sample_not_the_rollout(
    transport, make_args, tokenizer, engine, policy, search_config, quick_retries
):
    """60 answers of HTTP 503 (a request timeout, out of memory on retract): the engine is there but failing this
    request; the sample ends FAILED engine_error after the retries, and generate() returns."""
    policy.scripts[QUESTION + "?"] = [ANSWER["generate"]]
    search_config.update(engine_transport=transport)
    args = make_args()
    init_http_client(args)
    engine.fail_next(60, status=503)
    sample = await generate(args, sample_for("generate", tokenizer)[0], slime_sampling_params(1024))
    assert engine.failures_answered == 60
    assert sample.status == Sample.Status.FAILED and "HTTP 503" in info(sample)["engine_error"]


@pytest.mark.parametrize("transport", ["aiohttp", "slime"])
async def test_no_engine_reachable_is_the_one_fatal_case_and_says_so_in_one_line(
    transport, make_args, tokenizer, search_config, quick_retries
):
    search_config.update(engine_transport=transport)
    port = closed_port()
    args = make_args(sglang_router_port=port)
    init_http_client(args)
    with pytest.raises(EngineUnavailable) as raised:
        await generate(args, sample_for("generate", tokenizer)[0], slime_sampling_params(1024))
    message = str(raised.value)
    assert message.startswith(f"no SGLang engine reachable at http://127.0.0.1:{port}/generate after 60 attempts: ")
    assert "\n" not in message and raised.value.__cause__ is None


# ---- item 4: what the test engine answers, and what the plugin sends ---------------------------------------------


async def post_generate(engine, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(engine.url + "/generate", json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("version", VERSIONS)
async def test_the_test_engine_refuses_for_length_as_sglang_does(version, engine):
    """The three refusals, in SGLang's order and words (sglang_rules.LengthRules), each an HTTP 400 with
    {"error": {"message": ...}}; the scheduler's silent lowering shows in the finish's length."""
    engine.version, engine.context_length = version, 100
    cases = [
        (94, 1, 0, "Input length (94 tokens) exceeds the maximum allowed length (94 tokens). Use a shorter input or "
         "enable --allow-auto-truncate."),  # C - 6 = 94 tokens or more: the scheduler
        (96, 1, 4, "The input (100 tokens) is longer than the model's context length (100 tokens)."),
        (90, 7, 4, "Requested token count exceeds the model's maximum context length of 100 tokens. You requested a "
         "total of 101 tokens: 94 tokens from the input messages and 7 tokens for the completion. Please reduce the "
         "number of tokens in the input messages or the completion to fit within the limit."),
    ]  # fmt: skip
    for length, max_new, reserved, message in cases:
        engine.speculative_reserved = reserved
        body = {"input_ids": [15] * length, "sampling_params": {"max_new_tokens": max_new}}
        assert await post_generate(engine, body) == (400, {"error": {"message": message}})
    engine.speculative_reserved = 0  # 90 + 10 fits C, and the scheduler lowers the 10 to C - 90 - 2
    status, body = await post_generate(engine, {"input_ids": [15] * 90, "sampling_params": {"max_new_tokens": 10}})
    assert status == 200 and body["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert len(body["output_ids"]) == 8


async def test_sglang_0_5_23_refuses_an_unknown_sampling_params_key_with_a_plain_string_error(engine):
    """api_types.py's SamplingParams rejects unknown keys (http_server.py answers {"error": <serde's text>}, a plain
    string); 0.5.15.post1 has no such check."""
    body = {"input_ids": [15, 16], "sampling_params": {"max_new_tokens": 4, "seed": 1}}
    engine.version = SGLANG_0_5_15
    assert (await post_generate(engine, body))[0] == 200
    engine.version = SGLANG_0_5_23
    status, answer = await post_generate(engine, body)
    assert status == 400 and answer["error"].startswith("unknown field `seed`, expected one of `max_new_tokens`, ")


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_the_plugin_sends_only_the_sampling_params_sglang_knows(
    mode, make_args, tokenizer, engine, policy, search_config
):
    """On 0.5.23, which refuses any other key (sglang_rules.SAMPLING_PARAMS_0_5_23, pinned from api/v1/api_types.py),
    every request of an episode (slime's params, the protocol's stops, min_new_tokens) is accepted."""
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    engine.version = SGLANG_0_5_23
    search_config.update(llm_api_mode=mode)
    params = {**slime_sampling_params(1024), "min_new_tokens": 1, "repetition_penalty": 1.0, "sampling_seed": 7}
    sample = await generate(make_args(), sample_for(mode, tokenizer)[0], params)
    assert sample.status == Sample.Status.COMPLETED and engine.refused == [] and len(engine.calls) == 2


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_retracted_request_aborted_in_the_queue_resumes_from_the_tokens_it_had_streamed(
    version, make_args, tokenizer, engine, policy, search_config
):
    """Retracted after 120 tokens, then aborted in the waiting queue: SGLang answers "Abort in waiting queue" with the
    100 tokens the tokenizer manager had been sent (every 50 for a non-streamed request) and their log probs, without
    prompt_tokens. With --partial-rollout the episode resumes after them and ends as the uninterrupted one."""
    policy.scripts[QUESTION + "?"] = [LONG_ANSWER["generate"]]
    engine.version = version
    baseline = await one_episode("generate", make_args, tokenizer, search_config)
    hold = engine.retract_call(len(engine.calls) + 1, 120)
    args = make_args(partial_rollout=True)
    first = asyncio.ensure_future(generate(args, sample_for("generate", tokenizer)[0], slime_sampling_params(1024)))
    await asyncio.to_thread(hold.reached.wait)
    async with aiohttp.ClientSession() as session:
        await session.post(engine.url + "/abort_request", json={"abort_all": True})
    aborted = await first
    retracted = engine.calls[-1]
    assert retracted.finish == {"type": "abort", "message": "Abort in waiting queue"}
    assert len(retracted.output_ids) == 100 and "prompt_tokens" not in retracted.meta_info
    assert aborted.status == Sample.Status.ABORTED and aborted.response_length == 100
    resumed = await generate(args, aborted, slime_sampling_params(1024))
    assert resumed.status == Sample.Status.COMPLETED
    assert (resumed.tokens, resumed.rollout_log_probs) == (baseline.tokens, baseline.rollout_log_probs)


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_search_tag_written_in_more_tokens_than_its_own_is_cut_by_the_plugin(
    version, make_args, tokenizer, engine, policy, search_config
):
    """SGLang looks for a stop string only in the last (its canonical token count + 1) output tokens: `</search>`
    sampled as `<`, `/`, `se`, `arch`, `>` never stops the engine, which writes on to the turn's end. The plugin
    ends the turn after its `>`, runs the search, and keeps what was sampled up to there."""
    policy.scripts[QUESTION + "?"] = [SEARCH["generate"], ANSWER["generate"]]
    engine.version, engine.sampled_as = version, {" </search>": [" ", "<", "/", "se", "arch", ">"]}
    sample = await one_episode("generate", make_args, tokenizer, search_config)
    first = engine.calls[0]
    assert first.finish["type"] == "stop" and first.finish["matched"] != "</search>"  # ran on to the turn's end
    kept = sample.tokens[len(first.input_ids) :][: len(first.output_ids)]
    text = tokenizer.decode(first.output_ids, skip_special_tokens=False)
    cut = text.index("</search>") + len("</search>")
    assert tokenizer.decode(kept, skip_special_tokens=False).startswith(text[:cut])
    turn = next(count for count in range(1, len(first.output_ids) + 1)
                if "</search>" in tokenizer.decode(first.output_ids[:count], skip_special_tokens=False))  # fmt: skip
    assert sample.tokens[len(first.input_ids) : len(first.input_ids) + turn] == first.output_ids[:turn]
    assert sample.loss_mask[: turn + 1] == [1] * turn + [0]  # the reply follows the turn's `>` at once
    assert sample.status == Sample.Status.COMPLETED and searches(sample) == 1


# ---- item 5: what an aborted answer conditioned on ----------------------------------------------------------------


async def test_an_aborted_answer_that_conditioned_on_a_truncated_context_is_not_resumed(
    make_args, tokenizer, engine, policy, search_config
):
    """Under --allow-auto-truncate the engine cuts an input of C - 6 tokens or more to C - 6 and says so only in
    prompt_tokens; an aborted answer carries it too. The sample ends FAILED instead of being resumed and trained
    on a context the engine never saw."""
    policy.scripts[QUESTION + "?"] = [LONG_ANSWER["generate"]]
    sample, prompt_ids = sample_for("generate", tokenizer)
    engine.context_length, engine.allow_auto_truncate = len(prompt_ids) + 3, True
    hold = engine.hold_call(1, 0)
    args = make_args(partial_rollout=True)
    episode = asyncio.ensure_future(generate(args, sample, slime_sampling_params(1024)))
    await asyncio.to_thread(hold.reached.wait)
    async with aiohttp.ClientSession() as session:
        await session.post(engine.url + "/abort_request", json={"abort_all": True})
    sample = await episode
    (call,) = engine.calls
    assert call.finish["type"] == "abort" and call.meta_info["prompt_tokens"] == len(prompt_ids) - 3
    assert sample.status == Sample.Status.FAILED and sample.remove_sample
    assert info(sample)["engine_error"].startswith(
        f"the engine conditioned on {len(prompt_ids) - 3} tokens but {len(prompt_ids)} were sent"
    )


# ---- item 7: counters over attempts ------------------------------------------------------------------------------


async def test_an_episode_that_starts_over_keeps_every_counter_it_keeps_over_attempts(
    make_args, tokenizer, engine, policy, search_config
):
    """An aborted sample handed back without --partial-rollout starts over: engine_aborts, aborts_after_turn_end (a
    part of them) and restarts go on counting from its record."""
    policy.scripts[QUESTION + "?"] = [ANSWER["generate"]]
    sample = sample_for("generate", tokenizer)[0]
    earlier = {"engine_aborts": 3, "aborts_after_turn_end": 2, "restarts": 1}
    sample.metadata, sample.status = {"search_r1": dict(earlier, finish_reason="engine_abort")}, Sample.Status.ABORTED
    sample = await generate(make_args(), sample, slime_sampling_params(1024))
    assert sample.status == Sample.Status.COMPLETED
    assert {name: info(sample)[name] for name in EpisodeStats.OVER_ATTEMPTS} == {**earlier, "restarts": 2}
