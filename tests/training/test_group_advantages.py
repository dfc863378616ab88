"""FAILED samples stay out of their group's advantages: post_process_rewards against slime's own group math.

slime_post_process_rewards is slime's RolloutManager._post_process_rewards, read from the slime under test
(SLIME_SRC, or the stand-in written from it), so "slime's math" here is the code slime runs.
"""

from argparse import Namespace

import pytest

from generate_with_search import generate, post_process_rewards, reward_func
from slime.utils.types import Sample
from support.slime_group_math import slime_post_process_rewards
from support.slime_rollout import chat_prompt, slime_sampling_params


def grpo_args(n=4, batch=2, **overrides) -> Namespace:
    values = dict(
        n_samples_per_prompt=n,
        rollout_batch_size=batch,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
    )
    values.update(overrides)
    return Namespace(**values)


def samples_with(rewards, removed=()) -> list[Sample]:
    return [Sample(index=i, reward=r, remove_sample=i in removed) for i, r in enumerate(rewards)]


def slime_advantages(args, samples) -> list[float]:
    return slime_post_process_rewards(args, samples)[1]


def test_without_removed_samples_the_advantages_are_slimes():
    args = grpo_args(n=4, batch=3)
    samples = samples_with([1.0, 0.2, 0.0, 1.0, 0.2, 0.2, 0.1, 1.0, 0.0, 0.0, 1.0, 0.3])
    raw, advantages = post_process_rewards(args, samples)
    expected_raw, expected = slime_post_process_rewards(args, samples)
    assert raw == expected_raw
    assert advantages == pytest.approx(expected, abs=1e-6)


def test_a_failed_sample_does_not_move_its_siblings_advantages():
    args = grpo_args(n=4, batch=2)
    rewards = [1.0, 0.2, 1.0, 0.0, 0.2, 1.0, 0.0, 0.1]
    samples = samples_with(rewards, removed={3})  # the failed search: reward 0, remove_sample
    _, advantages = post_process_rewards(args, samples)

    siblings_alone = slime_advantages(grpo_args(n=3, batch=1), samples_with(rewards[:3]))
    assert advantages[:3] == pytest.approx(siblings_alone, abs=1e-6)


def test_slime_alone_lets_the_failed_sample_move_its_siblings():
    """The defect the hook exists for: slime's default counts the removed sample's reward in its group."""
    rewards = [1.0, 0.2, 1.0, 0.0]
    with_failed = slime_advantages(grpo_args(n=4, batch=1), samples_with(rewards, removed={3}))
    siblings_alone = slime_advantages(grpo_args(n=3, batch=1), samples_with(rewards[:3]))
    assert with_failed[:3] != pytest.approx(siblings_alone, abs=1e-3)


def test_the_other_groups_keep_slime_s_advantages():
    args = grpo_args(n=4, batch=2)
    samples = samples_with([1.0, 0.2, 1.0, 0.0, 0.2, 1.0, 0.0, 0.1], removed={3})
    assert post_process_rewards(args, samples)[1][4:] == pytest.approx(slime_advantages(args, samples)[4:], abs=1e-6)


def test_a_removed_sample_gets_advantage_zero_and_keeps_its_raw_reward():
    samples = samples_with([1.0, 0.2, 1.0, 0.7], removed={3})
    raw, advantages = post_process_rewards(grpo_args(n=4, batch=1), samples)
    assert advantages[3] == 0.0
    assert raw[3] == 0.7


def test_a_group_whose_samples_were_all_removed_gets_zeros():
    _, advantages = post_process_rewards(grpo_args(n=3, batch=1), samples_with([0.0, 0.0, 0.0], removed={0, 1, 2}))
    assert advantages == [0.0, 0.0, 0.0]


def test_a_group_with_one_kept_sample_gets_zero_not_nan():
    _, advantages = post_process_rewards(grpo_args(n=3, batch=1), samples_with([1.0, 0.0, 0.0], removed={1, 2}))
    assert advantages == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "overrides",
    [
        {"advantage_estimator": "gspo"},
        {"advantage_estimator": "cispo"},
        {"advantage_estimator": "reinforce_plus_plus_baseline"},  # centred, never divided by the std
        {"grpo_std_normalization": False},  # Dr. GRPO
        {"rewards_normalization": False},
        {"advantage_estimator": "ppo"},
        {"advantage_estimator": "reinforce_plus_plus"},
    ],
)
def test_every_estimator_setting_follows_slime(overrides):
    args = grpo_args(n=4, batch=2, **overrides)
    samples = samples_with([1.0, 0.2, 0.9, 0.0, 0.2, 1.0, 0.0, 0.1])
    assert post_process_rewards(args, samples)[1] == pytest.approx(slime_advantages(args, samples), abs=1e-6)


def test_an_uneven_batch_is_one_group_as_in_slime():
    args = grpo_args(n=4, batch=2)
    samples = samples_with([1.0, 0.2, 0.9, 0.0, 0.2, 1.0])  # 6 != 4 * 2 (e.g. a custom rollout)
    assert post_process_rewards(args, samples)[1] == pytest.approx(slime_advantages(args, samples), abs=1e-6)


