"""TOKEN_TRACKING_MODE=manual piece by piece, in process: the trajectory's tokens, loss mask, log probs and weight
versions as each turn and observation is written, a turn resumed after an abort, the segments a split episode is
trained as, the checks on a sample handed back by slime, and the driver that writes each answer. No server and no
real tokenizer: the engine is a recorded function and the tokenizer a small vocabulary of multi-character pieces, so
every expected value is written out (test_turn_end.py: where a turn ends; test_engine_call.py: the /generate call and
its answer read).
(test_fidelity.py and test_partial_rollout.py check the same properties end to end, on random episodes.)"""

from argparse import Namespace
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from slime.utils.types import Sample
from slime_search_r1.episode import METADATA_KEY, VERSIONS_KEY, Turn
from slime_search_r1.tokens import engine, manual
from slime_search_r1.tokens.manual import (
    ManualDriver,
    Segment,
    ShortForm,
    Trajectory,
    reset_response_fields,
    shared_rollout_id,
    why_not_continued,
)
from slime_search_r1.tokens.engine_rules import int32_values

from support.piece_tokenizer import TOKENIZER

STOPS = ("</search>", "</answer>")
PROMPT = [101, 102, 103]
# slime adds a finished call's speculative-decoding counters to sample.spec_info only with this flag
ARGS = Namespace(sglang_router_ip="127.0.0.1", sglang_router_port=30000, sglang_speculative_algorithm="EAGLE")


def trajectory(sample=None, *, track=True, train_observations=False, prompt=PROMPT, continued=False):
    return Trajectory(
        ARGS,
        sample if sample is not None else Sample(),
        prompt,
        track_log_probs=track,
        train_observations=train_observations,
        continued=continued,
    )


def meta(version=None, finish="stop", **more) -> dict:
    info = {"finish_reason": {"type": finish}, **more}
    if version is not None:
        info["weight_version"] = version
    return info


# ---- the trajectory on the sample -------------------------------------------------------------------------------


def used_sample(**fields) -> Sample:
    """A sample slime hands back after an earlier try: every response field set."""
    values = dict(
        index=3,
        tokens=[1, 2, 3, 4],
        response="old",
        response_length=1,
        loss_mask=[1],
        rollout_log_probs=[-1.0],
        rollout_top_p_token_ids=[4],
        rollout_top_p_token_offsets=[0, 1],
        rollout_routed_experts=[[1]],
        weight_versions=["1"],
        reward=1.0,
        remove_sample=True,
        status=Sample.Status.ABORTED,
        metadata={METADATA_KEY: {VERSIONS_KEY: [[0, 1, "1"]]}, "kept": {"a": 1}},
    )
    sample = Sample(**{**values, **fields})
    sample.prefix_cache_info.add({"cached_tokens": 2, "prompt_tokens": 3})
    sample.spec_info.add({"spec_accept_token_num": 1, "completion_tokens": 1})
    return sample


def assert_clean(sample: Sample, tokens, *, log_probs):
    assert sample.tokens == tokens
    assert sample.response == ""
    assert sample.response_length == 0
    assert sample.loss_mask == []
    assert sample.rollout_log_probs == log_probs
    assert sample.rollout_top_p_token_ids is None
    assert sample.rollout_top_p_token_offsets is None
    assert sample.rollout_routed_experts is None
    assert sample.weight_versions == []
    assert sample.prefix_cache_info == Sample().prefix_cache_info
    assert sample.spec_info == Sample().spec_info
    assert sample.reward is None
    assert sample.remove_sample is False
    assert sample.status == Sample.Status.PENDING
    assert sample.metadata == {"kept": {"a": 1}}


@pytest.mark.parametrize("track", [True, False])
def test_a_new_trajectory_starts_the_sample_clean(track):
    sample = used_sample()
    traj = trajectory(sample, track=track)
    assert_clean(sample, PROMPT, log_probs=[] if track else None)
    assert sample.tokens is not PROMPT
    assert traj.versions == [] and traj.short_forms == []
    assert traj.segments == [Segment(PROMPT, 0, 0)]
    assert (traj.context(), traj.context_length, traj.response_length, traj.response_ids()) == (PROMPT, 3, 0, [])


