"""The engine's length limits: what SGLang accepts of one /generate request, so the budget never asks for more.

SGLang (0.5.15.post1 and 0.5.23; LengthRules in slime_search_r1/standin/sglang_rules.py cites the source) checks a
request of L input tokens against the served context length C: its tokenizer manager refuses L + R >= C and L + R +
max_new_tokens > C, where R is the slots EAGLE-style speculative decoding reserves for draft tokens (0 without it);
its scheduler refuses L >= C - 6 and lowers max_new_tokens to C - L - 2 without saying so. A refusal is HTTP 400.
So a request is sent only with L <= C - max(7, R + 1), asking for at most C - L - max(2, R) new tokens: everything
asked for can be sampled.

C and R come from slime's --sglang-* flags (slime passes SGLang's server args through as args.sglang_*): C is
--sglang-context-length, else the context length SGLang derives from the checkpoint's config.json; R from
--sglang-speculative-algorithm and its sizes (SGLang's largest automatic choice where they are left to it). Where the
flags say less than the engine does (no --sglang-context-length and no config.json on this machine, a KV pool
smaller than a context, speculative sizes in a config file), the engine's refusal states its figures: they are
learned (learn_from_refusal, kept for the rest of the process) and the turn is asked again within them, or the
episode has reached the limit (loop.py).
"""

import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from functools import lru_cache

logger = logging.getLogger(__name__)

# Speculative algorithms that keep draft tokens in the output's slots (SpeculativeAlgorithm.is_eagle; NEXTN is
# EAGLE under another name): the tokenizer manager adds their reservation to every request's input.
DRAFT_SLOT_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP")
# SGLang's largest automatic (num_steps, eagle_topk, num_draft_tokens) when the flags leave them unset
# (arg_groups/speculative_hook.py, _auto_choose_speculative_params): the reservation is at most this.
AUTO_SPECULATIVE_SIZES = (5, 4, 8)
# Input tokens the scheduler refuses below C: max_req_input_len = (C - 1) - 5 (managers/tp_worker.py), and an input
# of that many tokens or more is refused (managers/utils.py validate_input_length).
SCHEDULER_INPUT_MARGIN = 6
# max_new_tokens is lowered to (C - 1) - L - 1 (managers/scheduler.py init_req_max_new_tokens).
SCHEDULER_OUTPUT_MARGIN = 2
# The config.json keys SGLang reads the context length from, in its order (utils/hf_transformers/common.py).
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
# The texts of SGLang's length refusals (HTTP 400): the tokenizer manager's two, the scheduler's, and 0.5.23's KV
# memory check.
LENGTH_REFUSALS = (
    "is longer than the model's context length",
    "exceeds the model's maximum context length",
    "exceeds the maximum allowed length",
    "exceeds the KV memory budget",
)


# The figures in those texts: (pattern, what its groups are). "counted" is input + reserved slots.
_TOTAL = re.compile(r"maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: (\d+) tokens from")
_INPUT = re.compile(r"The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)")
_SCHEDULER = re.compile(r"exceeds the maximum allowed length \((\d+) tokens\)")


def is_length_refusal(message: str) -> bool:
    """Whether an engine's error text is one of SGLang's length refusals."""
    return any(text in message for text in LENGTH_REFUSALS)


@dataclass(frozen=True)
class EngineLimits:
    """The served context length (None: unknown, no limit is applied) and the draft slots speculative decoding
    reserves per request."""

    context_length: int | None = None
    reserved: int = 0

    @classmethod
    def from_args(cls, args) -> "EngineLimits":
        """What slime's flags say, within what the engines' refusals have stated (LEARNED_LIMITS)."""
        return cls(served_context_length(args), reserved_draft_slots(args)).tighter(LEARNED_LIMITS.limits)

    def tighter(self, other: "EngineLimits") -> "EngineLimits":
        """The limits that satisfy both: the shorter context, the larger reservation."""
        lengths = [length for length in (self.context_length, other.context_length) if length is not None]
        return EngineLimits(min(lengths) if lengths else None, max(self.reserved, other.reserved))

    def new_tokens(self, input_length: int) -> int | None:
        """The most new tokens a request of `input_length` tokens can get (0: it is refused); None without a limit."""
        if self.context_length is None:
            return None
        if input_length > self.context_length - max(SCHEDULER_INPUT_MARGIN + 1, self.reserved + 1):
            return 0
        return max(0, self.context_length - input_length - max(SCHEDULER_OUTPUT_MARGIN, self.reserved))


