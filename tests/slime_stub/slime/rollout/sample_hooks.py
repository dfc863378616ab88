"""Stand-in for slime.rollout.sample_hooks: --rollout-sample-hook-path functions applied to each generated sample."""

import inspect

from slime.utils.misc import load_function
from slime.utils.types import Sample


async def _apply_to_sample(args, sample: Sample, paths: list[str], **kwargs) -> Sample:
    for path in paths:
        hook = load_function(path)
        parameters = inspect.signature(hook).parameters
        accepts_all = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        result = hook(
            args, sample, **(kwargs if accepts_all else {k: v for k, v in kwargs.items() if k in parameters})
        )
        if inspect.isawaitable(result):
            result = await result
        if result is not None:
            if not isinstance(result, Sample):
                raise TypeError(
                    f"Rollout sample hook {path!r} returned {type(result).__name__}, expected Sample or None."
                )
            sample = result
    return sample


async def apply_rollout_sample_hooks(args, value, **kwargs):
    paths = getattr(args, "rollout_sample_hook_path", None) or []
    if not paths:
        return value
    kwargs.setdefault("rollout_id", None)
    if isinstance(value, Sample):
        return await _apply_to_sample(args, value, paths, **kwargs)
    if isinstance(value, list):
        return [await apply_rollout_sample_hooks(args, item, **kwargs) for item in value]
    raise TypeError(f"Rollout sample hooks expected Sample or list, got {type(value).__name__}.")