def test_reset_response_fields_copies_the_tokens_it_is_given():
    sample, tokens = used_sample(), [7, 8]
    reset_response_fields(sample, tokens, True)
    assert_clean(sample, [7, 8], log_probs=[])
    tokens.append(9)
    assert sample.tokens == [7, 8]


def test_a_continued_trajectory_keeps_what_slime_left_and_its_weight_versions():
    sample = used_sample(rollout_top_p_token_ids=None, rollout_top_p_token_offsets=None)
    sample.tokens, sample.response_length = [101, 102, 103, 5], 1
    traj = trajectory(sample, continued=True)
    assert (sample.reward, sample.remove_sample, sample.status) == (None, False, Sample.Status.PENDING)
    assert sample.tokens == [101, 102, 103, 5]
    assert (sample.loss_mask, sample.rollout_log_probs, sample.weight_versions) == ([1], [-1.0], ["1"])
    assert traj.versions == [[0, 1, "1"]]
    assert traj.segments == [Segment(PROMPT, 0, 1)]  # slime's engine-call count so far
    assert (traj.context(), traj.context_length, traj.response_ids()) == ([101, 102, 103, 5], 4, [5])
    traj.add_generated([6], [-0.5], meta("2"))
    assert traj.versions == [[0, 1, "1"], [1, 2, "2"]]


def test_generated_tokens_get_mask_1_the_engines_log_probs_and_their_weight_version():
    traj = trajectory()
    sample = traj.sample
    traj.add_generated([1, 2], [-0.5, -0.25], meta("3", prompt_tokens=3, cached_tokens=1, completion_tokens=2))
    traj.add_observation([6, 6, 6])
    traj.add_generated([7, 8], [-1.0, -2.0], meta("4"))
    assert sample.tokens == PROMPT + [1, 2, 6, 6, 6, 7, 8]
    assert sample.response_length == 7
    assert sample.loss_mask == [1, 1, 0, 0, 0, 1, 1]
    assert sample.rollout_log_probs == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0, -2.0]
    assert sample.weight_versions == ["3", "4"]
    assert traj.versions == [[0, 2, "3"], [5, 7, "4"]]
    assert (traj.context_length, traj.response_length) == (10, 7)
    assert traj.response_ids() == [1, 2, 6, 6, 6, 7, 8]
    # slime's bookkeeping got the engine's meta_info and the rollout's args
    assert sample.prefix_cache_info.cached_tokens == 1
    assert sample.spec_info.completion_token_num == 2


def test_without_log_probs_generated_tokens_are_counted_and_slime_recomputes_their_log_probs():
    traj = trajectory(track=False)
    sample = traj.sample
    traj.add_generated([1, 2], None, meta("3"))
    traj.add_generated([6], None, {"finish_reason": {"type": "stop"}})
    traj.add_generated([], None, meta("9"))  # an engine call that sampled nothing leaves no span
    traj.add_observation([6, 6])
    traj.add_generated([7], None, None)
    assert sample.tokens == PROMPT + [1, 2, 6, 6, 6, 7]
    assert sample.response_length == 6
    assert sample.loss_mask == [1, 1, 1, 0, 0, 1]
    assert sample.rollout_log_probs is None
    assert sample.weight_versions == ["3", "9"]
    assert traj.versions == [[0, 2, "3"], [2, 3, None], [5, 6, None]]


@pytest.mark.parametrize("track", [True, False])
def test_observations_are_trained_only_with_train_observations(track):
    for train, mask in ((False, 0), (True, 1)):
        traj = trajectory(track=track, train_observations=train)
        traj.add_observation([6, 9])
        assert traj.sample.tokens == PROMPT + [6, 9]
        assert traj.sample.response_length == 2
        assert traj.sample.loss_mask == [mask, mask]
        assert traj.sample.rollout_log_probs == ([0.0, 0.0] if track else None)
        assert traj.versions == []


