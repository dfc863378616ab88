"""What SGLang's engine really answers, through generate() in both protocols (standin/sglang_rules.py holds the
rules, each with its version and source file): the two versions' finish orders at the last allowed token, an EOS
inside a speculative run, a base model's EOS set, a request aborted while it waited, weight-version spans when the
weights change under a running request, and answers nothing can be trained on (a null log prob, a body that is not
JSON, ids and log probs that disagree), which end their sample FAILED and never the batch. The abort that already
ended its turn is in test_partial_rollout.py and test_fully_async.py (slime's rollout and its fully-async worker)."""

import asyncio

import pytest

from generate_with_search import generate
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.slime_flags import REWARD_POST_PROCESS_PATH
from support.episodes import (
    ANSWER,
    MODE_IDS,
    MODES,
    QUESTION,
    SEARCH,
    info,
    run_episode,
    sample_for,
    searches,
)
from support.fake_sglang import BASE_MODEL_EOS
from slime_search_r1.standin.sglang_rules import SGLANG_0_5_23, VERSIONS
from support.slime_rollout import slime_sampling_params

IM_END, END_OF_TEXT = 151645, 151643
INSTRUCT_MODEL_EOS = (IM_END, END_OF_TEXT)  # Qwen2.5-3B-Instruct's generation_config
NO_ACTION = {"generate": "I think it is Paris.", "chat": "I think it is Paris."}


def trajectory_of(sample: Sample) -> tuple:
    """What training reads of a sample, and how its episode ended."""
    record = info(sample)
    return (
        sample.status,
        sample.tokens,
        sample.loss_mask,
        sample.rollout_log_probs,
        sample.response,
        record["finish_reason"],
        record["turns"],
        searches(sample),
    )


# ---- where a turn ends ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_both_sglang_versions_end_a_turn_on_its_last_allowed_token_alike(
    mode, make_args, tokenizer, engine, policy, search_config
):
    """The token that completes a call's end is the last the budget allows: 0.5.15.post1 checks length first and says
    length, 0.5.23 checks stops first and says stop. The episode is the same: budget used up, the call not run."""
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    await run_episode(mode, make_args, tokenizer, search_config)
    budget = len(engine.calls[-2].output_ids)  # the search turn's tokens, its end included
    episodes, finishes = [], []
    for version in VERSIONS:
        engine.version = version
        episodes.append(await run_episode(mode, make_args, tokenizer, search_config, budget=budget))
        finishes.append(engine.calls[-1].finish["type"])
    assert finishes == ["length", "stop"]  # what each version said
    first, second = (trajectory_of(episode.sample) for episode in episodes)
    assert first == second
    assert first[0] == Sample.Status.TRUNCATED and first[5] == "token_budget" and first[7] == 0


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_an_eos_inside_a_speculative_run_ends_the_turn_where_the_eos_is(
    mode, make_args, tokenizer, engine, policy, search_config
):
    """With speculative decoding a stop string completed later in one accepted run wins over an EOS before it, so
    the EOS stays inside the answer; the turn ends at the EOS, as it does without speculative decoding."""
    policy.scripts[QUESTION + "?"] = ["Not sure.<|im_end|> Then <answer> Rome </answer>", ANSWER[mode]]
    search_config.update(llm_api_mode=mode)
    args = make_args()
    params = {**slime_sampling_params(1024), "stop": ["</answer>"]}  # slime's --rollout-stop, in chat mode too
    episodes = []
    for run in (1, 64):
        engine.speculative_run = run
        calls_before = len(engine.calls)
        episodes.append(await generate(args, sample_for(mode, tokenizer)[0], dict(params)))
        first_turn = engine.calls[calls_before]
        assert (IM_END in first_turn.output_ids[:-1]) is (run > 1)  # the engine kept tokens after its EOS
    assert trajectory_of(episodes[0]) == trajectory_of(episodes[1])
    assert "Rome" not in episodes[1].response


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_a_turn_ends_at_im_end_whether_a_base_or_an_instruct_model_serves_it(
    mode, make_args, tokenizer, engine, policy, search_config
):
    """The base Qwen2.5-3B's EOS set is <|endoftext|> alone: <|im_end|> ends a turn only because the request says so,
    in both protocols (the scripted model writes on past <|im_end|> when nothing stops it)."""
    policy.scripts[QUESTION + "?"] = [NO_ACTION[mode], ANSWER[mode]]
    episodes = []
    for eos in (BASE_MODEL_EOS, INSTRUCT_MODEL_EOS):
        engine.eos_ids = eos
        episodes.append(await run_episode(mode, make_args, tokenizer, search_config))
        for call in engine.calls_for(episodes[-1].prompt_ids):
            assert {IM_END, tokenizer.eos_token_id} <= set(call.sampling_params["stop_token_ids"])
            assert call.output_ids[-1] in (IM_END, *tokenizer.encode("</answer>"))
    assert trajectory_of(episodes[0].sample) == trajectory_of(episodes[1].sample)
    assert "Thank you" not in episodes[0].sample.response  # what the model writes when nothing stops it


