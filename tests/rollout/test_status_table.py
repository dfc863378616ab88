"""The status table (docs/rollout.md; slime_search_r1/loop.py): how an episode ends. One section per row,
each row proven in XML and chat mode where it applies to both.

| what happened                                                    | sample.status |
| the model answered                                               | COMPLETED     |
| the engine aborted, or slime's abort flag was set before a turn  | ABORTED       |
| the response or context budget ran out                           | TRUNCATED     |
| the engine's context length reached (test_engine_limits.py)      | TRUNCATED     |
| max_turns model turns without an answer                          | TRUNCATED     |
| a search still failing after its retries                         | FAILED        |
"""

import asyncio

import httpx
import pytest

from generate_with_search import generate, reward_func
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.tools import search as search_tool
from support.episodes import (
    search_failures,
    searches,
    ANSWER,
    ANSWER_TURN,
    CALL,
    LONG_THOUGHT,
    MODE_IDS,
    MODES,
    NO_ACTION_TURN,
    QUESTION,
    SEARCH,
    SEARCH_TURN,
    info,
    run_chat,
    run_episode,
    sample_for,
    xml_sample,
)
from support.fidelity import assert_faithful
from support.slime_rollout import slime_sampling_params
from support.waits import until_set

# What opens the environment's reply to a search in each protocol.
OBSERVATION_OPEN = {"generate": "<information>", "chat": "<tool_response>"}
# How a turn that calls a tool ends: the XML stop string, or the chat call and its end-of-turn token.
LAST_CALL_END = {"generate": "</search>", "chat": "</tool_call><|im_end|>"}
by_mode = pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)


# ---- COMPLETED: the model answered -------------------------------------------------------------------------------