def test_only_a_shorter_short_form_is_kept():
    traj = trajectory()
    traj.add_generated([1], [-0.1], meta("1"))
    traj.add_observation([6, 6, 6], [9])
    traj.add_observation([6, 6], [9, 9])
    traj.add_observation([6], None)
    traj.add_observation([6, 6], [])
    assert traj.short_forms == [ShortForm(1, 4, [9]), ShortForm(7, 9, [])]


def test_a_read_observation_shows_its_short_form_in_a_new_segment():
    traj = trajectory()
    traj.add_generated([1, 2], [-0.1, -0.2], meta("1"))
    short = [9]
    traj.add_observation([6, 6, 6, 6], short)
    short.append(9)  # the trajectory keeps its own copy
    assert traj.shorten_read_observations() == 0  # no turn has read it yet
    assert len(traj.segments) == 1
    traj.add_generated([7], [-0.3], meta("2"))
    assert traj.short_forms[0].read
    assert traj.shorten_read_observations() == 3
    assert traj.segments[-1] == Segment(PROMPT + [1, 2, 9, 7], 7, 2)
    assert traj.context() == PROMPT + [1, 2, 9, 7]
    assert traj.context_length == 7
    assert traj.shorten_read_observations() == 0  # already replaced
    assert len(traj.segments) == 2
    traj.add_observation([6, 6], [9])
    traj.add_generated([8], [-0.4], meta("3"))
    assert traj.context() == PROMPT + [1, 2, 9, 7, 6, 6, 8]
    assert traj.context_length == 10
    assert traj.shorten_read_observations() == 1
    assert traj.segments[-1] == Segment(PROMPT + [1, 2, 9, 7, 9, 8], 10, 3)
    assert traj.context() == PROMPT + [1, 2, 9, 7, 9, 8]
    assert traj.context_length == 9
    assert traj.response_length == 10
    assert traj.sample.tokens == PROMPT + [1, 2, 6, 6, 6, 6, 7, 6, 6, 8]


def test_two_observations_read_by_one_turn_are_shortened_together():
    traj = trajectory()
    traj.add_observation([6, 6, 6], [9])
    traj.add_observation([6, 6], [9])
    traj.add_generated([7], [-0.3], meta("2"))
    assert traj.shorten_read_observations() == 3
    assert traj.segments[-1] == Segment(PROMPT + [9, 9, 7], 6, 1)


def split_episode(*, track=True, top_p=False) -> Trajectory:
    """prompt | gen [1,2] v1 | obs [6,6,6] (short [9]) | gen [7] v2 | new segment | gen [8,5] v3"""
    traj = trajectory(Sample(index=11, metadata={"note": ["x"]}), track=track)

    def generated(ids, version, nucleus):
        info = meta(version, prompt_tokens=5, completion_tokens=len(ids))
        if top_p:
            offsets = [0]
            for size in nucleus:
                offsets.append(offsets[-1] + size)
            info.update(top_p_token_ids=[100 + i for i in range(offsets[-1])], top_p_token_offsets=offsets)
        traj.add_generated(ids, [-0.5] * len(ids) if track else None, info)

    generated([1, 2], "1", [1, 2])
    traj.add_observation([6, 6, 6], [9])
    generated([7], "2", [2])
    traj.shorten_read_observations()
    generated([8, 5], "3", [1, 1])
    return traj


