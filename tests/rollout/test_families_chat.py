"""Chat mode on every model family, through generate(), on each checkpoint's real tokenizer and official template
(tests/support/model_tokenizers.py), with enable_thinking on and off where the template toggles it.

Each episode is token-exact: the tokens are the prompt's ids, the engine's own ids and the ids of what the template
writes after each assistant turn, nothing re-tokenized, observations at loss mask 0 and log probs aligned; an abort
whose one more step samples the family's own end of turn ends the turn there, and an episode aborted mid-turn
resumes (--partial-rollout) into the uninterrupted one.
"""

import asyncio
import copy
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generate_with_search import generate
from slime.utils.http_utils import init_http_client
from slime.utils.types import Sample
from slime_search_r1.episode import resume_point, version_spans
from slime_search_r1.http_client import close_loop_sessions
from slime_search_r1.protocols import chat
from slime_search_r1.protocols.chat_template import template_messages
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.slime_flags import REWARD_POST_PROCESS_PATH
from slime_search_r1.tools.search import SEARCH_SCHEMA
from slime_search_r1.tokens.engine_rules import model_eos_ids
from support import slime_compat
from support.episodes import CHAT_LABEL, QUESTION, chat_messages, conversation, info, searches
from support.fake_sglang import FakeSGLangEngine
from support.family_cases import CASES
from support.family_chat import call_text, calls_text, thought_text, two_searches_then_answer
from support.fidelity import assert_faithful, assert_resumed_exactly
from support.fully_async_rollouts import fully_async_rollout_of
from support.loopback import serve_in_thread
from support.slime_rollout import router_address, slime_sampling_params
from support.model_tokenizers import checkpoint_dir, load_checkpoint_tokenizer
from support.partial_rollouts import rollout_aborted_mid_generation, run_rollout


@pytest.fixture(params=CASES, ids=[case.id for case in CASES])
def case(request):
    return request.param


@pytest.fixture
def tokenizer_dir(case):
    return str(checkpoint_dir(case.checkpoint))


@pytest.fixture
def tokenizer(case):
    return load_checkpoint_tokenizer(case.checkpoint)


@pytest.fixture
def engine(tokenizer, tokenizer_dir, policy):
    """The test engine serving this checkpoint: its EOS set as SGLang reads it from the checkpoint."""
    engine = FakeSGLangEngine(tokenizer, policy, eos_ids=tuple(model_eos_ids(tokenizer_dir, tokenizer)))
    with serve_in_thread(engine.app) as url:
        engine.url = url
        yield engine


@pytest.fixture
def rollout_args(make_args, search_config, case):
    """slime's args for one chat episode of this case (partial rollout on), 4 turns, a 1024-token response budget."""

    def make(**overrides):
        search_config.update(llm_api_mode="chat", max_turns=4)
        args = make_args(
            **{
                "partial_rollout": True,
                "rollout_max_response_len": 1024,
                "apply_chat_template_kwargs": dict(case.template_kwargs),
                **overrides,
            }
        )
        init_http_client(args)
        slime_compat.reset_generate_state()
        return args

    return make


def new_sample() -> Sample:
    return Sample(
        prompt=chat_messages(), label=CHAT_LABEL, index=0, group_index=0, metadata={"tools": [SEARCH_SCHEMA]}
    )


def render(tokenizer, case, messages, add_generation_prompt=True) -> str:
    return tokenizer.apply_chat_template(
        template_messages(messages),  # tool-call arguments as objects, as SGLang hands them to a template
        tools=[SEARCH_SCHEMA],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **case.template_kwargs,
    )


def scripted(case, tokenizer, policy) -> list[int]:
    """The prompt's ids; the policy writes the family's two searches and answer."""
    prompt = render(tokenizer, case, chat_messages())
    policy.scripts[QUESTION + "?"] = two_searches_then_answer(case.family, prompt)
    return tokenizer.encode(prompt, add_special_tokens=False)


def observations(sample: Sample, prompt_ids: list[int]) -> list[list[int]]:
    """The runs of response ids at loss mask 0."""
    runs, run = [], []
    for token, mask in zip(sample.tokens[len(prompt_ids) :], sample.loss_mask, strict=True):
        if mask:
            if run:
                runs.append(run)
            run = []
        else:
            run.append(token)
    return runs + ([run] if run else [])


