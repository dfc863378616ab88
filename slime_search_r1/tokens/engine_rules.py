"""SGLang's rules for one /generate request, as its source says: where the engine ends a turn, and which lengths it
accepts. The rollout reads every answer by them rather than by the finish_reason the engine reports, and sends no
request the engine would refuse. Mirrored from SGLang 0.5.15.post1 (slime's image) and 0.5.23, files under srt/;
slime_search_r1/standin/sglang_rules.py, the stand-in engines' rules, cites each one where it applies.

Where a turn ends: settle()  (managers/schedule_batch.py Req.update_finish_state, managers/scheduler.py abort_request,
configs/model_config.py for the EOS set). SGLang ends a request at the token that completes a stop string, at a stop
token or EOS (kept in the output), or at max_new_tokens. Its answers do not always say so: an abort (slime's, or a
weight update pausing the engines) runs one more decode step whose token is appended unchecked, so an aborted answer
can already end its turn; speculative decoding can leave an EOS inside an answer that a later stop string ended;
0.5.15.post1 says length where 0.5.23 says stop for a stop completed by the last allowed token; an engine may run
past stop strings. settle() reads every answer the same way, over what the turn sampled before an abort and what it
samples now:

  its first end: a stop string completes (the request's and the protocol's), or a stop token / EOS  -> stop
  else an end the engine saw and this reader cannot (an EOS nobody told it of)                       -> stop
  else the call's token budget (max_new_tokens) used up                                              -> length
  else an aborted answer, cut mid-turn                                                               -> abort

Tokens after the end are dropped: what is kept is a prefix of what was sampled, so every kept id and log prob is
the engine's. A turn that ended is never continued; resuming (slime's --partial-rollout) asks the engine only to go
on with a turn cut mid-way.

Which lengths it accepts: EngineLimits  (managers/tokenizer_manager.py _validate_one_request, managers/scheduler.py
init_req_max_new_tokens, managers/tp_worker.py and managers/utils.py for the longest input,
arg_groups/speculative_hook.py for the draft sizes, utils/hf_transformers/common.py for config.json's length). A
request of L input tokens is checked against the served context length C: the tokenizer manager refuses L + R >= C
and L + R + max_new_tokens > C, where R is the slots EAGLE-style speculative decoding reserves for draft tokens (0
without it); the scheduler refuses L >= C - 6 and lowers max_new_tokens to C - L - 2 without saying so. A refusal
is HTTP 400. So a request is sent only with L <= C - max(7, R + 1), asking for at most C - L - max(2, R) new tokens:
everything asked for can be sampled (the episode's budget, loop.py's Budget, stays within that).

C and R come from slime's --sglang-* flags (slime passes SGLang's server args through as args.sglang_*): C is
--sglang-context-length, else the context length SGLang derives from the checkpoint's config.json; R from
--sglang-speculative-algorithm and its sizes (SGLang's largest automatic choice where they are left to it). Where the
flags say less than the engine does (no --sglang-context-length and no config.json on this machine, a KV pool
smaller than a context, speculative sizes in a config file), the engine's refusal states its figures: they are
learned (LEARNED_LIMITS, kept for the rest of the process) and the turn is asked again within them, or the episode
has reached the limit (loop.py).
"""

import base64
import json
import logging
import os
import re
import threading
from array import array
from dataclasses import dataclass, replace
from functools import lru_cache

from slime_search_r1.episode import Turn

logger = logging.getLogger(__name__)

# ---- where a turn ends: settle() ------------------------------------------------------------------------------------

# slime reads either name of each (slime/utils/types.py)
_TOP_P_ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


@dataclass(frozen=True)
class TurnEnds:
    """What ends a turn: the stop strings and stop token ids of the request, with the served model's EOS set."""

    stop_strings: tuple[str, ...]
    stop_ids: frozenset[int]

    @classmethod
    def of(cls, sampling_params: dict, protocol_stops: tuple[str, ...], eos_ids: frozenset[int]) -> "TurnEnds":
        """The ends of a request sent with `sampling_params`; SGLang's ignore_eos turns off stop_token_ids too."""
        stop = sampling_params.get("stop") or ()
        strings = tuple(dict.fromkeys([*([stop] if isinstance(stop, str) else stop), *protocol_stops]))
        if sampling_params.get("ignore_eos"):
            return cls(strings, frozenset())
        return cls(strings, frozenset(sampling_params.get("stop_token_ids") or ()) | eos_ids)