def test_a_split_episode_becomes_one_sample_per_segment_sharing_its_rollout_id():
    traj = split_episode()
    whole = traj.sample
    first, second = traj.segment_samples(TOKENIZER)
    assert first is whole
    assert first.tokens == PROMPT + [1, 2, 6, 6, 6, 7]
    assert first.response == TOKENIZER.decode([1, 2, 6, 6, 6, 7])
    assert first.response_length == 6
    assert first.loss_mask == [1, 1, 0, 0, 0, 1]
    assert first.rollout_log_probs == [-0.5, -0.5, 0.0, 0.0, 0.0, -0.5]
    assert first.weight_versions == ["1", "2"]
    assert second.tokens == PROMPT + [1, 2, 9, 7, 8, 5]
    assert second.response == "</answer></search>"
    assert second.response_length == 2
    assert second.loss_mask == [1, 1]
    assert second.rollout_log_probs == [-0.5, -0.5]
    assert second.weight_versions == ["3"]
    assert first.rollout_id == second.rollout_id == 11
    assert second.metadata == {"note": ["x"]} and second.metadata["note"] is not first.metadata["note"]
    # the engine calls' counters stay on the first sample, as one episode's
    assert first.prefix_cache_info.total_prompt_tokens == 15
    assert second.prefix_cache_info == Sample().prefix_cache_info
    assert first.spec_info.completion_token_num == 5  # slime counted each call's speculative decoding
    assert second.spec_info == Sample().spec_info
    assert second.status == first.status and second.index == first.index


def test_a_split_episode_without_log_probs_keeps_them_none():
    first, second = split_episode(track=False).segment_samples(TOKENIZER)
    assert first.rollout_log_probs is None and second.rollout_log_probs is None
    assert (first.loss_mask, second.loss_mask) == ([1, 1, 0, 0, 0, 1], [1, 1])


def test_a_segment_that_got_no_tokens_is_skipped_and_the_next_one_is_still_a_sample():
    traj = trajectory(Sample(index=2))
    traj.add_observation([6, 6], [9])
    traj.add_generated([1], [-0.5], meta("1"))  # reads the first observation
    traj.add_observation([6, 6, 6], [9])
    assert traj.shorten_read_observations() == 1
    traj.add_generated([], [], meta("2"))  # an engine call that sampled nothing reads the second
    assert traj.shorten_read_observations() == 2
    traj.add_generated([5], [-0.5], meta("3"))
    first, second = traj.segment_samples(TOKENIZER)
    assert first.tokens == PROMPT + [6, 6, 1, 6, 6, 6]
    assert first.weight_versions == ["1"]
    assert second.tokens == PROMPT + [9, 1, 9, 5]
    assert second.weight_versions == ["3"]
    assert (second.loss_mask, second.rollout_log_probs) == ([1], [-0.5])


def test_a_segment_that_got_no_tokens_is_no_sample_and_an_unsplit_episode_is_itself():
    traj = trajectory(Sample(rollout_id=5))
    traj.add_generated([1, 2], [-0.5, -0.5], meta("1"))
    traj.add_observation([6, 6], [9])
    traj.add_generated([5], [-0.5], meta("1"))
    traj.shorten_read_observations()  # the episode ended before another turn
    (only,) = traj.segment_samples(TOKENIZER)
    assert only is traj.sample
    assert only.tokens == PROMPT + [1, 2, 6, 6, 5]
    assert only.response_length == 5 and only.rollout_id == 5
    assert only.response == TOKENIZER.decode([1, 2, 6, 6, 5])


@pytest.mark.parametrize("as_tensors", [False, True])
def test_a_split_episode_slices_the_top_p_replay_arrays_per_token(as_tensors):
    traj = split_episode(top_p=True)
    whole = traj.sample
    # nuclei per response token: 1, 2, observation 0 0 0, 2 | 1, 1
    assert int32_values(whole.rollout_top_p_token_offsets) == [0, 1, 3, 3, 3, 3, 5, 6, 7]
    ids = int32_values(whole.rollout_top_p_token_ids)
    offsets = int32_values(whole.rollout_top_p_token_offsets)
    if as_tensors:  # as slime keeps them once it has merged a turn's
        whole.rollout_top_p_token_ids = torch.tensor(ids, dtype=torch.int32)
        whole.rollout_top_p_token_offsets = torch.tensor(offsets, dtype=torch.int32)
    else:
        whole.rollout_top_p_token_ids, whole.rollout_top_p_token_offsets = list(ids), list(offsets)
    first, second = traj.segment_samples(TOKENIZER)
    assert int32_values(first.rollout_top_p_token_offsets) == [0, 1, 3, 3, 3, 3, 5]
    assert int32_values(first.rollout_top_p_token_ids) == ids[:5]
    assert int32_values(second.rollout_top_p_token_offsets) == [0, 1, 2]
    assert int32_values(second.rollout_top_p_token_ids) == ids[5:7]
    for part in (first, second):
        assert torch.is_tensor(part.rollout_top_p_token_ids) == as_tensors
        assert torch.is_tensor(part.rollout_top_p_token_offsets) == as_tensors


