"""Early warnings of a collapse (slime_search_r1/training/collapse.py): each signal computed from what a rollout
holds, the bands and their warning lines, and docs/watching.md's constructed run, in which the warning comes before the
reward falls."""

from pathlib import Path

import numpy as np
import pytest

from slime.utils.types import Sample
from slime_search_r1.training.collapse import (
    BANDS,
    FOREIGN_LETTERS,
    HEALTH,
    LOOP_SHARE,
    CollapseWatch,
    foreign_letters,
    repeated_ngram_share,
)
from slime.observability.rollout_data_utils import save_debug_rollout_data
from slime_search_r1.training.metrics import health_metrics
from slime_search_r1.viewer.inputs import read_inputs
from slime_search_r1.viewer.summary import collapse_warnings, hook_metrics
from support.collapse_run import constructed_run, table, warned_signals

REPO = Path(__file__).resolve().parents[2]


async def test_the_documented_constructed_run_warns_before_the_reward_falls_in_the_log_and_the_viewer(
    make_args, tokenizer, engine, search_config, tmp_path
):
    args = make_args(
        n_samples_per_prompt=4,
        rollout_batch_size=2,
        use_wandb=True,
        custom_rollout_log_function_path="generate_with_search.log_rollout_metrics",
    )
    rollouts = await constructed_run(args, tokenizer, engine)
    printed = table(rollouts)
    print(printed)  # pytest -s shows what docs/watching.md pastes
    healthy = [r.metrics["reward"] for r in rollouts[:4]]
    fallen = [r.rollout_id for r in rollouts if r.metrics["reward"] < min(healthy) - 0.05]
    warned = [r.rollout_id for r in rollouts if r.warnings]
    assert fallen and warned
    assert warned[0] < fallen[0]
    assert not any(r.warnings for r in rollouts[:4])  # the healthy rollouts raise none
    assert "health/repetition_share" in warned_signals(rollouts[warned[0]])
    # the viewer, from slime's dumps of the same rollouts, shows the same figures and the same warnings
    for rollout in rollouts:
        template = str(tmp_path / "rollout_data" / "{rollout_id}.pt")
        save_debug_rollout_data(template, rollout.samples, rollout_id=rollout.rollout_id, evaluation=False)
    runs = read_inputs([tmp_path]).runs
    hooks = [hook_metrics(run) for run in runs]
    warnings = collapse_warnings(runs, hooks)
    assert [run.rollout_id for run in runs] == [r.rollout_id for r in rollouts]
    for rollout, shown, warned in zip(rollouts, hooks, warnings, strict=True):
        assert shown == rollout.metrics
        assert [f"search_r1 collapse warning at rollout {rollout.rollout_id}: {w}" for w in warned] == rollout.warnings
    for page in ("docs/watching.md", "docs/watching_zh.md"):
        assert printed in (REPO / page).read_text(encoding="utf-8"), page


# ---- each signal, from what a sample holds ----------------------------------------------------------------------


def sample(response="", *, prompt="Question: capital of France?", ids=None, mask=None, log_probs=None, **fields):
    """A finished slime Sample whose record the plugin wrote; `ids` are its response tokens."""
    ids = list(range(1, 11)) if ids is None else ids
    record = {"finish_reason": "answer", "tools": fields.pop("tools", {}), **fields.pop("record", {})}
    return Sample(
        prompt=prompt,
        response=response,
        tokens=[900, 901, *ids],
        response_length=len(ids),
        loss_mask=mask,
        rollout_log_probs=log_probs,
        status=fields.pop("status", Sample.Status.COMPLETED),
        metadata={"search_r1": record},
        **fields,
    )


def signals(*samples):
    return health_metrics(list(samples))


def test_a_response_that_loops_counts_and_one_that_repeats_a_query_does_not():
    loop = [7, 8, 9, 10, 11, 12] * 10  # a six-token sentence, ten times
    query = list(range(100, 120))
    once_more = [*query, *range(200, 240), *query, *range(300, 340)]  # the question written twice
    assert repeated_ngram_share(np.asarray(loop)) > 0.8
    assert 0 < repeated_ngram_share(np.asarray(once_more)) < LOOP_SHARE
    assert signals(sample(ids=loop), sample(ids=once_more))["health/repetition_share"] == 0.5


