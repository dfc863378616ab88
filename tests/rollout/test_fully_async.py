"""Fully-async training (train_async.py with slime's generate_rollout_fully_async): slime's AsyncRolloutWorker keeps
a pool of groups in flight across training steps, each run by generate_and_rm_group -> generate_and_rm ->
generate(). slime never calls abort() there: a weight update pauses the engines (/pause_generation in SGLang's
default "abort" mode), which answer what is in flight with finish_reason abort, and the worker puts a group holding
an ABORTED sample back in its data buffer to run again.

slime's own worker and data buffer run here (SLIME_SRC; the stand-in's, written from slime's source, otherwise). The
test engine brings a weight update at a chosen request (FakeSGLangEngine.pause_at: that request and everything held
answer abort, then the version moves on), or between two turns (push_weights, while a search is held); every answer
carries its weight_version. Nothing here waits on time: the rollout returns when slime's worker has the groups.
"""

import asyncio
import copy
import json
from argparse import Namespace

import pytest

from slime.rollout.fully_async_rollout import generate_rollout_fully_async
from slime.utils.types import Sample
from slime_search_r1.episode import (
    ENGINE_VERSIONS,
    part_spans,
    token_versions,
    version_number,
    version_spans,
)
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config, search_r1_configs
from slime_search_r1.slime_flags import REWARD_POST_PROCESS_PATH
from slime_search_r1.tokens.manual import Trajectory
from slime_search_r1.training.metrics import TRAIN_PREFIX, search_metrics
from slime_search_r1.training.advantages import post_process_rewards
from slime_search_r1.training.staleness import lagging_spans, mask_lagging_tokens, staleness_metrics
from slime_search_r1.viewer.page import versions_view
from support import slime_compat
from support.episodes import (
    CHAT_LABEL,
    QUESTION,
    TWO_SEARCHES_THEN_ANSWER,
    chat_messages,
    chat_prompt_ids,
    info,
    label,
)
from support.fidelity import assert_resumed_exactly
from support.fully_async_rollouts import PromptsOnce, fully_async_rollout_of, fully_async_worker
from support.slime_rollout import chat_prompt, log_rollout_data
from support.tracking import record_tracking

FULLY_ASYNC = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
SCRIPTS = TWO_SEARCHES_THEN_ANSWER
XML_SCRIPT = SCRIPTS["generate"]
CUT_AFTER = 7  # tokens the interrupted turn had sampled when the weight update came
ABORT_STEP = 1  # the one more decode step an abort runs, its token kept unchecked (SGLang's scheduler, to_finish)


# ---- slime's fully-async rollout, driven as train_async.py drives it ------------------------------------------------


@pytest.fixture
def async_args(make_args, search_config):
    """slime's args for fully-async training of one prompt: 4 turns, a 1024-token response budget."""

    def make(mode: str, *, partial: bool = True, masked: bool = False, group: int = 1, **config):
        search_config.update(llm_api_mode=mode, max_turns=4, **config)
        args = make_args(
            rollout_function_path=FULLY_ASYNC,
            partial_rollout=partial,
            mask_offpolicy_in_partial_rollout=masked,
            n_samples_per_prompt=group,
            rollout_batch_size=1,
            rollout_global_dataset=True,
            prompt_data=None,
            buffer_filter_path=None,
            rollout_shuffle=False,
            custom_reward_post_process_path=REWARD_POST_PROCESS_PATH,  # as run_qwen2.5_3B.sh passes it
        )
        slime_compat.reset_generate_state()
        return args

    return make


def new_sample(mode: str, tokenizer) -> Sample:
    if mode == "chat":
        return Sample(prompt=chat_messages(), label=CHAT_LABEL)
    return Sample(prompt=chat_prompt(tokenizer, QUESTION), label=label("Paris"))


def prompt_length(mode: str, tokenizer) -> int:
    if mode == "chat":
        return len(chat_prompt_ids(tokenizer, chat_messages()))
    return len(tokenizer.encode(chat_prompt(tokenizer, QUESTION), add_special_tokens=False))


async def baseline_of(async_args, mode: str, tokenizer, **config) -> Sample:
    """The episode no weight update interrupts (the same scripted policy)."""
    groups = await fully_async_rollout_of(async_args(mode, **config), [new_sample(mode, tokenizer)])
    return groups[0][0]