# ---- what an answer says of itself ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_a_request_aborted_while_it_waited_ends_the_episode_aborted(
    mode, version, make_args, tokenizer, engine, policy, search_config
):
    """No tokens and no prompt_tokens (managers/tokenizer_manager.py _handle_abort_req): accepted, counted."""
    policy.scripts[QUESTION + "?"] = [ANSWER[mode]]
    engine.version, engine.aborted = version, True
    episode = await run_episode(mode, make_args, tokenizer, search_config)
    assert "prompt_tokens" not in engine.calls[-1].meta_info
    assert episode.sample.status == Sample.Status.ABORTED and episode.sample.response_length == 0
    assert (info(episode.sample)["finish_reason"], info(episode.sample)["engine_aborts"]) == ("engine_abort", 1)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_each_token_carries_the_version_that_sampled_it_when_the_weights_change_under_it(
    mode, version, make_args, tokenizer, engine, policy, search_config
):
    """A pause that does not abort (in_place, retract) lets a request run on under new weights: 0.5.23 says which
    tokens each version sampled (meta_info.weight_versions), 0.5.15.post1 only the newest. The record, the lag mask
    and the staleness metrics follow what the engine says, token by token where it says it."""
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], ANSWER[mode]]
    search_config.update(max_version_lag=0)
    engine.version = version
    calls_before = len(engine.calls)
    pause = engine.pause_at(calls_before + 2, 4, mode="in_place")  # the answer turn, 4 tokens in
    episode = await run_episode(
        mode, make_args, tokenizer, search_config, custom_reward_post_process_path=REWARD_POST_PROCESS_PATH
    )
    sample, (search_call, answer_call) = episode.sample, engine.calls[calls_before:]
    assert pause.split and (pause.version_before, pause.version_after) == ("1", "2")
    search_span = [0, len(search_call.output_ids)]
    answer_start = len(answer_call.input_ids) - len(episode.prompt_ids)
    answer_end = answer_start + len(answer_call.output_ids)
    if version == SGLANG_0_5_23:
        spans = [[*search_span, "1"], [answer_start, answer_start + 4, "1"], [answer_start + 4, answer_end, "2"]]
    else:  # the whole answer is stamped with the newest version, which is all 0.5.15.post1 says
        spans = [[*search_span, "1"], [answer_start, answer_end, "2"]]
    assert info(sample)["versions"] == spans
    # the lag mask (0 versions allowed) took every token of version 1 out of the loss, their log probs kept (the
    # engine's are all below 0; an observation's is 0.0)
    old = [position for start, end, number in spans if number == "1" for position in range(start, end)]
    sampled_out_of_the_loss = [
        position
        for position, (kept, log_prob) in enumerate(zip(sample.loss_mask, sample.rollout_log_probs, strict=True))
        if not kept and log_prob < 0
    ]
    assert sampled_out_of_the_loss == old and info(sample)["lag_masked_tokens"] == len(old)


# ---- answers nothing can be trained on ---------------------------------------------------------------------------


def drop_last_log_prob(body: dict) -> dict:
    body["meta_info"]["output_token_logprobs"] = body["meta_info"]["output_token_logprobs"][:-1]
    return body


PROBLEMS = {
    "null log prob": (lambda engine: engine.null_log_prob_at.__setitem__(len(engine.calls) + 1, 2), "is null"),
    "not JSON": (lambda engine: engine.fail_next(1, body="<html>busy</html>"), "did not answer with JSON"),
    "ids and log probs disagree": (
        lambda engine: setattr(engine, "rewrite_next", drop_last_log_prob),
        "output_token_logprobs that disagree",
    ),
}


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_an_answer_nothing_can_be_trained_on_fails_its_sample_and_not_the_batch(
    mode, problem, make_args, tokenizer, engine, policy, search_config
):
    """Through slime's own rollout of a group of two: the sample that met the answer ends FAILED with the reason in
    its record (and out of the loss), its sibling finishes, and slime scores both."""
    policy.scripts[QUESTION + "?"] = [ANSWER[mode]]
    search_config.update(llm_api_mode=mode)
    args = make_args(n_samples_per_prompt=2)
    group = [sample_for(mode, tokenizer)[0] for _ in range(2)]
    for index, sample in enumerate(group):
        sample.index, sample.group_index = index, 0
    arrange, reason = PROBLEMS[problem]
    arrange(engine)
    state = GenerateState(args)
    state.submit_generate_tasks([group])
    (done,) = await asyncio.gather(*state.pendings)
    state.reset()
    failed = [sample for sample in done if sample.status == Sample.Status.FAILED]
    assert len(failed) == 1 and info(failed[0])["finish_reason"] == "engine_error"
    assert reason in info(failed[0])["engine_error"] and failed[0].remove_sample
    (finished,) = [sample for sample in done if sample is not failed[0]]
    assert finished.status == Sample.Status.COMPLETED and finished.reward is not None
    assert failed[0].reward is not None  # slime scores a FAILED sample (an ABORTED one it would not)