def test_only_generated_tokens_count_observations_do_not():
    shown = [5] * 40  # a retrieved block the model was shown, the same token over and over
    ids, mask = [*range(1, 21), *shown, *range(21, 41)], [1] * 20 + [0] * 40 + [1] * 20
    log_probs = [-1.0] * 20 + [0.0] * 40 + [-3.0] * 20
    found = signals(sample(ids=ids, mask=mask, log_probs=log_probs))
    assert found["health/repetition_share"] == 0.0
    assert found["health/neg_log_prob"] == pytest.approx(2.0)  # (20 * 1 + 20 * 3) / 40
    assert signals(sample(ids=ids, mask=mask))["health/repetition_share"] == 0.0  # without log probs too


@pytest.mark.parametrize(
    ("response", "foreign"),
    [
        ("<think>The capital is Paris.</think><answer> Paris </answer>", False),
        ("<think>首都是巴黎，我确定。</think><answer> Paris </answer>", True),  # drifted into Chinese
        ("<think>Это столица Франции.</think><answer> Paris </answer>", True),  # into Cyrillic
        ("<think>It is 東京都.</think>", False),  # four letters: below FOREIGN_LETTERS
        (
            "<search> Tokyo </search>\n\n<information>Tokyo (東京都, Tōkyō-to) is the capital</information>\n\n"
            "<think>Tokyo, 東京都, 東京都 it is.</think><answer> Tokyo </answer>",
            False,  # the script came with what the tool returned
        ),
    ],
    ids=["english", "chinese", "cyrillic", "a few letters", "copied from a result"],
)
def test_letters_in_a_script_the_context_does_not_use_count(response, foreign):
    assert foreign_letters(response, "Question: capital of France?") >= FOREIGN_LETTERS or not foreign
    assert signals(sample(response))["health/foreign_script_share"] == float(foreign)


def test_no_answer_counts_responses_without_a_closing_answer_but_not_failed_ones():
    answered = sample("<think>a</think><answer> Paris </answer>")
    cut = sample("<think>a long thought that never ends", status=Sample.Status.TRUNCATED)
    failed = sample("<think>a</think><search> q </search>", status=Sample.Status.FAILED)
    # an answer the environment showed is not the model's
    shown = sample("<search> q </search>\n\n<information>... <answer> Paris </answer></information>\n\n")
    assert signals(answered, cut, failed, shown)["health/no_answer_share"] == pytest.approx(2 / 3)


def test_a_split_episode_is_read_whole_once():
    """split_trajectories: the answer is in the last part and a loop may run across parts; the episode's signals are
    those of its parts joined, counted once beside an unsplit episode."""
    loop = [7, 8, 9, 10, 11, 12] * 10
    parts = [
        sample("<think>a</think><search> q </search>\n\n<information>...</information>\n\n", ids=loop[:30]),
        sample("<think>so</think><answer> Paris </answer>", ids=loop[30:]),
    ]
    for index, part in enumerate(parts):
        part.metadata["search_r1"]["segment"] = {"index": index, "count": 2, "start": 30 * index}
    unsplit = sample("<think>a</think>", ids=list(range(1, 61)), status=Sample.Status.TRUNCATED)
    found = signals(*parts, unsplit)
    assert found["health/no_answer_share"] == 0.5  # the split episode answered, the other did not
    assert found["health/repetition_share"] == 0.5  # its loop is counted once, across its two parts