def test_dict_rewards_are_read_with_the_reward_key():
    args = grpo_args(n=2, batch=1, reward_key="score")
    samples = [Sample(reward={"score": 1.0, "em": 1.0}), Sample(reward={"score": 0.2, "em": 0.0})]
    raw, advantages = post_process_rewards(args, samples)
    assert raw == [1.0, 0.2]
    assert advantages == pytest.approx(slime_advantages(args, samples), abs=1e-6)


QUESTIONS = {"Right one": "Paris", "Wrong one": "Berlin", "Also right": "Paris", "Search breaks": "Paris"}


async def test_a_group_from_generate_with_one_failed_search(
    make_args, tokenizer, engine, policy, retriever, search_config
):
    """Four samples of one GRPO group through generate() and reward_func(); the last one's search stays down."""
    search_turn = "<think>Look it up.</think>\n<search> capital of France </search>"
    for question, answer in QUESTIONS.items():
        policy.scripts[question + "?"] = [search_turn, f"<think>Found it.</think>\n<answer> {answer} </answer>"]
    search_config.update(search_attempts=1)
    args = make_args(n_samples_per_prompt=4, rollout_batch_size=1)
    samples = []
    for question in QUESTIONS:  # in order, so that only the last one meets the outage
        retriever.down = question == "Search breaks"
        sample = Sample(index=len(samples), prompt=chat_prompt(tokenizer, question), label={"target": ["Paris"]})
        sample = await generate(args, sample, slime_sampling_params(1024))
        sample.reward = await reward_func(args, sample)
        samples.append(sample)

    assert [s.status for s in samples] == [Sample.Status.COMPLETED] * 3 + [Sample.Status.FAILED]
    assert [s.remove_sample for s in samples] == [False, False, False, True]
    _, advantages = post_process_rewards(args, samples)
    siblings_alone = slime_advantages(grpo_args(n=3, batch=1), samples[:3])
    assert advantages[:3] == pytest.approx(siblings_alone, abs=1e-6)
    assert advantages[3] == 0.0


def test_integer_rewards_are_normalised_as_floats():
    """A custom reward function may return ints; slime builds a float tensor from them, and so does the hook."""
    args = grpo_args(n=4, batch=1)
    samples = samples_with([1, 0, 1, 1])
    assert post_process_rewards(args, samples)[1] == pytest.approx(slime_advantages(args, samples), abs=1e-6)


def test_a_group_whose_samples_were_all_removed_does_not_stop_the_next_groups():
    args = grpo_args(n=3, batch=2)
    samples = samples_with([0.0, 0.0, 0.0, 1.0, 0.2, 0.0], removed={0, 1, 2})  # the first prompt's searches all failed
    expected = slime_advantages(grpo_args(n=3, batch=1), samples_with([1.0, 0.2, 0.0]))
    assert post_process_rewards(args, samples)[1] == pytest.approx([0.0, 0.0, 0.0, *expected], abs=1e-6)


def split_samples(rewards_by_trajectory, parts, removed=()) -> list[Sample]:
    """Each trajectory's reward on `parts[t]` samples sharing its rollout_id (a split long-horizon episode)."""
    samples = []
    for t, (reward, count) in enumerate(zip(rewards_by_trajectory, parts, strict=True)):
        for _ in range(count):
            samples.append(Sample(index=len(samples), reward=reward, remove_sample=t in removed, rollout_id=100 + t))
    return samples


def test_a_split_trajectory_counts_once_in_its_group_and_each_part_gets_its_advantage():
    args = grpo_args(n=3, batch=1)
    samples = split_samples([1.0, 0.0, 0.5], parts=[3, 1, 2])
    expected = slime_advantages(args, samples_with([1.0, 0.0, 0.5]))  # one value per trajectory
    _, advantages = post_process_rewards(args, samples)
    assert advantages == pytest.approx([expected[0]] * 3 + [expected[1]] + [expected[2]] * 2, abs=1e-6)


def test_samples_without_a_rollout_id_are_trajectories_of_their_own():
    args = grpo_args(n=4, batch=1)
    samples = samples_with([1.0, 0.2, 1.0, 0.0])  # rollout_id None on each, equal rewards in two of them
    assert post_process_rewards(args, samples)[1] == pytest.approx(slime_advantages(args, samples), abs=1e-6)


@pytest.mark.parametrize(
    "change", [{"reward": 0.0}, {"remove_sample": True}], ids=["reward differs", "remove_sample differs"]
)
def test_parts_of_one_trajectory_that_disagree_are_refused(change):
    samples = split_samples([1.0, 0.0], parts=[3, 1])
    for key, value in change.items():
        setattr(samples[1], key, value)  # the second part of the first trajectory
    with pytest.raises(ValueError) as info:
        post_process_rewards(grpo_args(n=2, batch=1), samples)
    assert str(info.value) == (
        "samples [0, 1, 2] share rollout_id 100 (one trajectory) but differ in reward or remove_sample; every sample "
        "of a trajectory must carry the trajectory's"
    )