async def test_an_episode_is_token_exact_with_the_templates_own_observations(
    case, rollout_args, tokenizer, engine, policy, retriever
):
    prompt_ids = scripted(case, tokenizer, policy)
    done = (await run_rollout(rollout_args(), [[new_sample()]]))[0][0]
    assert (done.status, info(done)["finish_reason"], searches(done)) == (Sample.Status.COMPLETED, "answer", 2)
    assert retriever.queries == ["capital of France", "Paris France capital city"]
    assert info(done)["invalid_actions"] == 0
    assert_faithful(done, engine.calls, tokenizer, prompt_ids, canonical_observations=True)
    # each observation is what the template writes after the model's turn: its end of turn (the part the model did
    # not write), the tool message, the next generation prompt
    messages = [*chat_messages(), *conversation(done)]
    replies = observations(done, prompt_ids)
    assert len(replies) == 2
    for reply, upto in zip(replies, (4, 6), strict=True):
        assert render(tokenizer, case, messages[:upto]).endswith(tokenizer.decode(reply, skip_special_tokens=False))
    # the thoughts stay as the model wrote them, token for token
    first_turn = engine.calls[0].output_ids
    assert done.tokens[len(prompt_ids) : len(prompt_ids) + len(first_turn)] == first_turn


async def test_the_family_is_read_from_the_template_or_named_by_the_setting(
    case, rollout_args, tokenizer, engine, policy, retriever, search_config
):
    scripted(case, tokenizer, policy)
    auto = (await run_rollout(rollout_args(), [[new_sample()]]))[0][0]
    search_config["model_family"] = case.family.name
    named = (await run_rollout(rollout_args(), [[new_sample()]]))[0][0]
    assert named.tokens == auto.tokens and searches(named) == 2


async def test_an_abort_whose_one_more_step_samples_the_end_of_turn_ends_the_turn_there(
    case, rollout_args, tokenizer, engine, policy, retriever
):
    prompt_ids = scripted(case, tokenizer, policy)
    baseline = (await run_rollout(rollout_args(), [[new_sample()]]))[0][0]
    uninterrupted = list(engine.calls)
    end_of_turn = uninterrupted[0].output_ids[-1]  # the family's own: <|im_end|>, <|eot_id|>
    assert end_of_turn == tokenizer.convert_tokens_to_ids("<|eot_id|>" if "llama" in case.checkpoint else "<|im_end|>")
    args, calls_before = rollout_args(), len(engine.calls)
    held = len(uninterrupted[0].output_ids) - 1  # the abort's one more step samples the end of turn
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample()]], 1, held, 0)
    ended = buffered[0][0]
    assert engine.calls[calls_before].finish["type"] == "abort"
    assert info(ended)["engine_aborts"] == info(ended)["aborts_after_turn_end"] == 1
    assert resume_point(info(ended))["stage"] == "tool"  # the turn ended; its call is still to run
    done = (await run_rollout(args, buffered))[0][0]
    assert_resumed_exactly(done, baseline)
    assert [len(call.input_ids) for call in engine.calls[calls_before:]] == [len(c.input_ids) for c in uninterrupted]
    assert_faithful(done, engine.calls[calls_before:], tokenizer, prompt_ids)


@pytest.mark.parametrize("turn", [0, 2], ids=["in-a-call", "in-the-answer"])
async def test_an_episode_aborted_mid_turn_resumes_into_the_uninterrupted_one(
    turn, case, rollout_args, tokenizer, engine, policy, retriever
):
    prompt_ids = scripted(case, tokenizer, policy)
    baseline = (await run_rollout(rollout_args(), [[new_sample()]]))[0][0]
    args, calls_before = rollout_args(), len(engine.calls)
    buffered = await rollout_aborted_mid_generation(engine, args, [[new_sample()]], turn + 1, 5, 0)
    assert buffered[0][0].status == Sample.Status.ABORTED
    assert resume_point(info(buffered[0][0]))["stage"] == "turn"
    resumed = (await run_rollout(args, copy.deepcopy(buffered)))[0][0]
    assert_resumed_exactly(resumed, baseline)
    assert_faithful(resumed, engine.calls[calls_before:], tokenizer, prompt_ids)
    assert info(resumed)["resumes"] == 1