def test_the_reasoning_before_the_first_tool_call_in_both_protocols():
    searched = {"search": {"calls": 1, "failures": 0, "seconds": [0.1]}}
    xml = sample("<think>twelve chars</think>\n<search> q </search>", tools=searched)  # 26 characters before
    conversation = [
        {"role": "assistant", "content": "no tags"},
        {"role": "user", "content": "Your last reply had no tool call"},
        {"role": "assistant", "content": "<think>abc</think>", "tool_calls": [{"id": "c"}]},
        {"role": "tool", "content": "Doc 1"},
        {"role": "assistant", "content": "<answer> Paris </answer>"},
    ]
    chat = sample("", tools=searched, record={"conversation": conversation})
    no_call = sample("<think>I know it.</think><answer> Paris </answer>")
    assert signals(xml)["health/reasoning_chars"] == len("<think>twelve chars</think>")
    assert signals(chat)["health/reasoning_chars"] == len("no tags") + len("<think>abc</think>")
    assert "health/reasoning_chars" not in signals(no_call)


def scored(score, log_prob, group, **fields):
    record = {"reward": {"score": score, "em": float(score == 1.0), "format_valid": 1.0, "retrieval_hit": 0.0}}
    record |= fields.pop("record", {})
    return sample(log_probs=[log_prob] * 10, group_index=group, record=record, **fields)


def test_the_top_reward_log_prob_is_over_the_best_of_each_group_whose_rewards_differ():
    groups = [
        scored(1.0, -0.2, 0),
        scored(1.0, -0.4, 0),
        scored(0.2, -2.0, 0),
        scored(0.2, -9.0, 1),  # all equal: no signal from this group
        scored(0.2, -9.0, 1),
        scored(1.0, -1.0, 2),
        scored(0.0, -9.0, 2),
        scored(9.0, -9.0, 2, remove_sample=True),  # kept out of the loss (a failed search)
        scored(9.0, -9.0, 2, record={"reward": {"score": 9.0, "unscored": True}}),  # the judge gave no verdict
    ]
    assert signals(*groups)["health/top_reward_log_prob"] == pytest.approx((-0.2 - 0.4 - 1.0) / 3)


# ---- bands and warnings -----------------------------------------------------------------------------------------


def test_changes_come_after_the_warmup_against_the_previous_rollouts_mean():
    watch = CollapseWatch(window=3, warmup=2)
    assert watch.observe({"health/neg_log_prob": 1.0, "health/top_reward_log_prob": -0.5}) == ({}, [])
    assert watch.observe({"health/neg_log_prob": 1.2, "health/top_reward_log_prob": -0.5}) == ({}, [])
    changes, alarms = watch.observe({"health/neg_log_prob": 1.65, "health/top_reward_log_prob": -0.6})
    assert changes == {
        "health/neg_log_prob_change": pytest.approx(0.5),  # relative to (1.0 + 1.2) / 2
        "health/top_reward_log_prob_change": pytest.approx(-0.1),  # nats per token
    }
    assert alarms == []  # 0.5 and -0.1 are inside their bands
    changes, alarms = watch.observe({"health/neg_log_prob": 1.3, "health/top_reward_log_prob": -0.8})
    assert changes["health/top_reward_log_prob_change"] == pytest.approx(-0.8 + (0.5 + 0.5 + 0.6) / 3)
    [alarm] = alarms
    assert alarm.signal == "health/top_reward_log_prob_change" and alarm.side == "below"
    assert "at least -0.15" in alarm.message and "likelihood displacement" in alarm.message


@pytest.mark.parametrize("band", BANDS, ids=lambda band: band.signal)
def test_each_band_warns_just_outside_and_not_just_inside(band):
    def alarms_at(value):
        name = band.signal.removesuffix("_change")
        watch = CollapseWatch(window=1, warmup=1 if name != band.signal else 0)
        if name == band.signal:  # a signal of its own
            return watch.observe({HEALTH + name: value})[1]
        watch.observe({HEALTH + name: 1.0})  # the previous rollout: relative and absolute changes are alike from 1
        return watch.observe({HEALTH + name: 1.0 + value})[1]

    if band.high is not None:
        assert alarms_at(band.high - 1e-6) == []
        [alarm] = alarms_at(band.high + 1e-6)
        assert alarm.side == "above" and band.above in alarm.message
    if band.low is not None:
        assert alarms_at(band.low + 1e-6) == []
        [alarm] = alarms_at(band.low - 1e-6)
        assert alarm.side == "below" and band.below in alarm.message
