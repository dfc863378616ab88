"""Stand-in for slime.rollout.sglang_rollout: the GenerateState singleton and get_model_url."""

import asyncio
import functools
from argparse import Namespace
from typing import Any

from transformers import AutoTokenizer

from slime.utils.http_utils import get_rollout_num_engines
from slime.utils.misc import SingletonMeta


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
        self.reset()

    def reset(self) -> None:
        self.remaining_batch_size = 0
        self.pendings = set()
        self.aborted = False
