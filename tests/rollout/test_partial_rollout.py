"""Partial rollout (slime's --partial-rollout): an episode slime aborts comes back in a later rollout and resumes where
it stopped, and ends as the uninterrupted episode would have, token for token.

Every rollout here goes through slime's own path: GenerateState.submit_generate_tasks -> generate_and_rm_group ->
generate_and_rm -> generate(), and abort() (POST /abort_request to every engine the router lists, then the partial
groups back to the data buffer); the stand-in follows slime's code, and SLIME_SRC runs slime's. The test engine holds a
request in flight after a chosen number of tokens until the abort reaches it, and answers what it had sampled, as
SGLang does; the test retriever holds a search the same way.
"""

import asyncio
import copy
import json
import os

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from slime.rollout.sglang_rollout import GenerateState, abort
from slime.utils.http_utils import init_http_client
from slime.utils.types import Sample
from slime_search_r1.episode import resume_point
from slime_search_r1.training.metrics import search_metrics
from support.episodes import (
    CHAT_LABEL,
    NO_ACTION_TURN,
    QUESTION,
    TWO_SEARCHES_THEN_ANSWER,
    chat_messages,
    chat_prompt_ids,
    info,
    label,
)
from support import slime_compat
from support.fidelity import assert_faithful, assert_resumed_exactly
from support.partial_rollouts import reached, rollout_aborted_mid_generation, run_rollout
from support.slime_rollout import chat_prompt

SCRIPTS = TWO_SEARCHES_THEN_ANSWER
XML_SCRIPT = SCRIPTS["generate"]
MODES = ["generate", "chat"]


@pytest.fixture
def rollout_args(make_args, search_config):
    """slime's args for a partial rollout of one prompt, 4 turns, a 1024-token response budget."""

    def make(mode: str, masked: bool = False, **overrides):
        search_config.update(llm_api_mode=mode, max_turns=4)
        args = make_args(
            **{
                "partial_rollout": True,
                "mask_offpolicy_in_partial_rollout": masked,
                "rollout_max_response_len": 1024,
                **overrides,
            }
        )
        init_http_client(args)  # slime's rollout manager does; abort() talks to the engines with slime's client
        slime_compat.reset_generate_state()  # slime's GenerateState is built once per process, from its args
        return args

    return make


def new_sample(mode: str, tokenizer) -> Sample:
    if mode == "chat":
        return Sample(prompt=chat_messages(), label=CHAT_LABEL, index=0, group_index=0)
    return Sample(prompt=chat_prompt(tokenizer, QUESTION), label=label("Paris"), index=0, group_index=0)


def prompt_ids_of(mode: str, tokenizer) -> list[int]:
    if mode == "chat":
        return chat_prompt_ids(tokenizer, chat_messages())
    return tokenizer.encode(chat_prompt(tokenizer, QUESTION), add_special_tokens=False)


async def rollout_aborted_during_a_search(retriever, args, groups, rollout_id: int):
    """A rollout that slime aborts while a search is in flight; the retriever, cut off, answers 503."""
    hold = retriever.hold_next()
    state = GenerateState(args)
    state.submit_generate_tasks(groups)
    if not await reached(hold.reached, state):  # no search came: the rollout ran to its end
        retriever.hold = None
        done = [task.result() for task in state.pendings]
        state.reset()
        return done
    aborting = asyncio.ensure_future(abort(args, rollout_id))
    while not state.aborted:  # abort() sets the flag before its first await
        await asyncio.sleep(0)
    hold.release(503)
    buffered = await aborting
    state.reset()
    return buffered


def unmasked(resumed: Sample, baseline: Sample) -> Sample:
    """The resumed sample with the loss mask it had before slime's off-policy masking (assert_resumed_exactly showed
    that mask is the baseline's)."""
    view = copy.copy(resumed)
    view.loss_mask = list(baseline.loss_mask)
    return view


async def baseline_of(mode, rollout_args, tokenizer, **args_overrides) -> Sample:
    """The episode without any abort (the same scripted policy)."""
    return (await run_rollout(rollout_args(mode, **args_overrides), [[new_sample(mode, tokenizer)]]))[0][0]