def test_without_top_p_arrays_the_parts_have_none():
    for ids, offsets in ((None, None), ([1], None), (None, [0, 1])):
        sample = Sample(rollout_top_p_token_ids=ids, rollout_top_p_token_offsets=offsets)
        assert manual._top_p_part(sample, 0, 1) == {}


def test_the_shared_rollout_id_is_the_samples_then_its_index_then_random(monkeypatch):
    assert shared_rollout_id(Sample(rollout_id=0, index=4)) == 0
    assert shared_rollout_id(Sample(index=0)) == 0
    asked = []
    monkeypatch.setattr(manual.random, "getrandbits", lambda bits: asked.append(bits) or 12345)
    assert shared_rollout_id(Sample()) == 12345
    assert asked == [62]


def test_lagging_spans_leave_the_loss_and_keep_their_log_probs():
    traj = trajectory()
    traj.add_generated([1, 2], [-0.5, -0.5], meta("1"))
    traj.add_observation([6], None)
    traj.add_generated([7], [-0.5], meta("3"))
    traj.add_generated([8, 8], [-0.5, -0.5], meta("default"))
    traj.add_generated([5], [-0.5], meta("4"))
    traj.sample.loss_mask[1] = 0  # already out of the loss: not counted again
    fresh = trajectory()
    fresh.add_generated([1, 2], [-0.5, -0.5], meta("1"))
    fresh.add_generated([7], [-0.5], meta("2"))
    fresh.add_generated([5], [-0.5], meta("4"))
    assert fresh.mask_lagging_spans(1) == 3
    assert fresh.sample.loss_mask == [0, 0, 0, 1]
    assert traj.mask_lagging_spans(3) == 0
    assert traj.mask_lagging_spans(2) == 1
    assert traj.sample.loss_mask == [0, 0, 0, 1, 1, 1, 1]
    assert traj.mask_lagging_spans(0) == 1
    assert traj.sample.loss_mask == [0, 0, 0, 0, 1, 1, 1]
    assert traj.sample.rollout_log_probs == [-0.5, -0.5, 0.0, -0.5, -0.5, -0.5, -0.5]


@pytest.mark.parametrize("train_observations", [False, True])
def test_a_routers_whole_response_replaces_the_trajectory(train_observations):
    traj = trajectory(used_sample(), train_observations=train_observations)
    traj.add_generated([1], [-0.5], meta("1"))
    traj.replace_response([5, 6, 9], [True, 0, 1], [-1, 0, -0.5])
    sample = traj.sample
    assert sample.tokens == PROMPT + [5, 6, 9]
    assert sample.response_length == 3
    assert sample.loss_mask == ([1, 1, 1] if train_observations else [1, 0, 1])
    assert all(type(m) is int for m in sample.loss_mask)
    assert sample.rollout_log_probs == [-1.0, 0.0, -0.5]
    assert all(type(v) is float for v in sample.rollout_log_probs)
    assert traj.versions == [] and sample.weight_versions == []
    assert sample.metadata == {"kept": {"a": 1}}
    traj.decode_response(TOKENIZER)
    assert sample.response == "</search> x\n"
    untracked = trajectory(track=False)
    untracked.replace_response([5], [1], None)
    assert untracked.sample.rollout_log_probs is None and untracked.sample.loss_mask == [1]


def test_decode_response_keeps_special_tokens():
    traj = trajectory()
    traj.add_generated([2, 99], [-0.5, -0.5], meta("1"))
    traj.decode_response(TOKENIZER)
    assert traj.sample.response == " Paris<|im_end|>"
    traj.add_observation([6], [])
    traj.add_generated([99], [-0.5], meta("1"))
    traj.shorten_read_observations()
    traj.add_generated([2, 99], [-0.5, -0.5], meta("1"))
    assert [part.response for part in traj.segment_samples(TOKENIZER)] == [
        " Paris<|im_end|> x<|im_end|>",
        " Paris<|im_end|>",
    ]


