"""Stand-in for slime.observability.logging_utils.log: slime's one call that sends metrics to wandb and TensorBoard.

As in slime: wandb gets the whole dict (step key included) when args.use_wandb; TensorBoard gets every other key
as a scalar at metrics[step_key] when args.use_tensorboard; with neither, nothing is logged. Instead of sending,
each backend's call is appended to `logged` (a test hook, not in slime).
"""

import numbers

logged: list[dict] = []


def log(args, metrics, step_key: str):
    if args.use_wandb:
        logged.append({"backend": "wandb", "metrics": dict(metrics)})

    if args.use_tensorboard:
        metrics_except_step = {k: v for k, v in metrics.items() if k != step_key}
        step = metrics[step_key]  # a KeyError in slime too
        not_scalars = {k: v for k, v in metrics_except_step.items() if not isinstance(v, numbers.Real)}
        if not_scalars:
            raise TypeError(f"SummaryWriter.add_scalar takes numbers; got {not_scalars}")
        logged.append({"backend": "tensorboard", "metrics": metrics_except_step, "step": step})