# ---- where the abort comes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("masked", [False, True], ids=["kept", "off-policy-masked"])
async def test_an_episode_aborted_mid_turn_continues_from_its_last_token(
    mode, masked, rollout_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    baseline = await baseline_of(mode, rollout_args, tokenizer)
    args = rollout_args(mode, masked=masked)
    calls_before = len(engine.calls)
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample(mode, tokenizer)]], 2, 7, 0)
    sample = buffered[0][0]
    assert sample.status == Sample.Status.ABORTED
    assert sample.metadata["start_rollout_id"] == 0  # slime tagged it for its data buffer
    assert resume_point(info(sample)) == {
        "turn_index": 1, "stage": "turn", "turn_start": resume_point(info(sample))["turn_start"],
        "conversation_start": 2 if mode == "chat" else 0,
    }  # fmt: skip
    written = sample.response_length
    # the 7 tokens the engine had sampled when the abort came, and the one more step every abort runs (unchecked)
    assert sample.tokens[-8:] == engine.calls[calls_before + 1].output_ids
    resumed = (await run_rollout(args, buffered))[0][0]
    assert_resumed_exactly(resumed, baseline, masked_before=written if masked else None)
    # every engine context a prefix of the tokens, sampled tokens with their own log probs
    assert_faithful(
        unmasked(resumed, baseline), engine.calls[calls_before:], tokenizer, prompt_ids_of(mode, tokenizer)
    )
    assert info(resumed)["resumes"] == 1
    assert info(resumed)["resumed_at"] == [written]  # the response tokens an earlier policy wrote: the viewer marks


@pytest.mark.parametrize("mode", MODES)
async def test_an_episode_aborted_at_a_turn_boundary_resumes_with_that_turn(
    mode, rollout_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    baseline = await baseline_of(mode, rollout_args, tokenizer)
    args = rollout_args(mode)
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample(mode, tokenizer)]], 3, 0, 0)
    assert resume_point(info(buffered[0][0]))["turn_index"] == 2  # the third turn, nothing of it sampled yet
    assert_resumed_exactly((await run_rollout(args, buffered))[0][0], baseline)


@pytest.mark.parametrize("mode", MODES)
async def test_a_search_the_abort_interrupted_runs_again(mode, rollout_args, tokenizer, engine, policy, retriever):
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    baseline = await baseline_of(mode, rollout_args, tokenizer)
    args = rollout_args(mode)
    retriever.queries.clear()
    buffered = await rollout_aborted_during_a_search(retriever, args, [[new_sample(mode, tokenizer)]], 0)
    sample = buffered[0][0]
    assert resume_point(info(sample))["stage"] == "tool"  # its turn was read; its call is to run
    assert info(sample)["tools"].get("search", {}).get("failures", 0) == 0  # stopped, not failed
    assert retriever.queries == []  # the held search never answered
    resumed = (await run_rollout(args, buffered))[0][0]
    assert_resumed_exactly(resumed, baseline)
    assert retriever.queries == ["capital of France", "Paris France capital city"]  # the first one ran again


@pytest.mark.parametrize("mode", MODES)
async def test_an_episode_aborted_on_its_last_allowed_turn_counts_the_turns_it_took(
    mode, rollout_args, tokenizer, engine, policy, retriever, search_config
):
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode][:2]  # searches, never answers: max_turns ends it
    baseline = await baseline_of(mode, rollout_args, tokenizer)
    assert info(baseline)["finish_reason"] == "max_turns"
    args = rollout_args(mode)
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample(mode, tokenizer)]], 4, 3, 0)
    assert resume_point(info(buffered[0][0]))["turn_index"] == 3  # the last of 4
    assert_resumed_exactly((await run_rollout(args, buffered))[0][0], baseline)