# ---- a sample handed back to continue ---------------------------------------------------------------------------


def handed_back(**fields) -> Sample:
    values = dict(tokens=PROMPT + [1, 2], response_length=2, loss_mask=[1, 1], rollout_log_probs=[-0.5, -0.5])
    return Sample(**{**values, **fields})


def test_a_sample_that_lines_up_can_be_continued():
    assert why_not_continued(handed_back(), PROMPT, True) is None
    assert why_not_continued(handed_back(rollout_log_probs=None), PROMPT, False) is None
    spans = {METADATA_KEY: {VERSIONS_KEY: [[0, 2, "1"]]}}
    assert why_not_continued(handed_back(metadata=spans), PROMPT, True) is None


@pytest.mark.parametrize(
    ("fields", "track", "why"),
    [
        (
            dict(tokens=[101, 102, 104, 1, 2]),
            True,
            "its tokens do not start with the prompt's tokens as they render now",
        ),
        (dict(tokens=[101, 102]), True, "its tokens do not start with the prompt's tokens as they render now"),
        (dict(tokens=PROMPT + [1]), True, "4 tokens for 3 of prompt and 2 of response"),
        (dict(tokens=PROMPT + [1, 2, 3]), True, "6 tokens for 3 of prompt and 2 of response"),
        (dict(loss_mask=[1]), True, "a loss mask of 1 for 2 response tokens"),
        (dict(loss_mask=None), True, "a loss mask of 0 for 2 response tokens"),
        (dict(rollout_log_probs=None), True, "no rollout log probs for 2 tokens"),
        (dict(rollout_log_probs=[-0.5]), True, "1 rollout log probs for 2 tokens"),
        (
            dict(metadata={METADATA_KEY: {VERSIONS_KEY: [[0, 1, "1"], [1, 2, "2"], [2, 3, "2"]]}}),
            True,
            "weight-version spans up to token 3 for 2 response tokens",
        ),
    ],
)
def test_a_sample_that_does_not_line_up_is_not_continued_and_says_why(fields, track, why):
    assert why_not_continued(handed_back(**fields), PROMPT, track) == why


def test_a_sample_with_no_loss_mask_and_no_response_lines_up():
    sample = Sample(tokens=list(PROMPT), response_length=0, loss_mask=None, rollout_log_probs=None)
    assert why_not_continued(sample, PROMPT, False) is None


# ---- the driver -------------------------------------------------------------------------------------------------


def driver(*, track=True, turn_start=0, sample=None, transport="aiohttp", **args) -> ManualDriver:
    args = Namespace(sglang_router_ip="127.0.0.1", sglang_router_port=30000, **args)
    sample = sample if sample is not None else Sample(session_id="s-1")
    traj = Trajectory(args, sample, PROMPT, track_log_probs=track, train_observations=False)
    config = SimpleNamespace(engine_transport=transport)
    state = SimpleNamespace(tokenizer=TOKENIZER, args=args, config=config, sample=sample, turn_start=turn_start)
    return ManualDriver(state, traj, SimpleNamespace(cut_at_stops=STOPS))


