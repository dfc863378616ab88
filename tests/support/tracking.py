"""What slime's logging_utils.log would send to wandb and TensorBoard, recorded instead of sent.

Works on the stand-in and on real slime alike: both modules look up `wandb` and `_TensorboardAdapter` when
log() runs, so replacing those two names records every call in the order slime makes them.
"""

import contextlib
import numbers


@contextlib.contextmanager
def record_tracking():
    """Yields the list of calls: {"backend": "wandb", "metrics"} or {"backend": "tensorboard", "metrics", "step"}."""
    from slime.observability import logging_utils

    calls: list[dict] = []

    class Wandb:
        @staticmethod
        def log(metrics, *args, **kwargs):
            calls.append({"backend": "wandb", "metrics": dict(metrics)})

    class TensorboardAdapter:
        def __init__(self, args):
            pass

        def log(self, data, step):
            not_scalars = {k: v for k, v in data.items() if not isinstance(v, numbers.Real)}
            if not_scalars:  # SummaryWriter.add_scalar takes numbers only
                raise TypeError(f"SummaryWriter.add_scalar takes numbers; got {not_scalars}")
            calls.append({"backend": "tensorboard", "metrics": dict(data), "step": step})

    saved = logging_utils.wandb, logging_utils._TensorboardAdapter
    logging_utils.wandb, logging_utils._TensorboardAdapter = Wandb(), TensorboardAdapter
    try:
        yield calls
    finally:
        logging_utils.wandb, logging_utils._TensorboardAdapter = saved