def stated_limits(message: str, input_length: int) -> EngineLimits | None:
    """The limits a length refusal of a request of `input_length` tokens states: the tokenizer manager's give C and
    the input it counted (so the reservation), the scheduler's its longest input (C - 6, or less for a smaller KV
    pool); None for another text."""
    if match := _TOTAL.search(message):
        return EngineLimits(int(match[1]), max(0, int(match[2]) - input_length))
    if match := _INPUT.search(message):
        return EngineLimits(int(match[2]), max(0, int(match[1]) - input_length))
    if match := _SCHEDULER.search(message):
        return EngineLimits(int(match[1]) + SCHEDULER_INPUT_MARGIN)
    return None


class LearnedLimits:
    """The tightest limits the engines' refusals have stated in this process (slime's rollout manager, where every
    episode's generate() runs): later episodes stay within them from their first turn."""

    def __init__(self) -> None:
        self.limits = EngineLimits()
        self._lock = threading.Lock()

    def learn(self, stated: EngineLimits) -> EngineLimits:
        with self._lock:
            before, self.limits = self.limits, self.limits.tighter(stated)
        if self.limits != before:
            logger.warning(
                "the engine refused a request for its length: it serves a context of %s tokens and reserves %s per "
                "request, less than slime's --sglang-* flags tell; later requests stay within that (set "
                "--sglang-context-length and the speculative flags to say so from the start)",
                self.limits.context_length,
                self.limits.reserved,
            )
        return self.limits

    def forget(self) -> None:
        """Start over (a new run in the same process: tests, scripts)."""
        with self._lock:
            self.limits = EngineLimits()


LEARNED_LIMITS = LearnedLimits()


def served_context_length(args) -> int | None:
    """--sglang-context-length, else what SGLang derives from the checkpoint's config.json; None when neither is
    known (a hub name without a local copy)."""
    explicit = getattr(args, "sglang_context_length", None)
    if explicit:
        return int(explicit)
    checkpoint = getattr(args, "hf_checkpoint", None)
    return config_context_length(checkpoint) if checkpoint and os.path.isdir(checkpoint) else None


@lru_cache(maxsize=8)
def config_context_length(checkpoint: str) -> int | None:
    """The context length in the checkpoint's config.json (its text_config for a multimodal model): the first of
    CONTEXT_LENGTH_KEYS set, times rope_scaling's factor unless the scaling names its original length or is
    llama3's; None when the file cannot be read."""
    try:
        with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as file:
            config = json.load(file)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    scaling = config.get("rope_scaling") if isinstance(config.get("rope_scaling"), dict) else {}
    factor = scaling.get("factor", 1)
    if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        if isinstance(config.get(key), int | float) and not isinstance(config.get(key), bool):
            return int(factor * config[key])
    return None


def reserved_draft_slots(args) -> int:
    """max(eagle_topk * num_steps, num_draft_tokens) for an algorithm in DRAFT_SLOT_ALGORITHMS, sizes left unset
    taken at SGLang's largest automatic choice; 0 for any other algorithm or none."""
    algorithm = getattr(args, "sglang_speculative_algorithm", None)
    if not algorithm or str(algorithm).upper() not in DRAFT_SLOT_ALGORITHMS:
        return 0
    auto_steps, auto_topk, auto_drafts = AUTO_SPECULATIVE_SIZES
    steps = getattr(args, "sglang_speculative_num_steps", None) or auto_steps
    topk = getattr(args, "sglang_speculative_eagle_topk", None) or auto_topk
    drafts = getattr(args, "sglang_speculative_num_draft_tokens", None) or auto_drafts
    return max(int(topk) * int(steps), int(drafts))