def spans_of_calls(calls, prompt_tokens: int) -> list[list]:
    """[start, end, weight version] of each engine call that sampled tokens, in response positions."""
    starts = [(len(call.input_ids) - prompt_tokens, call) for call in calls if call.output_ids]
    return [[start, start + len(call.output_ids), call.weight_version] for start, call in starts]


def assert_spans_cover_the_generated_tokens(sample: Sample, baseline: Sample) -> None:
    """The spans sit exactly on the tokens the model generated (loss mask 1 in the uninterrupted episode: strict
    mode), in order, and add up to them; every other response token has no version."""
    spans = version_spans(info(sample))
    assert [start for start, _, _ in spans] == sorted(start for start, _, _ in spans)
    assert sum(end - start for start, end, _ in spans) == info(sample)["generated_tokens"] == sum(baseline.loss_mask)
    versions = token_versions(info(sample), sample.response_length)
    assert [version is not None for version in versions] == [bool(m) for m in baseline.loss_mask]


# ---- a weight update in the middle of a turn ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "masked", "log_probs"),
    [
        ("generate", False, True),
        ("generate", True, True),
        ("chat", False, True),
        ("chat", True, True),
        ("generate", False, False),
    ],
    ids=["xml", "xml-off-policy-masked", "chat", "chat-off-policy-masked", "xml-no-log-probs"],
)
async def test_a_turn_cut_by_a_weight_update_resumes_token_exactly_with_partial_rollout(
    mode, masked, log_probs, async_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    baseline = await baseline_of(async_args, mode, tokenizer, return_logprob=log_probs)
    args = async_args(mode, masked=masked, return_logprob=log_probs)
    calls_before = len(engine.calls)
    pause = engine.pause_at(calls_before + 2, CUT_AFTER)  # the second turn, CUT_AFTER tokens in
    sample = (await fully_async_rollout_of(args, [new_sample(mode, tokenizer)]))[0][0]

    assert pause.reached.is_set() and pause.aborted
    assert (pause.version_before, pause.version_after) == ("1", "2")
    calls = engine.calls[calls_before:]
    # response tokens before the update
    cut = len(calls[1].input_ids) - prompt_length(mode, tokenizer) + CUT_AFTER + ABORT_STEP
    assert_resumed_exactly(sample, baseline, masked_before=cut if masked else None)
    record = info(sample)
    assert (record["resumes"], record["resumed_at"], record["engine_aborts"], record["restarts"]) == (1, [cut], 1, 0)

    # one span per engine call, with the version that sampled it; the cut turn is two spans
    spans = spans_of_calls(calls, prompt_length(mode, tokenizer))
    assert record["versions"] == spans
    assert [version for _, _, version in spans] == ["1", "1", "2", "2"]
    assert spans[1][1] == spans[2][0] == cut
    assert_spans_cover_the_generated_tokens(sample, baseline)
    assert json.loads(json.dumps(record)) == record  # plain JSON: slime's buffer, dumps and to_dict keep it

    # the log hooks count the abort from the engine's answer (slime's abort flag never turned true)
    metrics = search_metrics([sample])
    assert (metrics["engine_aborts/mean"], metrics["engine_aborted_share"], metrics["restarted_share"]) == (1, 1, 0)
    assert (metrics["versions/lag/max"], metrics["versions/mixed_share"]) == (1, 1.0)
    trained_old = 0 if masked else cut - sum(1 - m for m in baseline.loss_mask[:cut])  # model tokens before the cut
    assert metrics["versions/stale_trained_token_share"] == pytest.approx(trained_old / sum(sample.loss_mask))


@pytest.mark.parametrize("partial", [True, False], ids=["partial-rollout", "no-partial-rollout"])
@pytest.mark.parametrize(("mode", "turn"), [("chat", 0), ("chat", 2), ("generate", 0), ("generate", 2)])
async def test_a_weight_update_one_token_before_a_turns_end_finishes_the_turn_there(
    partial, mode, turn, async_args, tokenizer, engine, policy, retriever
):
    """slime pauses the engines (abort mode) one token before a turn's end: the abort's one more step samples that
    last token (<|im_end|>, or the one completing </search> or </answer>). The turn ends there as the engine would
    have ended it, and the episode goes on under the new weights, whatever --partial-rollout says: nothing is
    resumed, nothing started over, and the reward is the uninterrupted episode's."""
    policy.scripts[QUESTION + "?"] = SCRIPTS[mode]
    calls_before = len(engine.calls)
    baseline = await baseline_of(async_args, mode, tokenizer, partial=partial)
    uninterrupted = engine.calls[calls_before:]
    args = async_args(mode, partial=partial)
    calls_before = len(engine.calls)
    pause = engine.pause_at(calls_before + turn + 1, len(uninterrupted[turn].output_ids) - 1)
    sample = (await fully_async_rollout_of(args, [new_sample(mode, tokenizer)]))[0][0]

    assert pause.aborted and engine.calls[calls_before + turn].finish["type"] == "abort"
    assert_resumed_exactly(sample, baseline)
    assert sample.reward == baseline.reward == 1.0
    record = info(sample)
    assert (record["engine_aborts"], record["aborts_after_turn_end"], record["resumes"], record["restarts"]) == (
        1,
        1,
        0,
        0,
    )
    assert len(engine.calls) - calls_before == len(uninterrupted)  # no request went on past a turn's end
    metrics = search_metrics([sample])
    assert (metrics["engine_aborts/mean"], metrics["aborts_after_turn_end/mean"]) == (1, 1)
    # the turn's tokens, its last one included, were sampled before the update; the turns after it, after
    assert [version for _, _, version in version_spans(record)] == ["1"] * (turn + 1) + ["2"] * (2 - turn)


async def test_without_partial_rollout_a_restarted_episode_holds_only_versions_from_after_the_restart(
    async_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = XML_SCRIPT
    baseline = await baseline_of(async_args, "generate", tokenizer, partial=False)
    args = async_args("generate", partial=False)
    pause = engine.pause_at(len(engine.calls) + 2, CUT_AFTER)
    sample = (await fully_async_rollout_of(args, [new_sample("generate", tokenizer)]))[0][0]

    assert pause.aborted
    assert_resumed_exactly(sample, baseline)  # started over from clean fields: the policy is deterministic
    record = info(sample)
    assert {version for _, _, version in version_spans(record)} == {"2"}
    assert record["versions"] == [[start, end, "2"] for start, end, _ in version_spans(info(baseline))]
    assert (record["resumes"], record["engine_aborts"], record["restarts"]) == (0, 1, 1)
    assert_spans_cover_the_generated_tokens(sample, baseline)
    metrics = search_metrics([sample])
    assert (metrics["engine_aborted_share"], metrics["restarted_share"], metrics["versions/lag/max"]) == (1, 1, 0)
    assert metrics["versions/stale_trained_token_share"] == 0.0


async def test_a_weight_update_while_a_search_runs_changes_the_version_between_turns(
    async_args, tokenizer, engine, policy, retriever
):
    """Nothing is in flight at the engine, so nothing is aborted: the next turn is simply sampled by the new policy,
    and only the versions say so."""
    policy.scripts[QUESTION + "?"] = XML_SCRIPT
    args = async_args("generate")
    calls_before = len(engine.calls)
    hold = retriever.hold_next()
    buffer = PromptsOnce(args, [new_sample("generate", tokenizer)])
    with fully_async_worker(args, buffer):
        rollout = asyncio.ensure_future(asyncio.to_thread(generate_rollout_fully_async, args, 0, buffer))
        await asyncio.to_thread(hold.reached.wait)
        assert engine.push_weights() == "2"
        hold.release()
        sample = (await rollout)[0][0]

    record = info(sample)
    assert sample.status == Sample.Status.COMPLETED
    assert record["versions"] == spans_of_calls(engine.calls[calls_before:], prompt_length("generate", tokenizer))
    assert [version for _, _, version in version_spans(record)] == ["1", "2", "2"]
    assert record["engine_aborts"] == 0
    first_turn = record["versions"][0][1]
    metrics = search_metrics([sample])
    assert (metrics["versions/newest"], metrics["versions/lag/max"], metrics["engine_aborted_share"]) == (2, 1, 0)
    assert metrics["versions/stale_trained_token_share"] == pytest.approx(first_turn / sum(sample.loss_mask))


@pytest.mark.parametrize("masked", [False, True], ids=["kept", "off-policy-masked"])
async def test_a_group_put_back_for_one_cut_sample_keeps_its_finished_sibling(
    masked, async_args, tokenizer, engine, policy, retriever
):
    """slime puts the whole group back; the sibling that had finished comes back as it was, except that slime's
    --mask-offpolicy-in-partial-rollout masks every response it finds in the group, the finished one's too."""
    policy.scripts[QUESTION + "?"] = XML_SCRIPT
    baseline = await baseline_of(async_args, "generate", tokenizer)
    args = async_args("generate", masked=masked, group=2)
    pause = engine.pause_at(len(engine.calls) + 3, 5)  # whichever sample's turn it is: every turn is longer
    group = (await fully_async_rollout_of(args, [new_sample("generate", tokenizer)]))[0]

    assert pause.aborted
    assert sorted(info(sample)["engine_aborts"] for sample in group) == [0, 1]
    for sample in group:
        assert sample.tokens == baseline.tokens
        assert sample.rollout_log_probs == baseline.rollout_log_probs
        assert sample.reward == baseline.reward
    finished_first = next(sample for sample in group if info(sample)["engine_aborts"] == 0)
    assert finished_first.loss_mask == ([0] * baseline.response_length if masked else baseline.loss_mask)


# ---- the lag mask ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_lag", [0, 1])
async def test_the_lag_mask_through_an_episode_a_weight_update_cut(
    max_lag, async_args, tokenizer, engine, policy, retriever
):
    policy.scripts[QUESTION + "?"] = XML_SCRIPT
    baseline = await baseline_of(async_args, "generate", tokenizer, max_version_lag=max_lag)
    assert info(baseline)["lag_masked_tokens"] == 0  # one version: nothing lags
    args = async_args("generate", max_version_lag=max_lag)
    engine.pause_at(len(engine.calls) + 2, CUT_AFTER)
    sample = (await fully_async_rollout_of(args, [new_sample("generate", tokenizer)]))[0][0]

    assert sample.tokens == baseline.tokens
    assert sample.rollout_log_probs == baseline.rollout_log_probs  # log probs unchanged
    old = [(start, end) for start, end, version in version_spans(info(sample)) if version == "1"]
    expected = list(baseline.loss_mask)
    if max_lag == 0:  # version 1 is one behind the episode's last (2): more than 0
        for start, end in old:
            expected[start:end] = [0] * (end - start)
    assert sample.loss_mask == expected
    masked = sum(end - start for start, end in old) if max_lag == 0 else 0
    assert info(sample)["lag_masked_tokens"] == masked
    assert search_metrics([sample])["versions/lag_masked_share"] == pytest.approx(
        masked / info(sample)["generated_tokens"]
    )


def hand_built_trajectory(versions: list[str | None]) -> Trajectory:
    """A trajectory of one 3-token engine call per version, a 2-token observation after each."""
    args = Namespace(sglang_speculative_algorithm=None)
    trajectory = Trajectory(args, Sample(), [1, 2, 3], track_log_probs=True, train_observations=False)
    for turn, version in enumerate(versions):
        meta_info = {"finish_reason": {"type": "stop"}, "weight_version": version}
        trajectory.add_generated([10 + turn] * 3, [-0.5 - turn] * 3, meta_info)
        trajectory.add_observation([99, 99])
    return trajectory


@pytest.mark.parametrize(
    ("versions", "max_lag", "masked_turns"),
    [
        (["3", "4", "5"], 0, [0, 1]),
        (["3", "4", "5"], 1, [0]),
        (["3", "4", "5"], 2, []),
        (["5", "3", "5"], 1, [1]),  # the newest version, not the last call's position, sets the lag
        (["000007", "000009", "000009"], 1, [0]),  # zero-padded versions (slime's delta updater)
        (["default", "1", "2"], 0, [1]),  # SGLang's version before slime's first update has no place in the order
        ([None, None, None], 0, []),  # an engine that reports no version: nothing lags
    ],
)
def test_the_lag_mask_on_hand_built_spans(versions, max_lag, masked_turns):
    trajectory = hand_built_trajectory(versions)
    sample = trajectory.sample
    log_probs = list(sample.rollout_log_probs)
    assert trajectory.versions == [[5 * turn, 5 * turn + 3, version] for turn, version in enumerate(versions)]
    assert trajectory.mask_lagging_spans(max_lag) == 3 * len(masked_turns)
    expected = []
    for turn in range(len(versions)):
        expected += [0] * 3 if turn in masked_turns else [1] * 3
        expected += [0, 0]
    assert sample.loss_mask == expected
    assert sample.rollout_log_probs == log_probs
    assert trajectory.mask_lagging_spans(max_lag) == 0  # what is masked stays masked, counted once


def test_one_version_per_response_token_none_for_observations():
    record = {"versions": [[0, 3, "4"], [5, 6, "5"]]}
    assert token_versions(record, 8) == ["4", "4", "4", None, None, "5", None, None]
    assert token_versions({}, 2) == [None, None]  # the router modes record none
    assert [version_number(v) for v in ("12", "000012", "default", None)] == [12, 12, None, None]
    assert lagging_spans(version_spans(record), 0) == [(0, 3, "4")]


def test_a_part_of_a_split_episode_sees_the_spans_in_its_own_positions():
    """The record holds the episode's spans; a part starting at response position 4 of length 4 holds 4..8."""
    record = {"versions": [[0, 3, "4"], [5, 6, "5"], [7, 10, "6"]], "segment": {"index": 1, "count": 2, "start": 4}}
    assert part_spans(record, 4) == [(1, 2, "5"), (3, 4, "6")]
    assert token_versions(record, 4) == [None, "5", None, "6"]  # the part's own tokens
    assert part_spans({"versions": record["versions"]}, 10) == version_spans(record)  # an unsplit sample: all
    view = versions_view(record, 4)  # the viewer marks the part's own tokens, lags against the episode's newest
    assert view == {"names": ["5", "6"], "lags": [1, 0], "spans": [[1, 2, 0], [3, 4, 1]]}


# ---- what the log hooks say of a batch ------------------------------------------------------------------------------


def finished(spans: list[list], mask: list[int], **record) -> Sample:
    generated = sum(end - start for start, end, _ in spans)
    stats = {"turns": 1, "tools": {}, "finish_reason": "answer", "generated_tokens": generated, **record}
    return Sample(
        status=Sample.Status.COMPLETED,
        response_length=len(mask),
        loss_mask=list(mask),
        metadata={"search_r1": {**stats, "versions": spans}},
    )


def test_staleness_metrics_of_a_hand_built_batch(make_args):
    batch = [
        finished([[0, 4, "5"], [6, 10, "7"]], [1, 1, 1, 1, 0, 0, 1, 1, 1, 1]),  # lag 7-5 = 2, two versions
        finished([[0, 4, "6"]], [0, 0, 1, 1], max_version_lag=0),  # lag 1: the lag mask covers its 4 tokens
        finished([[0, 2, "7"]], [1, 1], engine_aborts=2, restarts=1),  # newest
        finished([[0, 2, "7"]], [1, 1]),  # removed (below): its tokens are not trained
        finished([[0, 3, "default"]], [1, 1, 1]),  # unordered: no lag, not counted as older
    ]
    batch[3].remove_sample = True
    metrics = staleness_metrics([(sample, info(sample)) for sample in batch])
    assert metrics == {
        "versions/newest": 7,
        "versions/lag/mean": pytest.approx((2 + 1 + 0 + 0) / 4),
        "versions/lag/max": 2,
        "versions/mixed_share": 1 / 4,
        # trained tokens, the lag mask's taken out: 8 + 0 + 2 + 3 ("default"); older than 7: the first one's 4
        "versions/stale_trained_token_share": pytest.approx(4 / 13),
        "versions/lag_masked_share": pytest.approx(4 / (8 + 4 + 2 + 2)),
    }
    with record_tracking() as logged:
        args = make_args(use_wandb=True, custom_rollout_log_function_path="generate_with_search.log_rollout_metrics")
        log_rollout_data(0, args, batch, None, 1.0)
    plugin = next(call["metrics"] for call in logged if TRAIN_PREFIX + "samples" in call["metrics"])  # slime's next
    assert plugin[TRAIN_PREFIX + "versions/lag/max"] == 2
    assert plugin[TRAIN_PREFIX + "engine_aborts/mean"] == pytest.approx(2 / 5)
    assert plugin[TRAIN_PREFIX + "restarted_share"] == pytest.approx(1 / 5)


def test_a_batch_that_waited_across_an_update_lags_the_newest_version_the_engines_have_shown(make_args):
    """Finished groups wait in slime's fully-async queue across weight updates: a batch sampled wholly at version 4
    and trained by version 5 lags by one, which only the engines' answers say (here, one from version 5)."""
    batch = [finished([[0, 4, "4"]], [1, 1, 1, 1], max_version_lag=0), finished([[0, 2, "4"]], [1, 1])]
    for sample in batch:
        sample.reward = 1.0
    ENGINE_VERSIONS.observe(["5"])
    metrics = staleness_metrics([(sample, info(sample)) for sample in batch])
    assert (metrics["versions/newest"], metrics["versions/lag/max"], metrics["versions/lag/mean"]) == (5, 1, 1)
    assert metrics["versions/stale_trained_token_share"] == pytest.approx(2 / 2)  # the first one's are masked
    assert metrics["versions/lag_masked_share"] == pytest.approx(4 / 6)
    # slime forms the batch: the lag mask of the sample that asked for it, counted in its record
    assert post_process_rewards(make_args(n_samples_per_prompt=1, rollout_batch_size=2), batch)[0] == [1.0, 1.0]
    assert batch[0].loss_mask == [0, 0, 0, 0] and info(batch[0])["lag_masked_tokens"] == 4
    assert batch[1].loss_mask == [1, 1] and "lag_masked_tokens" not in info(batch[1])
    # a mask taken once stays taken: forming the batch again masks nothing more
    assert mask_lagging_tokens(batch) == 0 and info(batch[0])["lag_masked_tokens"] == 4


def test_a_split_episode_counts_the_trained_tokens_of_every_part_once(make_args):
    """split_trajectories: each part carries the whole episode's spans and only its own loss mask; the figures are
    those of the episode unsplit."""
    spans, mask = [[0, 4, "5"], [6, 10, "7"]], [1, 1, 1, 1, 0, 0, 1, 1, 0, 1]
    whole = finished(spans, mask)
    first, second = finished(spans, mask[:6]), finished(spans, mask[6:])
    for index, (part, start) in enumerate([(first, 0), (second, 6)]):
        info(part)["segment"] = {"index": index, "count": 2, "start": start}
    split = staleness_metrics([(part, info(part)) for part in (first, second)])
    assert split == staleness_metrics([(whole, info(whole))])
    assert split["versions/stale_trained_token_share"] == pytest.approx(4 / 7)
    assert split["versions/lag/mean"] == 2  # one episode, counted once
    assert staleness_metrics([(second, info(second))]) == {}  # a later part alone: its first part has the figures


def test_a_batch_of_one_version_reads_no_loss_mask():
    """Synchronous training (one version per rollout): the staleness metrics come from the records alone."""

    class Untouchable(list):
        def __getitem__(self, index):
            raise AssertionError("a loss mask was read")

    batch = [finished([[0, 2, "3"]], [1, 1]), finished([[0, 1, "3"], [3, 4, "3"]], [1, 0, 0, 1])]
    for sample in batch:
        sample.loss_mask = Untouchable(sample.loss_mask)
    metrics = staleness_metrics([(sample, info(sample)) for sample in batch])
    assert (metrics["versions/lag/max"], metrics["versions/stale_trained_token_share"]) == (0, 0.0)
    assert staleness_metrics([(Sample(), {"versions": []})]) == {}  # nothing recorded a version: nothing logged


# ---- the setting ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "environ", "message"),
    [
        ({}, {"SEARCH_R1_MAX_VERSION_LAG": "-1"}, "SEARCH_R1_MAX_VERSION_LAG='-1' is out of range; accepted: >= 0"),
        ({"max_version_lag": -2}, {}, "SEARCH_R1_CONFIGS['max_version_lag']=-2 is out of range; accepted: >= 0"),
        ({"max_version_lag": 1.5}, {}, "['max_version_lag']=1.5 is invalid; accepted: an integer, >= 0, or None"),
        (
            {"max_version_lag": 1},
            {"TOKEN_TRACKING_MODE": "router_radix"},
            "TOKEN_TRACKING_MODE=router_radix does not record",
        ),
    ],
)
def test_a_lag_below_0_or_without_recorded_versions_is_refused(user, environ, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        resolve_config(search_r1_configs(copy.deepcopy(user), environ))


def test_the_lag_setting_is_off_by_default_and_read_from_its_variable():
    assert resolve_config(search_r1_configs({}, {})).max_version_lag is None
    assert resolve_config(search_r1_configs({}, {"SEARCH_R1_MAX_VERSION_LAG": "0"})).max_version_lag == 0
    overridden = search_r1_configs({"max_version_lag": 2}, {"SEARCH_R1_MAX_VERSION_LAG": "none"})
    assert resolve_config(overridden).max_version_lag is None