async def test_a_call_in_another_familys_format_is_an_invalid_action_with_its_reason(
    case, rollout_args, tokenizer, engine, policy, retriever
):
    foreign = next(other for other in (c.family for c in CASES) if other.read_calls is not case.family.read_calls)
    scripted(case, tokenizer, policy)
    answer = policy.scripts[QUESTION + "?"][-1]
    policy.scripts[QUESTION + "?"] = [call_text(foreign, "capital of France"), answer]
    done = (await run_rollout(rollout_args(), [[new_sample()]]))[0][0]
    assert done.status == Sample.Status.COMPLETED  # the episode went on to its answer
    assert (info(done)["invalid_actions"], searches(done), retriever.queries) == (1, 0, [])
    (unread,) = conversation(done)[0]["unparsable_tool_calls"]
    assert f"which this model's family ({case.family.name}) does not write" in unread["error"]


ONE_CALL_CASES = [case for case in CASES if case.family.calls_per_turn == 1]


@pytest.mark.parametrize("case", ONE_CALL_CASES, ids=lambda case: case.id)
async def test_two_calls_in_a_turn_whose_template_renders_one_are_an_invalid_action_with_its_reason(
    case, rollout_args, tokenizer, engine, policy, retriever
):
    """Llama 3.2's template raises on an assistant turn with two calls: the turn runs neither, the model is told
    it made no usable call, and the episode goes on token-exactly to its answer."""
    prompt_ids = scripted(case, tokenizer, policy)
    answer = policy.scripts[QUESTION + "?"][-1]
    both = calls_text(case.family, ["capital of France", "France capital"])
    policy.scripts[QUESTION + "?"] = [both, call_text(case.family, "Paris France capital city"), answer]
    done = (await run_rollout(rollout_args(), [[new_sample()]]))[0][0]
    assert (done.status, info(done)["finish_reason"]) == (Sample.Status.COMPLETED, "answer")
    assert (info(done)["invalid_actions"], retriever.queries) == (1, ["Paris France capital city"])
    refused, hint = conversation(done)[:2]
    assert "tool_calls" not in refused
    (unread,) = refused["unparsable_tool_calls"]
    assert unread["text"] == both and "2 tool calls in one turn" in unread["error"]
    assert hint["role"] == "user" and "neither a search tool call nor a final answer" in hint["content"]
    assert_faithful(done, engine.calls, tokenizer, prompt_ids, canonical_observations=True)


@pytest.mark.parametrize("case", ONE_CALL_CASES, ids=lambda case: case.id)
async def test_a_template_refusing_a_follow_up_ends_that_sample_failed_saying_why(
    case, rollout_args, tokenizer, engine, policy, retriever, monkeypatch
):
    """A family that lets through what its template refuses (Llama's without its one-call limit): the template's
    error ends the sample FAILED with template_error in its record, and generate() returns."""
    unlimited = replace(case.family, calls_per_turn=None)
    monkeypatch.setattr(chat, "tokenizer_family", lambda name, tokenizer: unlimited)
    scripted(case, tokenizer, policy)
    answer = policy.scripts[QUESTION + "?"][-1]
    both = calls_text(case.family, ["capital of France", "France capital"])
    policy.scripts[QUESTION + "?"] = [both, call_text(case.family, "Paris"), answer]
    done = (await run_rollout(rollout_args(), [[new_sample()]]))[0][0]
    assert (done.status, info(done)["finish_reason"], done.remove_sample) == (
        Sample.Status.FAILED,
        "template_error",
        True,
    )
    assert "only supports single tool-calls" in info(done)["template_error"]
    assert info(done)["turns"] == 1 and len(engine.calls) == 1


async def test_router_radix_is_token_exact_too(
    case, rollout_args, router, tokenizer, engine, policy, retriever, search_config
):
    prompt_ids = scripted(case, tokenizer, policy)
    manual = (await run_rollout(rollout_args(), [[new_sample()]]))[0][0]
    calls_before = len(engine.calls)
    search_config["token_tracking_mode"] = "router_radix"
    args = rollout_args(partial_rollout=False, **router_address(router.url))
    radix = (await run_rollout(args, [[new_sample()]]))[0][0]
    assert (radix.tokens, radix.loss_mask) == (manual.tokens, manual.loss_mask)
    assert_faithful(radix, engine.calls[calls_before:], tokenizer, prompt_ids)