def model_eos_ids(hf_checkpoint: str | None, tokenizer) -> frozenset[int]:
    """The served model's EOS set as SGLang builds it: the tokenizer's eos_token_id and, for a checkpoint on disk,
    eos_token_id of its config.json and generation_config.json (a hub name contributes the tokenizer's alone)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    return frozenset(ids | _config_eos_ids(hf_checkpoint))


@lru_cache(maxsize=8)
def _config_eos_ids(hf_checkpoint: str | None) -> frozenset[int]:
    ids: set[int] = set()
    if not hf_checkpoint or not os.path.isdir(hf_checkpoint):
        return frozenset()
    for name in ("config.json", "generation_config.json"):
        try:
            with open(os.path.join(hf_checkpoint, name), encoding="utf-8") as file:
                value = json.load(file).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        ids.update(v for v in (value if isinstance(value, list) else [value]) if type(v) is int)
    return frozenset(ids)


def first_end(ids: list[int], start: int, tokenizer, ends: TurnEnds) -> tuple[int, int | str] | None:
    """(how many of `ids` the turn keeps, what ended it) at the first end after position `start`, or None. The
    first `start` ids were sampled before an abort, and hold no end (they were settled then)."""
    token = next(((i + 1, ids[i]) for i in range(start, len(ids)) if ids[i] in ends.stop_ids), None)
    string = _first_stop_string(ids, start, tokenizer, ends.stop_strings)
    found = [end for end in (token, string) if end is not None]
    return min(found, key=lambda end: end[0]) if found else None


def _first_stop_string(ids: list[int], start: int, tokenizer, stops: tuple[str, ...]) -> tuple[int, str] | None:
    text = tokenizer.decode(ids, skip_special_tokens=False)
    hits = [(pos, stop) for stop in stops if (pos := text.find(stop)) >= 0]
    if not hits:
        return None
    pos, stop = min(hits)
    return cut_after_first_stop(ids, tokenizer, text, (stop,), low=start + 1), stop


def cut_after_first_stop(ids: list[int], tokenizer, text: str, stops: tuple[str, ...], low: int = 1) -> int:
    """How many of `ids` to keep so the turn ends with the token that completes its first stop string (all of them
    when none completes); the search starts at `low` tokens.

    An engine that honours stop strings already ends there; one that ran past them is cut, which keeps every kept
    token and log prob exact (they are a prefix of what was sampled).
    """
    hits = [(pos, stop) for stop in stops if (pos := text.find(stop)) >= 0]
    if not hits or len(ids) <= 1:
        return len(ids)
    pos, stop = min(hits)

    def holds_stop(count: int) -> bool:
        return tokenizer.decode(ids[:count], skip_special_tokens=False).find(stop) == pos

    if not holds_stop(len(ids) - 1):  # the usual case: the stop string ends in the last token
        return len(ids)
    low, high = max(1, min(low, len(ids) - 1)), len(ids) - 1
    while low < high:
        mid = (low + high) // 2
        if holds_stop(mid):
            high = mid
        else:
            low = mid + 1
    return low


def settle(answer: Turn, written: list[int], ends: TurnEnds, max_new_tokens: int | None, tokenizer) -> Turn:
    """The engine's `answer` as the turn it ends: cut after the turn's first end, its finish type by the rules above
    (module docstring), `engine_aborted` set when the engine said abort. `written`: what the turn sampled before an
    abort; `max_new_tokens`: what this call was offered."""
    aborted = answer.finish_type == "abort"
    end = first_end([*written, *answer.ids], len(written), tokenizer, ends)
    if end is not None and (answer.finish_type != "stop" or end[0] < len(written) + len(answer.ids)):
        settled = keep_first_tokens(answer, end[0] - len(written), "stop", end[1])
    elif answer.finish_type == "stop":  # it ends where the engine said (at an end seen above, or one it knows of)
        settled = answer
    elif aborted and max_new_tokens is not None and len(answer.ids) >= max_new_tokens:
        settled = keep_first_tokens(answer, max_new_tokens, "length")
    else:
        settled = answer
    return replace(settled, engine_aborted=aborted)


def keep_first_tokens(turn: Turn, count: int, finish_type: str = "stop", matched: int | str | None = None) -> Turn:
    """The turn cut after its first `count` tokens and ending as `finish_type` (what the engine answers for a turn
    that ends there): ids, log probs, weight-version spans, meta_info's log probs, top-p arrays and finish_reason."""
    meta_info = dict(turn.meta_info)
    meta_info["finish_reason"] = {"type": finish_type, **({"matched": matched} if matched is not None else {})}
    if finish_type == "length":
        meta_info["finish_reason"]["length"] = count
    if "output_token_logprobs" in meta_info:
        meta_info["output_token_logprobs"] = meta_info["output_token_logprobs"][:count]
    id_key = next((k for k in _TOP_P_ID_KEYS if meta_info.get(k) is not None), None)
    offsets_key = next((k for k in _TOP_P_OFFSET_KEYS if meta_info.get(k) is not None), None)
    if id_key and offsets_key:
        # the nucleus of token i is ids[offsets[i]:offsets[i + 1]]; slime reads lists as well as base64
        offsets = int32_values(meta_info[offsets_key])[: count + 1]
        meta_info[offsets_key] = offsets
        meta_info[id_key] = int32_values(meta_info[id_key])[: offsets[-1]]
    log_probs = None if turn.log_probs is None else turn.log_probs[:count]
    versions = [(start, min(end, count), version) for start, end, version in turn.versions if start < count]
    ids = turn.ids[:count]
    return replace(turn, ids=ids, finish_type=finish_type, log_probs=log_probs, meta_info=meta_info, versions=versions)


def int32_values(value) -> list[int]:
    """An int32 array as SGLang's top-p replay sends it (base64 of native int32, bytes, or a list) as ints."""
    if isinstance(value, str):
        value = base64.b64decode(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return array("i", bytes(value)).tolist()
    return [int(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]


# ---- which lengths it accepts: EngineLimits -------------------------------------------------------------------------

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