@pytest.mark.parametrize("mode", MODES)
async def test_an_episode_aborted_at_the_budget_edge_resumes_with_what_is_left(
    mode, rollout_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    calls_before = len(engine.calls)
    full = await baseline_of(mode, rollout_args, tokenizer)
    answer = len(engine.calls[calls_before + 2].output_ids)  # the tokens of the answer turn
    budget = full.response_length - 5  # the answer turn runs out of budget 5 tokens before its end
    baseline = await baseline_of(mode, rollout_args, tokenizer, rollout_max_response_len=budget)
    assert info(baseline)["finish_reason"] == "token_budget"
    args = rollout_args(mode, rollout_max_response_len=budget)
    # aborted one token before the budget (with the abort's one more step): the resumed turn is offered exactly one
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample(mode, tokenizer)]], 3, answer - 7, 0)
    assert buffered[0][0].status == Sample.Status.ABORTED and buffered[0][0].response_length == budget - 1
    assert_resumed_exactly((await run_rollout(args, buffered))[0][0], baseline)


@pytest.mark.parametrize("mode", MODES)
async def test_an_abort_whose_last_token_uses_up_the_budget_ends_the_episode_there(
    mode, rollout_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    calls_before = len(engine.calls)
    full = await baseline_of(mode, rollout_args, tokenizer)
    answer = len(engine.calls[calls_before + 2].output_ids)
    budget = full.response_length - 5
    baseline = await baseline_of(mode, rollout_args, tokenizer, rollout_max_response_len=budget)
    args = rollout_args(mode, rollout_max_response_len=budget)
    # the abort's one more step samples the last token the budget allows: the engine would have said length
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample(mode, tokenizer)]], 3, answer - 6, 0)
    ended = buffered[0][0]
    assert ended.status == Sample.Status.TRUNCATED and info(ended)["finish_reason"] == "token_budget"
    assert info(ended)["engine_aborts"] == info(ended)["aborts_after_turn_end"] == 1
    calls_before = len(engine.calls)
    done = (await run_rollout(args, buffered))[0][0]
    assert len(engine.calls) == calls_before  # nothing left to generate: slime hands it on as it is
    assert_resumed_exactly(done, baseline)


@pytest.mark.parametrize("short", [2, 3], ids=["two tokens short of its stop", "three tokens short"])
async def test_a_turn_resumed_after_an_abort_is_cut_at_its_stop_string_as_the_uninterrupted_one_is(
    short, rollout_args, tokenizer, engine, policy, retriever
):
    # An engine that samples on past </search>: the turn is cut after the tag, counting the tokens sampled before
    # the abort (they are the turn's too), so the tokens and log probs kept are the uninterrupted episode's.
    engine.honor_stop_strings = False
    policy.scripts[QUESTION + "?"] = [XML_SCRIPT[0] + " and then <answer> Rome </answer> junk", *XML_SCRIPT[1:]]
    baseline = await baseline_of("generate", rollout_args, tokenizer)
    args = rollout_args("generate")
    # what the first turn had sampled when slime aborted, before the one more step of the abort
    sampled = len(tokenizer.encode(XML_SCRIPT[0])) - short
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample("generate", tokenizer)]], 1, sampled, 0)
    assert buffered[0][0].status == Sample.Status.ABORTED
    calls_before = len(engine.calls)
    resumed = (await run_rollout(args, buffered))[0][0]
    assert "junk" in tokenizer.decode(engine.calls[calls_before].output_ids)  # the resumed request ran past the tag
    assert_resumed_exactly(resumed, baseline)
    assert "Rome" not in resumed.response


@pytest.mark.parametrize("mode", MODES)
async def test_an_episode_aborted_twice_resumes_twice(mode, rollout_args, tokenizer, engine, policy, retriever):
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    baseline = await baseline_of(mode, rollout_args, tokenizer)
    args = rollout_args(mode, masked=True)
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample(mode, tokenizer)]], 1, 4, 0)
    first = buffered[0][0].response_length
    buffered = await rollout_aborted_mid_generation(engine, args, buffered, 2, 9, 1)
    written = buffered[0][0].response_length
    assert buffered[0][0].metadata["start_rollout_id"] == 0  # slime keeps the first rollout it started in
    resumed = (await run_rollout(args, buffered))[0][0]
    assert_resumed_exactly(resumed, baseline, masked_before=written)
    assert info(resumed)["resumes"] == 2
    assert info(resumed)["resumed_at"] == [first, written]