def test_the_driver_finds_the_engine_the_transport_and_the_routing_as_slime_does():
    plain = driver()
    assert plain.url == "http://127.0.0.1:30000/generate"
    assert plain.use_slime_post is False
    assert plain.headers is None
    assert plain.keep_aborted is False
    assert plain.cut_at_stops == STOPS
    routed = driver(sglang_model_routers={"actor": ("10.0.0.2", 31000), "ref": ("10.0.0.3", 1)})
    assert routed.url == "http://10.0.0.2:31000/generate"  # the policy is "actor" in --sglang-config
    assert engine.base_url(routed.state.args) == "http://10.0.0.2:31000"
    unnamed = driver(sglang_model_routers={"policy": ("10.0.0.2", 31000)})
    assert engine.base_url(unnamed.state.args) == "http://127.0.0.1:30000"  # else slime's default router
    assert driver(transport="slime").use_slime_post is True
    assert driver(use_distributed_post=True).use_slime_post is True
    assert driver(use_distributed_post=False).use_slime_post is False
    assert driver(partial_rollout=True).keep_aborted is True
    assert driver(partial_rollout=False).keep_aborted is False
    assert driver(router_policy="consistent_hashing").headers == {"X-SMG-Routing-Key": "s-1"}
    assert driver(router_policy="round_robin").headers is None
    assert driver(router_policy="consistent_hashing", sample=Sample()).headers is None
    # a Sample without session_id (slime before it had one) is routed as slime routes it: no key
    assert engine.routing_headers(Namespace(router_policy="consistent_hashing"), SimpleNamespace()) is None


class ScriptedEngine:
    """generate_turn's stand-in for the driver: answers turns in order and records what each was sent."""

    def __init__(self, monkeypatch, *turns):
        self.turns, self.calls = list(turns), []
        monkeypatch.setattr(manual, "generate_turn", self)

    async def __call__(self, url, input_ids, sampling_params, return_logprob, *, use_slime_post, headers):
        self.calls.append((url, list(input_ids), sampling_params, return_logprob, use_slime_post, headers))
        return self.turns.pop(0)


def engine_turn(ids, finish="stop", version="1"):
    """An answer as engine.parse_engine_output reads it."""
    log_probs = [-0.25 * (i + 1) for i in range(len(ids))]
    versions = [(0, len(ids), version)] if ids else []
    return Turn(list(ids), finish, log_probs=log_probs, meta_info=meta(version), versions=versions)


async def test_a_turn_appends_what_the_engine_sampled_to_the_trajectory(monkeypatch):
    d = driver(router_policy="consistent_hashing", use_distributed_post=True)
    engine = ScriptedEngine(monkeypatch, engine_turn([1, 2, 5]), engine_turn([7, 6, 8], version="2"))
    turn = await d.generate({"max_new_tokens": 9})
    text, log_probs = "<search> Paris</search>", [-0.25, -0.5, -0.75]
    assert turn == Turn([1, 2, 5], "stop", text=text, log_probs=log_probs, meta_info=meta("1"), versions=[(0, 3, "1")])
    d.add_observation([6, 6, 6], [9])
    d.state.turn_start = 6
    turn = await d.generate({"max_new_tokens": 4})
    assert turn.ids == [7, 6, 8] and turn.text == "<answer> x</answer>"
    assert engine.calls == [
        ("http://127.0.0.1:30000/generate", PROMPT, {"max_new_tokens": 9}, True, True, {"X-SMG-Routing-Key": "s-1"}),
        (
            "http://127.0.0.1:30000/generate",
            PROMPT + [1, 2, 5, 6, 6, 6],
            {"max_new_tokens": 4},
            True,
            True,
            {"X-SMG-Routing-Key": "s-1"},
        ),
    ]
    sample = d.trajectory.sample
    assert sample.tokens == PROMPT + [1, 2, 5, 6, 6, 6, 7, 6, 8]
    assert sample.loss_mask == [1, 1, 1, 0, 0, 0, 1, 1, 1]
    assert sample.rollout_log_probs == [-0.25, -0.5, -0.75, 0.0, 0.0, 0.0, -0.25, -0.5, -0.75]
    assert d.trajectory.versions == [[0, 3, "1"], [6, 9, "2"]]
    assert d.trajectory.short_forms == [ShortForm(3, 6, [9], read=True)]
    assert (d.context_length, d.response_length) == (12, 9)
    assert d.written_turn() == Turn([7, 6, 8], "stop", text="<answer> x</answer>")