@by_mode
async def test_an_answer_completes_the_episode(mode, make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    sample = (await run_episode(mode, make_args, tokenizer, search_config)).sample
    assert sample.status == Sample.Status.COMPLETED
    assert info(sample)["finish_reason"] == "answer"
    assert info(sample)["turns"] == 2
    assert searches(sample) == 1


# ---- ABORTED: the engine aborted, or slime's abort flag was set before a turn -----------------------------------


@by_mode
async def test_slime_s_abort_flag_before_a_turn_aborts_without_calling_the_engine(
    mode, make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    args = make_args()
    GenerateState(args).aborted = True
    episode = await run_episode(mode, lambda **_: args, tokenizer, search_config)
    assert episode.sample.status == Sample.Status.ABORTED
    assert engine.calls_for(episode.prompt_ids) == []


@by_mode
@pytest.mark.parametrize("when", ["mid generation", "before prefill"])
async def test_an_engine_abort_aborts_the_episode(mode, when, make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    if when == "mid generation":  # the first turn waits in flight after 3 tokens; slime's abort answers them
        held = engine.hold_call(len(engine.calls) + 1, tokens=3)
    else:  # the first request waits in the queue; aborted there, it answers nothing and 0 prompt tokens
        held = engine.hold_after(len(engine.calls))
    task = asyncio.create_task(run_episode(mode, make_args, tokenizer, search_config))
    await until_set(held.reached, task)
    if when == "mid generation":
        async with httpx.AsyncClient() as client:  # what slime's abort() sends every engine
            (await client.post(engine.url + "/abort_request", json={"abort_all": True})).raise_for_status()
    else:
        engine.aborted = True
        held.open()
    sample = (await task).sample
    assert sample.status == Sample.Status.ABORTED
    assert info(sample)["finish_reason"] == "engine_abort"
    assert sample.response_length == 0  # without --partial-rollout slime drops the sample: nothing is kept


async def test_an_abort_is_not_held_up_by_a_retrying_search(
    make_args, tokenizer, engine, policy, retriever, search_config
):
    search_config.update(search_attempts=5)
    retriever.down = True
    held = retriever.hold_next()  # the search's first attempt waits in flight
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args = make_args()
    task = asyncio.create_task(run_episode("generate", lambda **_: args, tokenizer, search_config))
    await until_set(held.reached, task)
    GenerateState(args).aborted = True
    held.release(503)  # that attempt fails as the down retriever's would; no other attempt follows the abort
    sample = (await task).sample
    assert sample.status == Sample.Status.ABORTED
    assert info(sample)["finish_reason"] == "rollout_aborted"
    assert retriever.requests == 1


async def test_searches_queued_behind_the_concurrency_bound_are_skipped_on_abort(
    make_args, tokenizer, engine, policy, retriever, search_config, monkeypatch
):
    monkeypatch.setattr(search_tool, "SEARCH_CONCURRENCY", 1)
    held = retriever.hold_next()  # the first search holds the one slot; the others queue behind it
    questions = [f"Question number {i}" for i in range(6)]
    for question in questions:
        policy.scripts[question + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args = make_args()
    every_turn = engine.when_calls(len(engine.calls) + len(questions))
    samples = [xml_sample(tokenizer, q) for q in questions]
    tasks = [asyncio.create_task(generate(args, s, slime_sampling_params(512))) for s in samples]
    await until_set(held.reached, *tasks)
    await until_set(every_turn, *tasks)  # every episode is past its turn's abort check: only its search is left
    GenerateState(args).aborted = True
    held.release()
    done = await asyncio.gather(*tasks)
    assert {s.status for s in done} == {Sample.Status.ABORTED}
    assert retriever.requests == 1  # the one in flight when slime aborted


# ---- TRUNCATED: the response or context budget ran out (each turn is offered exactly what is left) --------------


@by_mode
async def test_running_out_of_the_response_budget_truncates_and_each_turn_is_offered_what_is_left(
    mode, make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], LONG_THOUGHT + "<answer> Paris </answer>"]
    budget = 160
    episode = await run_episode(mode, make_args, tokenizer, search_config, budget=budget)
    sample, prompt_ids = episode.sample, episode.prompt_ids
    calls = engine.calls_for(prompt_ids)
    assert sample.status == Sample.Status.TRUNCATED
    assert info(sample)["finish_reason"] == "token_budget"
    assert sample.response_length == budget
    for call in calls:
        assert call.sampling_params["max_new_tokens"] == budget - (len(call.input_ids) - len(prompt_ids))
    assert_faithful(sample, calls, tokenizer, prompt_ids)


@by_mode
async def test_an_observation_that_does_not_fit_the_budget_ends_the_episode(
    mode, make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    first_turn = len(tokenizer.encode(SEARCH[mode])) + 1  # the token holding the call's end may merge; +1 is slack
    budget = first_turn + 20
    episode = await run_episode(mode, make_args, tokenizer, search_config, budget=budget)
    sample = episode.sample
    assert sample.status == Sample.Status.TRUNCATED
    assert OBSERVATION_OPEN[mode] not in sample.response
    assert sample.response_length <= budget
    assert len(engine.calls_for(episode.prompt_ids)) == 1


def first_turn_and_reply(sample: Sample) -> tuple[int, int]:
    """(tokens of the first turn, tokens of the reply after it), read off the loss mask: the model's tokens are
    trained, the environment's are not."""
    turn = sample.loss_mask.index(0)
    return turn, sample.loss_mask.index(1, turn) - turn


@by_mode
@pytest.mark.parametrize("room", [0, 1], ids=["no room after the reply", "one token after the reply"])
async def test_a_reply_is_shown_only_when_a_generated_token_still_fits_after_it(
    mode, room, make_args, tokenizer, engine, policy, search_config
):
    policy.scripts[QUESTION + "?"] = [NO_ACTION_TURN, ANSWER[mode]]  # a turn with no action, then the answer
    turn, reply = first_turn_and_reply((await run_episode(mode, make_args, tokenizer, search_config)).sample)
    budget = turn + reply + room
    sample = (await run_episode(mode, make_args, tokenizer, search_config, budget=budget)).sample
    assert sample.status == Sample.Status.TRUNCATED
    assert info(sample)["finish_reason"] == "token_budget"
    if room == 0:
        # the reply would fill the budget exactly: the response must not end in the environment's tokens
        assert sample.response_length == turn
        assert sample.loss_mask == [1] * turn
    else:
        assert sample.response_length == budget
        assert sample.loss_mask == [1] * turn + [0] * reply + [1]  # the reply, and the one token generated after it


async def test_a_chat_episode_out_of_budget_after_a_call_is_truncated(
    make_args, tokenizer, engine, policy, search_config
):
    search_config["max_turns"] = 2
    policy.scripts[QUESTION + "?"] = [CALL]
    sample = await run_chat(make_args(), search_config, "chat", budget=40)
    assert sample.status == Sample.Status.TRUNCATED
    assert sample.response_length <= 40


@by_mode
async def test_the_context_limit_caps_each_turn(mode, make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    _, prompt_ids = sample_for(mode, tokenizer)
    limit = len(prompt_ids) + 120
    episode = await run_episode(mode, make_args, tokenizer, search_config, rollout_max_context_len=limit)
    assert len(episode.sample.tokens) <= limit
    for call in engine.calls_for(episode.prompt_ids):
        assert len(call.input_ids) + call.sampling_params["max_new_tokens"] <= limit


@by_mode
async def test_a_prompt_longer_than_the_context_is_truncated_without_calling_the_engine(
    mode, make_args, tokenizer, engine, search_config
):
    episode = await run_episode(mode, make_args, tokenizer, search_config, rollout_max_context_len=10)
    sample = episode.sample
    assert sample.status == Sample.Status.TRUNCATED
    assert sample.response == ""
    assert sample.response_length == 0
    assert sample.loss_mask == []
    assert sample.rollout_log_probs == []
    assert engine.calls_for(episode.prompt_ids) == []


async def test_a_chat_turn_cut_by_length_after_its_answer_is_truncated(make_args, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = ["<answer> Paris </answer> and then I kept on writing " + "more " * 100]
    sample = await run_chat(make_args(), search_config, "chat", budget=30)
    assert sample.status == Sample.Status.TRUNCATED
    assert sample.response_length == 30
    policy.scripts[QUESTION + "?"] = ["<answer> Paris </answer>"]
    sample = await run_chat(make_args(), search_config, "chat", budget=30)
    assert sample.status == Sample.Status.COMPLETED, "the same answer ending within the budget is not completed"


# ---- TRUNCATED: max_turns model turns without an answer (a search on the last turn is not run) -----------------


@pytest.mark.parametrize(("mode", "max_turns"), [("generate", 3), ("chat", 2)], ids=MODE_IDS)
async def test_max_turns_without_an_answer_truncates_without_running_the_last_search(
    mode, max_turns, make_args, tokenizer, engine, policy, retriever, search_config, monkeypatch
):
    monkeypatch.setitem(search_config, "max_turns", max_turns)
    policy.scripts[QUESTION + "?"] = [SEARCH[mode]]
    episode = await run_episode(mode, make_args, tokenizer, search_config)
    sample, prompt_ids = episode.sample, episode.prompt_ids
    assert sample.status == Sample.Status.TRUNCATED
    assert info(sample)["finish_reason"] == "max_turns"
    assert len(engine.calls_for(prompt_ids)) == max_turns
    assert len(retriever.queries) == max_turns - 1
    assert sample.response.endswith(LAST_CALL_END[mode]), "the last turn's call is not where the response ends"
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)
    assert await reward_func(episode.args, sample) == 0.0


# ---- FAILED: a search still failing after its retries (rewarded normally; remove_sample keeps it out) -----------


@by_mode
async def test_a_search_that_stays_down_fails_the_sample_which_is_still_rewarded(
    mode, make_args, tokenizer, engine, policy, retriever, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    retriever.down = True
    episode = await run_episode(mode, make_args, tokenizer, search_config)
    sample, prompt_ids = episode.sample, episode.prompt_ids
    assert sample.status == Sample.Status.FAILED
    assert sample.remove_sample is True
    assert search_failures(sample) == 1
    assert "503" in info(sample)["tool_error"]
    assert len(engine.calls_for(prompt_ids)) == 1
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)
    assert await reward_func(episode.args, sample) == 0.0


async def test_transient_search_errors_are_retried_and_the_episode_completes(
    make_args, tokenizer, engine, policy, retriever, search_config
):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    retriever.fail_next(2, status=503)
    sample = (await run_episode("generate", make_args, tokenizer, search_config)).sample
    assert sample.status == Sample.Status.COMPLETED
    assert retriever.failures_left == 0


@by_mode
async def test_a_search_server_answering_nonsense_fails_the_sample_not_the_batch(
    mode, make_args, tokenizer, engine, policy, retriever, search_config
):
    retriever.docs = ["a bare string instead of a document"]
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    sample = (await run_episode(mode, make_args, tokenizer, search_config)).sample
    assert sample.status == Sample.Status.FAILED
    assert "retrieval hit must be an object" in info(sample)["tool_error"]


@by_mode
async def test_a_search_answer_nested_too_deeply_fails_the_sample_not_the_batch(
    mode, make_args, tokenizer, engine, policy, retriever, search_config
):
    retriever.raw_answer = (b'{"result": [' + b"[" * 5000 + b"]" * 5000 + b"]}", 200)
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    sample = (await run_episode(mode, make_args, tokenizer, search_config)).sample
    assert sample.status == Sample.Status.FAILED
    assert sample.remove_sample is True
    assert "nested too deeply" in info(sample)["tool_error"]


@pytest.mark.parametrize(("mode", "tracking"), [("generate", "router_radix"), ("chat", "router_handler")])
async def test_the_router_modes_keep_failed_samples_out_of_the_loss(
    router_args, tokenizer, engine, policy, retriever, search_config, mode, tracking
):
    retriever.down = True
    search_turn = CALL if mode == "chat" else "<think>x</think>\n<search> capital of France </search>"
    policy.scripts[QUESTION + "?"] = [search_turn, ANSWER["chat"]]
    sample, _ = sample_for(mode, tokenizer)
    sample = await run_chat(router_args(), search_config, mode, tracking=tracking, sample=sample)
    assert sample.status == Sample.Status.FAILED
    assert sample.remove_sample is True
    assert sample.response_length > 0