# ---- an abort whose one more step ends the turn ---------------------------------------------------------------------
# SGLang's abort runs one more decode step and keeps its token with no stop check (standin/sglang_rules.py), so
# a turn held one token before its end comes back aborted and already ended: with <|im_end|>, with the token that
# completes </search> or </answer>, or with EOS. It must end there, as the engine would have ended it, and never be
# continued past its end.

NO_ACTION_FIRST = {"generate": [NO_ACTION_TURN, XML_SCRIPT[2]]}  # an XML turn that ends on <|im_end|>, not a tag


@pytest.mark.parametrize(
    ("mode", "script", "turn"),
    [
        ("chat", SCRIPTS, 0),
        ("chat", SCRIPTS, 2),
        ("generate", SCRIPTS, 0),
        ("generate", SCRIPTS, 2),
        ("generate", NO_ACTION_FIRST, 0),
    ],
    ids=[
        "chat-call-ends-on-im_end",
        "chat-answer-ends-on-im_end",
        "xml-call-ends-on-search-tag",
        "xml-answer-ends-on-answer-tag",
        "xml-no-action-ends-on-im_end",
    ],
)
async def test_an_abort_whose_one_more_step_ends_the_turn_finishes_it_and_never_goes_past_its_end(
    mode, script, turn, rollout_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = script[mode]
    calls_before = len(engine.calls)
    baseline = await baseline_of(mode, rollout_args, tokenizer)
    uninterrupted = engine.calls[calls_before:]
    args = rollout_args(mode)
    calls_before = len(engine.calls)
    held = len(uninterrupted[turn].output_ids) - 1  # sampled when slime aborts: the abort's step samples the last
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample(mode, tokenizer)]], turn + 1, held, 0)
    aborted_call, ended = engine.calls[calls_before + turn], buffered[0][0]
    assert aborted_call.finish["type"] == "abort" and aborted_call.output_ids == uninterrupted[turn].output_ids
    assert info(ended)["engine_aborts"] == info(ended)["aborts_after_turn_end"] == 1
    if turn == len(script[mode]) - 1:  # the answer: the episode ended with it, slime hands it on as it is
        assert ended.status == Sample.Status.COMPLETED
    elif script is SCRIPTS:  # its call is still to run: slime's abort stopped the episode before the search
        assert ended.status == Sample.Status.ABORTED and resume_point(info(ended))["stage"] == "tool"
    else:  # no action: the invalid-action reply was written, and slime's abort stopped the next turn
        assert ended.status == Sample.Status.ABORTED
        assert (resume_point(info(ended))["turn_index"], resume_point(info(ended))["stage"]) == (turn + 1, "turn")
    done = (await run_rollout(args, buffered))[0][0]
    assert_resumed_exactly(done, baseline)
    assert info(done)["engine_aborts"] == 1
    # one engine request per turn, as without the abort: none asked to continue a turn that had ended
    assert [len(call.input_ids) for call in engine.calls[calls_before:]] == [len(c.input_ids) for c in uninterrupted]


@pytest.mark.parametrize(
    "tracking",
    [{"return_logprob": False}, {"engine_transport": "slime"}],
    ids=["without-log-probs", "through-slimes-post"],
)
@pytest.mark.parametrize("mode", MODES)
async def test_a_turn_an_abort_ended_is_finished_there_in_every_token_tracking_setting(
    mode, tracking, rollout_args, tokenizer, engine, policy, retriever, search_config
):
    search_config.update(tracking)
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    calls_before = len(engine.calls)
    baseline = await baseline_of(mode, rollout_args, tokenizer)
    first_turn = len(engine.calls[calls_before].output_ids)
    args = rollout_args(mode)
    buffered = await rollout_aborted_mid_generation(
        engine, args, [[new_sample(mode, tokenizer)]], 1, first_turn - 1, 0
    )
    assert info(buffered[0][0])["aborts_after_turn_end"] == 1
    assert_resumed_exactly((await run_rollout(args, buffered))[0][0], baseline)


