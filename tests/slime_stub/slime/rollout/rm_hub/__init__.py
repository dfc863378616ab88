"""Stand-in for slime.rollout.rm_hub: the reward of a sample (or a group) through --custom-rm-path, as slime calls it.

slime's built-in rule-based rewards (deepscaler, f1, gpqa, ...) are not imitated: the plugin always has its own."""

import asyncio

from slime.utils.misc import load_function


async def async_rm(args, sample, **kwargs):
    if sample.custom_rm_path:  # per-sample (from an eval dataset config) first
        return await load_function(sample.custom_rm_path)(args, sample, **kwargs)
    if args.custom_rm_path is not None:
        return await load_function(args.custom_rm_path)(args, sample, **kwargs)
    raise NotImplementedError("the stand-in of slime computes rewards through --custom-rm-path only")


async def batched_async_rm(args, samples, **kwargs):
    if args.custom_rm_path is not None:
        return await load_function(args.custom_rm_path)(args, samples, **kwargs)
    return await asyncio.gather(*(async_rm(args, sample, **kwargs) for sample in samples))
