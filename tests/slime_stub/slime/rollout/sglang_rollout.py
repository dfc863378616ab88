"""Stand-in for slime.rollout.sglang_rollout: the GenerateState singleton."""

import functools
from argparse import Namespace

from transformers import AutoTokenizer


class _Singleton(type):
    _instances: dict = {}

    def __call__(cls, *args, **kwargs):
        if cls not in cls._instances:
            cls._instances[cls] = super().__call__(*args, **kwargs)
        return cls._instances[cls]


@functools.cache
def _load_tokenizer(path: str):
    # slime loads it once per process; the tests rebuild the singleton often, so keep the loaded copy.
    return AutoTokenizer.from_pretrained(path, trust_remote_code=True)


class GenerateState(metaclass=_Singleton):
    """Process-wide rollout state; the first construction fixes args and tokenizer, as in slime."""

    def __init__(self, args: Namespace) -> None:
        self.args = args
        self.tokenizer = _load_tokenizer(args.hf_checkpoint)
        self.reset()

    def reset(self) -> None:
        self.remaining_batch_size = 0
        self.pendings = set()
        self.aborted = False


def reset_generate_state() -> None:
    """Test helper (not in slime): forget the singleton so the next GenerateState(args) is fresh."""
    _Singleton._instances.pop(GenerateState, None)