async def test_every_abort_the_engine_answers_is_counted_also_after_a_resumed_turn_ran_past_its_tag(
    rollout_args, tokenizer, engine, policy, retriever
):
    engine.honor_stop_strings = False  # it samples on past </search>: the turn is cut after the tag
    policy.scripts[QUESTION + "?"] = [XML_SCRIPT[0] + " and then <answer> Rome </answer> junk", *XML_SCRIPT[1:]]
    baseline = await baseline_of("generate", rollout_args, tokenizer)
    args = rollout_args("generate")
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample("generate", tokenizer)]], 1, 3, 0)
    # resumed, the turn runs past its tag and is aborted again there: cut after the tag, it is a whole turn
    tag_end = len(tokenizer.encode(XML_SCRIPT[0]))
    buffered = await rollout_aborted_mid_generation(engine, args, buffered, 1, tag_end - 4 + 3, 1)
    assert resume_point(info(buffered[0][0]))["stage"] == "tool"
    done = (await run_rollout(args, buffered))[0][0]
    assert_resumed_exactly(done, baseline)
    assert (info(done)["engine_aborts"], info(done)["aborts_after_turn_end"], info(done)["resumes"]) == (2, 1, 2)


# ---- what does not resume -----------------------------------------------------------------------------------------


async def test_without_partial_rollout_slime_keeps_nothing_and_an_aborted_sample_starts_over(
    rollout_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = XML_SCRIPT
    baseline = await baseline_of("generate", rollout_args, tokenizer)
    args = rollout_args("generate", partial_rollout=False)
    sample = new_sample("generate", tokenizer)
    assert await rollout_aborted_mid_generation(engine, args, [[sample]], 2, 7, 0) == []  # nothing buffered
    assert sample.status == Sample.Status.ABORTED
    assert "resume" not in info(sample)
    assert len(sample.tokens) == len(prompt_ids_of("generate", tokenizer)) + sample.response_length
    restarted = (await run_rollout(args, [[sample]]))[0][0]  # as a retry would: from clean fields
    assert_resumed_exactly(restarted, baseline)
    assert info(restarted)["resumes"] == 0
    assert info(restarted)["resumed_at"] == []


async def test_a_sample_whose_prompt_renders_differently_starts_over(
    rollout_args, tokenizer, engine, policy, retriever, caplog
):
    policy.scripts[QUESTION + "?"] = XML_SCRIPT
    baseline = await baseline_of("generate", rollout_args, tokenizer)
    args = rollout_args("generate")
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample("generate", tokenizer)]], 2, 7, 0)
    buffered[0][0].tokens[0] += 1  # not the prompt's first token any more
    restarted = (await run_rollout(args, buffered))[0][0]
    assert "starts over instead of resuming: its tokens do not start with the prompt's tokens" in caplog.text
    assert_resumed_exactly(restarted, baseline)


# ---- what slime's data buffer keeps -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_the_resume_point_is_plain_data_that_survives_slimes_copies(
    mode, rollout_args, tokenizer, engine, policy, retriever
):
    """slime's buffer keeps the Sample objects; its debug dumps and checkpoints go through to_dict/from_dict."""
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    baseline = await baseline_of(mode, rollout_args, tokenizer)
    args = rollout_args(mode)
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample(mode, tokenizer)]], 2, 7, 0)
    record = info(buffered[0][0])
    assert json.loads(json.dumps(record)) == record  # nothing but JSON types
    copied = Sample.from_dict(copy.deepcopy(buffered[0][0].to_dict()))
    assert_resumed_exactly((await run_rollout(args, [[copied]]))[0][0], baseline)