@pytest.mark.parametrize("case", [case for case in CASES if case.family.rewrites_history], ids=lambda case: case.id)
async def test_router_handler_is_refused_at_a_sample_for_a_template_that_rewrites_history(
    case, rollout_args, tokenizer, engine, policy, search_config
):
    search_config["token_tracking_mode"] = "router_handler"
    with pytest.raises(ConfigError, match=f"the {case.family.name} family's template .* rewrites earlier"):
        await generate(rollout_args(partial_rollout=False), new_sample(), slime_sampling_params(256))


# ---- any episode --------------------------------------------------------------------------------------------------

WORDS = ["Paris", "capital", "é", "東京", "🙂", "  ", "\n", "the", '"quoted"', "<|im_end|>", "<|eot_id|>", "</think>"]
words = st.lists(st.sampled_from(WORDS), min_size=0, max_size=12).map(" ".join)
DOCS = st.lists(
    st.builds(lambda title, body: f'"{title}"\n{body}', words, words.map(lambda w: w + " .\n")), min_size=1, max_size=4
)


def family_turn(family, foreign, prompt_text):
    """A turn as the family's model might write it: a thought and a call, a bare call, two calls, an answer, a call in
    another family's format, a broken call, plain text."""
    think = st.builds(lambda t: thought_text(family, prompt_text, t), words)
    query = words.map(lambda q: q.strip() or "x")
    return st.one_of(
        st.builds(lambda t, q: t + call_text(family, q), think, query),
        st.builds(lambda q: call_text(family, q), query),
        st.builds(lambda a, b: calls_text(family, [a, b]), query, query),
        st.builds(lambda t, a: f"{t}<answer> {a} </answer>", think, words),
        st.builds(lambda q: call_text(foreign, q), query),
        st.builds(lambda q: call_text(family, q)[:-7], query),
        words,
    )


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), corpus=DOCS, budget=st.integers(24, 600), max_turns=st.integers(1, 4))
def test_any_episode_of_the_family_is_token_exact(
    case, make_args, tokenizer, engine, policy, retriever, search_config, data, corpus, budget, max_turns
):
    prompt = render(tokenizer, case, chat_messages())
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    foreign = next(other for other in (c.family for c in CASES) if other.read_calls is not case.family.read_calls)
    turns = data.draw(st.lists(family_turn(case.family, foreign, prompt), min_size=1, max_size=4))
    policy.scripts = {QUESTION + "?": turns}
    engine.calls.clear()
    retriever.docs = [{"id": str(i), "contents": c} for i, c in enumerate(corpus)]
    search_config.update(llm_api_mode="chat", max_turns=max_turns)
    args = make_args(apply_chat_template_kwargs=dict(case.template_kwargs))

    async def episode():
        try:
            return await generate(args, new_sample(), slime_sampling_params(budget))
        finally:
            await close_loop_sessions()

    sample = asyncio.run(episode())
    assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids, canonical_observations=True)


FULLY_ASYNC = dict(
    rollout_function_path="slime.rollout.fully_async_rollout.generate_rollout_fully_async",
    rollout_batch_size=1,
    rollout_global_dataset=True,
    prompt_data=None,
    buffer_filter_path=None,
    rollout_shuffle=False,
    custom_reward_post_process_path=REWARD_POST_PROCESS_PATH,
)


async def test_a_turn_a_weight_update_cut_in_fully_async_training_resumes_token_exactly(
    case, rollout_args, tokenizer, engine, policy, retriever
):
    prompt_ids = scripted(case, tokenizer, policy)
    baseline = (await fully_async_rollout_of(rollout_args(**FULLY_ASYNC), [new_sample()]))[0][0]
    args, calls_before = rollout_args(**FULLY_ASYNC), len(engine.calls)
    pause = engine.pause_at(calls_before + 2, 5)  # slime's weight update, 5 tokens into the second turn
    sample = (await fully_async_rollout_of(args, [new_sample()]))[0][0]
    assert pause.aborted and (pause.version_before, pause.version_after) == ("1", "2")
    assert_resumed_exactly(sample, baseline)
    assert_faithful(sample, engine.calls[calls_before:], tokenizer, prompt_ids)
    assert [version for _, _, version in version_spans(info(sample))] == ["1", "1", "2", "2"]