async def test_a_turn_that_ran_past_its_stop_string_is_cut_after_it(monkeypatch):
    d = driver(track=False)
    ScriptedEngine(monkeypatch, engine_turn([1, 2, 3, 4, 6, 7], finish="length"))
    turn = await d.generate({})
    assert turn.ids == [1, 2, 3, 4]
    assert turn.text == "<search> Paris</search>"
    assert turn.finish_type == "stop"
    assert turn.log_probs == [-0.25, -0.5, -0.75, -1.0]
    assert turn.meta_info["finish_reason"] == {"type": "stop", "matched": "</search>"}
    sample = d.trajectory.sample
    assert sample.tokens == PROMPT + [1, 2, 3, 4]
    assert sample.loss_mask == [1, 1, 1, 1]
    assert d.trajectory.versions == [[0, 4, "1"]]


async def test_without_partial_rollout_an_aborted_turn_writes_nothing(monkeypatch):
    d = driver()
    ScriptedEngine(monkeypatch, engine_turn([1, 2], finish="abort"))
    assert await d.generate({}) == replace(engine_turn([1, 2], finish="abort"), engine_aborted=True)
    assert d.trajectory.sample.tokens == PROMPT and d.trajectory.versions == []


async def test_with_partial_rollout_an_aborted_turn_keeps_what_it_sampled_and_resumes_from_it(monkeypatch):
    d = driver(partial_rollout=True)
    engine = ScriptedEngine(
        monkeypatch,
        engine_turn([], finish="abort"),
        engine_turn([1, 2, 3], finish="abort", version="1"),
        engine_turn([4, 6, 6], version="2"),
    )
    nothing = await d.generate({})
    assert nothing.ids == [] and nothing.finish_type == "abort"
    assert d.trajectory.sample.tokens == PROMPT
    kept = await d.generate({})
    assert kept.ids == [1, 2, 3] and kept.finish_type == "abort" and kept.text == "<search> Paris</sea"
    assert d.written_turn() == Turn([1, 2, 3], "stop", text="<search> Paris</sea")
    # slime hands the sample back; the turn goes on from its last token and the stop string spans the abort
    resumed = await d.generate({})
    assert engine.calls[-1][1] == PROMPT + [1, 2, 3]
    assert resumed.ids == [1, 2, 3, 4]
    assert resumed.text == "<search> Paris</search>"
    assert resumed.log_probs == [-0.25]
    assert resumed.finish_type == "stop"
    sample = d.trajectory.sample
    assert sample.tokens == PROMPT + [1, 2, 3, 4]
    assert sample.rollout_log_probs == [-0.25, -0.5, -0.75, -0.25]
    assert d.trajectory.versions == [[0, 3, "1"], [3, 4, "2"]]


async def test_special_tokens_are_decoded_as_the_engine_wrote_them(monkeypatch):
    d = driver(partial_rollout=True)
    ScriptedEngine(monkeypatch, engine_turn([2, 99]), engine_turn([99, 6], finish="abort"), engine_turn([99, 5, 6]))
    assert (await d.generate({})).text == " Paris<|im_end|>"
    d.state.turn_start = 2
    await d.generate({})
    assert d.written_turn().text == "<|im_end|> x"
    resumed = await d.generate({})  # cut after the stop string: the text is decoded again
    assert resumed.text == "<|im_end|> x<|im_end|></search>"
    assert resumed.ids == [99, 6, 99, 5]


async def test_a_resumed_turn_is_decoded_whole_so_a_later_stop_string_cuts_only_the_new_part(monkeypatch):
    d = driver(partial_rollout=True)
    ScriptedEngine(monkeypatch, engine_turn([7, 6], finish="abort"), engine_turn([6, 10, 11, 6, 6]))
    await d.generate({})
    resumed = await d.generate({})
    assert resumed.ids == [7, 6, 6, 10, 11]
    assert resumed.text == "<answer> x x</answer>"
    assert resumed.log_probs == [-0.25, -0.5, -0.75]
    assert d.trajectory.sample.tokens == PROMPT + [7, 6, 6, 10, 11]


async def test_prepare_and_finish_ask_nothing_of_the_engine():
    d = driver()
    assert await ManualDriver.prepare(d.state) is None
    assert await d.finish(Sample.Status.COMPLETED) is None
    assert ManualDriver.resumable is True
