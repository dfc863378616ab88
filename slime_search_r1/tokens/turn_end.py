"""Where a model turn ends: one set of rules for every engine answer, whatever its finish_reason.

SGLang ends a request at the token that completes a stop string, at a stop token or EOS (kept in the output), or at
max_new_tokens. Its answers do not always say so: an abort (slime's, or a weight update pausing the engines) runs
one more decode step whose token is appended unchecked, so an aborted answer can already end its turn; speculative
decoding can leave an EOS inside an answer that a later stop string ended; 0.5.15.post1 says length where 0.5.23
says stop for a stop completed by the last allowed token; an engine may run past stop strings. settle() reads every
answer the same way, over what the turn sampled before an abort and what it samples now:

  its first end: a stop string completes (the request's and the protocol's), or a stop token / EOS  -> stop
  else an end the engine saw and this reader cannot (an EOS nobody told it of)                       -> stop
  else the call's token budget (max_new_tokens) used up                                              -> length
  else an aborted answer, cut mid-turn                                                               -> abort

Tokens after the end are dropped: what is kept is a prefix of what was sampled, so every kept id and log prob is
the engine's. A turn that ended is never continued; resuming (slime's --partial-rollout) asks the engine only to go
on with a turn cut mid-way.
"""

import base64
import json
import os
from array import array
from dataclasses import dataclass, replace
from functools import lru_cache

from slime_search_r1.episode import Turn

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
