"""Group-normalised rewards over the samples that stay in the loss (slime's --custom-reward-post-process-path).

slime turns rewards into GRPO advantages in RolloutManager._post_process_rewards (slime/ray/rollout.py):
each group of n_samples_per_prompt rewards is centred on its mean (and divided by its std for grpo, gspo
and cispo). `remove_sample` is applied only afterwards, by zeroing that sample's loss mask, so a FAILED
sample (search still down after its retries, reward 0) still lowers its siblings' baseline and shrinks
their std. This hook is slime's computation with removed samples left out of their group's statistics;
they get advantage 0, which their zeroed loss mask ignores anyway.

An episode split into several samples (split_trajectories) is one trajectory: its samples share a rollout_id
and carry its reward, and slime's loss counts it once. Groups are formed over trajectories, each counted once with
its reward, and every sample of a trajectory gets the trajectory's advantage: a long episode split in four does
not weigh four times in its group's mean and std.

A dynamic-sampling filter that drops groups holding a removed sample would also keep advantages right,
but slime then generates replacement groups (over_sampling_batch_size prompts per refill, the whole
rollout_batch_size by default), and a search outage would drop every group; this hook keeps every batch
full with no extra generation.
"""

GROUP_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo")


def post_process_rewards(args, samples) -> tuple[list[float], list[float]]:
    """(raw rewards, rewards to train on) for slime's flat sample list, as slime computes them minus removed ones,
    one value per trajectory; first, SEARCH_R1_MAX_VERSION_LAG's mask against the policy being trained
    (training/staleness.py), as slime forms the batch right after this.

    Groups are formed as slime forms them, over trajectories: consecutive runs of n_samples_per_prompt when the
    batch holds n_samples_per_prompt * rollout_batch_size of them, otherwise the whole batch as one group.
    """
    # here, not at the top: the launch check reads the estimator names above without loading torch or the rollout
    import torch

    from slime_search_r1.training.staleness import mask_lagging_tokens

    mask_lagging_tokens(samples)

    raw_rewards = [sample.get_reward_value(args) for sample in samples]
    if args.advantage_estimator not in GROUP_NORMALIZED_ESTIMATORS or not args.rewards_normalization:
        return raw_rewards, raw_rewards

    trajectories = trajectories_of(samples)
    firsts = [members[0] for members in trajectories]
    # float32, as slime computes it, so kept samples get slime's numbers exactly when nothing is removed
    rewards = torch.tensor([raw_rewards[i] for i in firsts], dtype=torch.float)
    removed = [samples[i].remove_sample for i in firsts]
    count = len(trajectories)
    group_size = args.n_samples_per_prompt
    if count != group_size * args.rollout_batch_size:
        group_size = count
    divide_by_std = args.advantage_estimator in STD_NORMALIZED_ESTIMATORS and args.grpo_std_normalization
    advantages = torch.zeros_like(rewards)
    for start in range(0, count, group_size):
        kept = [i for i in range(start, start + group_size) if not removed[i]]
        if not kept:
            continue
        centered = rewards[kept] - rewards[kept].mean()
        if divide_by_std and len(kept) > 1:  # the std of one sample is undefined; its centred value is 0
            centered = centered / (centered.std() + 1e-6)
        advantages[kept] = centered
    per_sample = [0.0] * len(samples)
    for advantage, members in zip(advantages.tolist(), trajectories, strict=True):
        for i in members:
            per_sample[i] = advantage
    return raw_rewards, per_sample


def trajectories_of(samples) -> list[list[int]]:
    """The positions of each trajectory's samples, in order of first appearance: samples sharing a rollout_id are
    one (slime's loss reducer groups them so too), a sample without one is one alone. Its samples must agree on
    the reward and on remove_sample."""
    by_id: dict[object, list[int]] = {}
    for position, sample in enumerate(samples):
        key = ("sample", position) if sample.rollout_id is None else sample.rollout_id
        by_id.setdefault(key, []).append(position)
    trajectories = list(by_id.values())
    for members in trajectories:
        first = samples[members[0]]
        for i in members[1:]:
            if samples[i].reward != first.reward or samples[i].remove_sample != first.remove_sample:
                raise ValueError(
                    f"samples {members} share rollout_id {first.rollout_id} (one trajectory) but differ in reward or "
                    "remove_sample; every sample of a trajectory must carry the trajectory's"
                )
    return trajectories
