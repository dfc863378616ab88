"""Stand-in for slime.observability.metric_utils: the step slime logs rollout and eval metrics at."""


def compute_rollout_step(args, rollout_id):
    # slime plots against the training step instead when --wandb-always-use-train-step is set.
    if args.wandb_always_use_train_step:
        return rollout_id * args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
    return rollout_id
