"""Group-normalised rewards over the samples that stay in the loss (slime's --custom-reward-post-process-path).

slime turns rewards into GRPO advantages in RolloutManager._post_process_rewards (slime/ray/rollout.py):
each group of n_samples_per_prompt rewards is centred on its mean (and divided by its std for grpo, gspo
and cispo). `remove_sample` is applied only afterwards, by zeroing that sample's loss mask, so a FAILED
sample (search still down after its retries, reward 0) still lowers its siblings' baseline and shrinks
their std. This hook is slime's computation with removed samples left out of their group's statistics;
they get advantage 0, which their zeroed loss mask ignores anyway.

A dynamic-sampling filter that drops groups holding a removed sample would also keep advantages right,
but slime then generates replacement groups (over_sampling_batch_size prompts per refill, the whole
rollout_batch_size by default), and a search outage would drop every group; this hook keeps every batch
full with no extra generation.
"""

GROUP_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo")


def post_process_rewards(args, samples) -> tuple[list[float], list[float]]:
    """(raw rewards, rewards to train on) for slime's flat sample list, as slime computes them minus removed ones.

    Groups are formed as slime forms them: consecutive runs of n_samples_per_prompt when the batch holds
    n_samples_per_prompt * rollout_batch_size samples, otherwise the whole batch as one group.
    """
    import torch  # here, not at the top: the launch check reads the estimator names above without loading torch

    raw_rewards = [sample.get_reward_value(args) for sample in samples]
    if args.advantage_estimator not in GROUP_NORMALIZED_ESTIMATORS or not args.rewards_normalization:
        return raw_rewards, raw_rewards

    # float32, as slime computes it, so kept samples get slime's numbers exactly when nothing is removed
    rewards = torch.tensor(raw_rewards, dtype=torch.float)
    group_size = args.n_samples_per_prompt
    if len(samples) != group_size * args.rollout_batch_size:
        group_size = len(samples)
    divide_by_std = args.advantage_estimator in STD_NORMALIZED_ESTIMATORS and args.grpo_std_normalization
    advantages = torch.zeros_like(rewards)
    for start in range(0, len(samples), group_size):
        kept = [i for i in range(start, start + group_size) if not samples[i].remove_sample]
        if not kept:
            continue
        centered = rewards[kept] - rewards[kept].mean()
        if divide_by_std and len(kept) > 1:  # the std of one sample is undefined; its centred value is 0
            centered = centered / (centered.std() + 1e-6)
        advantages[kept] = centered
    return raw_rewards, advantages.tolist()
