"""Stand-in for slime.rollout.sglang_rollout: the GenerateState singleton, get_model_url, and the path a sample takes
through slime's rollout (generate_and_rm, generate_and_rm_group, abort), partial rollout included: on abort, every
group of an unfinished task comes back, its samples with a response tagged with start_rollout_id; the next rollout
masks their earlier tokens (--mask-offpolicy-in-partial-rollout), returns finished ones as they are and hands the
others to the custom generate function as they were; a generate function may return an episode as several samples
(a list), scored as slime scores them. Written from slime's source, behaviour for behaviour; slime's
tracing decorators are left out (they only record spans)."""

import asyncio
import functools
import inspect
import uuid
from argparse import Namespace
from contextlib import contextmanager
from typing import Any

import numpy as np
from transformers import AutoTokenizer

from slime.backends.sglang_utils.server_control import abort_servers_until_idle
from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.rollout.sample_hooks import apply_rollout_sample_hooks
from slime.utils.http_utils import get, get_rollout_num_engines
from slime.utils.misc import SingletonMeta, load_function
from slime.utils.types import Sample


@functools.cache
def _load_tokenizer(path: str):
    # slime loads it once per process; the tests rebuild the singleton often, so keep the loaded copy.
    return AutoTokenizer.from_pretrained(path, trust_remote_code=True)


def get_model_url(args: Namespace, model_name: str, endpoint: str = "/generate") -> str:
    """The router of `model_name` from --sglang-config (args.sglang_model_routers), else slime's default router."""
    routers = getattr(args, "sglang_model_routers", None)
    if routers and model_name in routers:
        ip, port = routers[model_name]
        return f"http://{ip}:{port}{endpoint}"
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"


class GenerateState(metaclass=SingletonMeta):
    """Process-wide rollout state; the first construction fixes args and tokenizer, as in slime."""

    def __init__(self, args: Namespace) -> None:
        self.args = args
        self.tokenizer = _load_tokenizer(args.hf_checkpoint)
        self.processor = None  # text-only models have no processor
        self.semaphore = asyncio.Semaphore(args.sglang_server_concurrency * get_rollout_num_engines(args))
        self.sampling_params: dict[str, Any] = dict(
            temperature=args.rollout_temperature,
            top_p=args.rollout_top_p,
            top_k=args.rollout_top_k,
            max_new_tokens=args.rollout_max_response_len,
            stop=args.rollout_stop,
            stop_token_ids=args.rollout_stop_token_ids,
            skip_special_tokens=args.rollout_skip_special_tokens,
            no_stop_trim=True,
            spaces_between_special_tokens=False,
        )
        if args.rollout_top_p != 1.0:
            self.sampling_params["custom_params"] = {"return_top_p_token_ids": True}
        if getattr(args, "sglang_enable_deterministic_inference", False):
            self.group_sampling_seeds = [args.rollout_seed + i for i in range(args.n_samples_per_prompt)]
        self.dp_counts = [0] * (args.sglang_dp_size or 1)
        self.dp_rank = 0
        self.reset()

    @contextmanager
    def dp_rank_context(self):
        candidates = [i for i, count in enumerate(self.dp_counts) if count == min(self.dp_counts)]
        dp_rank = int(np.random.choice(candidates))
        self.dp_counts[dp_rank] += 1
        self.dp_rank = dp_rank
        try:
            yield dp_rank
        finally:
            self.dp_counts[dp_rank] -= 1

    def reset(self) -> None:
        self.remaining_batch_size = 0
        self.pendings = set()
        self.aborted = False

    def submit_generate_tasks(self, samples: list[list[Sample]]) -> None:
        for group in samples:
            self.pendings.add(
                asyncio.create_task(
                    generate_and_rm_group(
                        self.args, group, sampling_params=self.sampling_params.copy(), evaluation=False
                    )
                )
            )
        self.remaining_batch_size += len(samples)


async def generate_and_rm(
    args, sample: Sample, sampling_params: dict, evaluation: bool = False
) -> Sample | list[Sample]:
    # partial rollout: the tokens an earlier policy wrote leave the loss
    if args.partial_rollout and args.mask_offpolicy_in_partial_rollout and sample.response_length > 0:
        sample.loss_mask = [0] * sample.response_length

    # a sample that finished before the abort (its group did not) comes back as it is
    if sample.status == Sample.Status.COMPLETED or sample.status == Sample.Status.TRUNCATED:
        assert sample.response is not None
        if not args.group_rm:
            assert sample.reward is not None
        return sample

    state = GenerateState(args)
    async with state.semaphore:
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return sample
        with state.dp_rank_context():
            custom_func_path = getattr(sample, "generate_function_path", None) or args.custom_generate_function_path
            if custom_func_path is None:
                raise NotImplementedError("the stand-in of slime runs custom generate functions only")
            custom_generate_func = load_function(custom_func_path)
            if "evaluation" in inspect.signature(custom_generate_func).parameters:
                sample = await custom_generate_func(args, sample, sampling_params, evaluation=evaluation)
            else:
                sample = await custom_generate_func(args, sample, sampling_params)

    sample = await apply_rollout_sample_hooks(args, sample, evaluation=evaluation)
    if args.group_rm:
        return sample
    if isinstance(sample, list):  # a generate function that returns one episode as several samples
        samples = sample
        if any(sample.status == Sample.Status.ABORTED for sample in samples):
            return samples
        need_reward = [sample for sample in samples if sample.reward is None]
        rewards = await batched_async_rm(args, need_reward)
        for sample, reward in zip(need_reward, rewards, strict=False):
            sample.reward = reward
        return samples
    if sample.status == Sample.Status.ABORTED:
        return sample
    if sample.reward is None:
        sample.reward = await async_rm(args, sample)
    return sample


async def generate_and_rm_group(args, group: list[Sample], sampling_params: dict, evaluation: bool = False):
    state = GenerateState(args)
    if state.aborted:
        return group
    for sample in group:
        if sample.session_id is None:
            sample.session_id = str(uuid.uuid4())
    tasks = []
    for idx, sample in enumerate(group):
        current_sampling_params = sampling_params.copy()
        if getattr(args, "sglang_enable_deterministic_inference", False):
            current_sampling_params["sampling_seed"] = state.group_sampling_seeds[idx]
        tasks.append(
            asyncio.create_task(generate_and_rm(args, sample, current_sampling_params, evaluation=evaluation))
        )
    group = await asyncio.gather(*tasks)
    if not state.aborted and args.group_rm:
        rewards = await batched_async_rm(args, group)
        for sample, reward in zip(group, rewards, strict=False):
            sample.reward = reward
    return group


async def abort(args, rollout_id: int) -> list[list[Sample]]:
    aborted_samples = []
    state = GenerateState(args)
    assert not state.aborted
    state.aborted = True

    response = await get(f"http://{args.sglang_router_ip}:{args.sglang_router_port}/workers")
    urls = [worker["url"] for worker in response["workers"]]
    await abort_servers_until_idle(urls)

    # every pending task finishes; with partial rollout their groups go back to the data buffer
    while state.pendings:
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        if not args.partial_rollout:
            continue
        for task in done:
            group = task.result()
            for sample in group:
                if sample.response and "start_rollout_id" not in sample.metadata:
                    sample.metadata["start_rollout_id"] = rollout_id
            aborted_samples.append(group)
    return aborted_samples
