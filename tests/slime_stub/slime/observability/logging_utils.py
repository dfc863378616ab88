"""Stand-in for slime.observability.logging_utils.log: slime's one call that sends metrics to wandb and TensorBoard.

As in slime: wandb gets the whole dict (step key included) when args.use_wandb; TensorBoard gets every other key
at metrics[step_key] when args.use_tensorboard; with neither, nothing is logged. slime's module holds the `wandb`
package and TensorBoard's `_TensorboardAdapter`; neither is installed here, so both names hold placeholders that
refuse to send. Tests put recorders in their place (tests/support/tracking.py), the same way for real slime.
"""


class _NotInstalled:
    def log(self, *args, **kwargs):
        raise RuntimeError("wandb is not installed in the tests; record with support.tracking.record_tracking()")


wandb = _NotInstalled()


class _TensorboardAdapter:
    def __init__(self, args):
        raise RuntimeError("TensorBoard is not set up in the tests; record with support.tracking.record_tracking()")


def log(args, metrics, step_key: str):
    if args.use_wandb:
        wandb.log(metrics)

    if args.use_tensorboard:
        metrics_except_step = {k: v for k, v in metrics.items() if k != step_key}
        _TensorboardAdapter(args).log(data=metrics_except_step, step=metrics[step_key])
