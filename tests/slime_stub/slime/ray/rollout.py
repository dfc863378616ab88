"""Stand-in for the one piece of slime.ray.rollout the tests compare against: RolloutManager's reward
post-processing (GRPO group normalisation), written from slime's source. The tests read this method out of
the file (tests/support/slime_group_math.py), as they read it out of a real checkout, so keep it self-contained.
"""

import torch


class RolloutManager:
    def _post_process_rewards(self, samples):
        if self.custom_reward_post_process_func is not None:
            return self.custom_reward_post_process_func(self.args, samples)

        raw_rewards = [sample.get_reward_value(self.args) for sample in samples]
        group_estimators = ["grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"]
        if self.args.advantage_estimator not in group_estimators or not self.args.rewards_normalization:
            return raw_rewards, raw_rewards

        rewards = torch.tensor(raw_rewards, dtype=torch.float)
        if rewards.shape[-1] == self.args.n_samples_per_prompt * self.args.rollout_batch_size:
            rewards = rewards.reshape(-1, self.args.n_samples_per_prompt)  # one row per prompt
        else:
            rewards = rewards.view(-1, rewards.shape[-1])  # uneven groups: the whole batch is one group
        rewards = rewards - rewards.mean(dim=-1, keepdim=True)
        if self.args.advantage_estimator in ["grpo", "gspo", "cispo"] and self.args.grpo_std_normalization:
            rewards = rewards / (rewards.std(dim=-1, keepdim=True) + 1e-6)
        return raw_rewards, rewards.flatten().tolist()