async def test_the_log_hooks_count_resumed_samples_and_their_earlier_policy_tokens(
    rollout_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = XML_SCRIPT
    args = rollout_args("generate")
    samples = [new_sample("generate", tokenizer) for _ in range(2)]
    samples[1].index = 1
    buffered = await rollout_aborted_mid_generation(engine, args, [samples[:1]], 2, 7, 0)
    earlier = info(buffered[0][0])["generated_tokens"]
    finished = [*(await run_rollout(args, buffered))[0], *(await run_rollout(args, [samples[1:]]))[0]]
    metrics = search_metrics(finished)
    assert metrics["resumed_samples"] == 1
    resumed = info(finished[0])
    assert resumed["earlier_policy_tokens"] == earlier
    assert metrics["resumed_earlier_policy_share"] == pytest.approx(earlier / resumed["generated_tokens"])
    assert 0 < metrics["resumed_earlier_policy_share"] < 1


# ---- any abort point ---------------------------------------------------------------------------------------------

WORDS = ["Paris", "capital", "é", "東京", "🙂", "  ", "\n", "the", "river"]
text = st.lists(st.sampled_from(WORDS), min_size=0, max_size=30).map(" ".join)
xml_turn = st.one_of(
    st.builds(lambda t, q: f"<think>{t}</think>\n<search> {q} </search>", text, text),
    st.builds(lambda t, a: f"<think>{t}</think>\n<answer> {a} </answer>", text, text),
    text,
)
chat_turn = st.one_of(
    st.builds(
        lambda t, q: (
            f"<think>{t}</think>\n<tool_call>\n"
            + json.dumps({"name": "search", "arguments": {"query": q or "x"}}, ensure_ascii=False)
            + "\n</tool_call>"
        ),
        text,
        text,
    ),
    st.builds(lambda t, a: f"<think>{t}</think>\n<answer> {a} </answer>", text, text),
)
# (the engine call from now, tokens it had sampled), or "search": while the next search is in flight
abort_point = st.one_of(st.tuples(st.integers(1, 4), st.integers(0, 40)), st.just("search"))


@settings(
    max_examples=int(os.environ.get("FIDELITY_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    mode=st.sampled_from(MODES),
    xml_turns=st.lists(xml_turn, min_size=1, max_size=4),
    chat_turns=st.lists(chat_turn, min_size=1, max_size=4),
    aborts=st.lists(abort_point, min_size=1, max_size=3),
    budget=st.integers(40, 700),
    masked=st.booleans(),
    honor_stops=st.booleans(),
    non_canonical=st.booleans(),
)
def test_random_episodes_aborted_anywhere_resume_into_the_uninterrupted_episode(
    rollout_args, tokenizer, engine, policy, retriever,
    mode, xml_turns, chat_turns, aborts, budget, masked, honor_stops, non_canonical,
):  # fmt: skip
    policy.scripts = {QUESTION + "?": xml_turns if mode == "generate" else chat_turns}
    engine.honor_stop_strings = honor_stops
    engine.split_every = 2 if non_canonical else 0
    engine.holds.clear()
    retriever.hold = None

    async def scenario():
        try:
            return await episodes()
        finally:
            await slime_compat.close_http_client()  # its connections belong to this example's loop

    async def episodes():
        args = rollout_args(mode, masked=masked, rollout_max_response_len=budget)
        baseline = (await run_rollout(args, [[new_sample(mode, tokenizer)]]))[0][0]
        groups, masked_before, calls_before = [[new_sample(mode, tokenizer)]], None, len(engine.calls)
        for rollout_id, point in enumerate(aborts):
            if point == "search":
                groups = await rollout_aborted_during_a_search(retriever, args, groups, rollout_id)
            else:
                groups = await rollout_aborted_mid_generation(engine, args, groups, *point, rollout_id)
            if groups[0][0].status != Sample.Status.ABORTED:
                event("an abort came after the episode ended")
                break  # it ended before this abort came
            event(f"aborted in stage {resume_point(info(groups[0][0]))['stage']}")
            masked_before = groups[0][0].response_length if masked else None
        engine.holds.clear()
        retriever.hold = None
        resumed = (
            (await run_rollout(args, groups))[0][0] if groups[0][0].status == Sample.Status.ABORTED else groups[0][0]
        )
        return baseline, resumed, masked_before, engine.calls[calls_before:]

    baseline, resumed, masked_before, calls = asyncio.run(scenario())
    assert_resumed_exactly(resumed, baseline, masked_before=masked_before)
    # engine contexts and log probs, with the loss mask as it was before slime's off-policy masking
    assert_faithful(unmasked(resumed, baseline), calls, tokenizer, prompt_ids_of(mode, tokenizer), allow_cut=True)
