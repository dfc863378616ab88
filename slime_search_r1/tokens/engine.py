"""One generation turn against SGLang's native /generate: token ids in, token ids and log probs out."""

import base64
import logging
from array import array
from dataclasses import replace

from tenacity import before_sleep_log, wait_fixed

from slime.rollout.sglang_rollout import get_model_url
from slime.utils.http_utils import post as slime_post
from slime_search_r1.http_client import RequestFailed, RetryableRequestFailed, post_json, retrying, unbounded_session
from slime_search_r1.turns import Turn

logger = logging.getLogger(__name__)

# Like slime's post(): an engine that restarts or is briefly overloaded gets 60 tries, 1 s apart.
ENGINE_ATTEMPTS = 60
ENGINE_RETRY_WAIT_S = 1.0

# slime reads either name of each (slime/utils/types.py)
_TOP_P_ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


class EngineProtocolError(RuntimeError):
    """The engine rejected the request (4xx) or answered without what token-exact training needs."""


class EngineUnavailable(RuntimeError):
    """The engine kept failing (connection errors, 5xx) for every attempt."""


def engine_url(args, model: str) -> str:
    return get_model_url(args, model, "/generate")


def routing_headers(args, sample) -> dict | None:
    """Keep every turn of a sample on one engine when slime's router hashes on a key (prefix cache hits)."""
    if getattr(args, "router_policy", None) == "consistent_hashing" and getattr(sample, "session_id", None):
        return {"X-SMG-Routing-Key": sample.session_id}
    return None


def base_url(args, model: str) -> str:
    """The policy's router (sglang-router in front of the engines, or the old slime router), found as slime finds
    it: `model`'s router from --sglang-config, else --sglang-router-ip/--sglang-router-port."""
    return get_model_url(args, model, endpoint="")


async def post_with_retries(url: str, payload: dict, headers: dict | None = None) -> object:
    """POST to the engine or router over aiohttp, retried like slime's post() on 5xx, 429 and connection errors."""
    session = unbounded_session("sglang")
    try:
        async for attempt in retrying(
            ENGINE_ATTEMPTS,
            wait=wait_fixed(ENGINE_RETRY_WAIT_S),
            before_sleep=before_sleep_log(logger, logging.WARNING),
        ):
            with attempt:
                return await post_json(session, url, payload, None, headers=headers)
    except RetryableRequestFailed as exc:
        raise EngineUnavailable(f"SGLang did not answer after {ENGINE_ATTEMPTS} attempts: {exc}") from exc
    except RequestFailed as exc:
        raise EngineProtocolError(str(exc)) from exc


async def generate_turn(
    url: str,
    input_ids: list[int],
    sampling_params: dict,
    return_logprob: bool,
    *,
    use_slime_post: bool = False,
    headers: dict | None = None,
) -> Turn:
    """One /generate call; slime's own post() when asked (e.g. its Ray-distributed posts), else aiohttp."""
    payload = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": return_logprob}
    if use_slime_post:
        output = await slime_post(url, payload, headers=headers)
    else:
        output = await post_with_retries(url, payload, headers)
    turn = parse_engine_output(output, return_logprob)
    seen = turn.meta_info.get("prompt_tokens")
    # An abort before prefill reports 0 prompt tokens on some SGLang versions: only check finished turns.
    if turn.finish_type != "abort" and isinstance(seen, int) and seen != len(input_ids):
        raise EngineProtocolError(
            f"the engine conditioned on {seen} tokens but {len(input_ids)} were sent, so the trajectory would not "
            "be what it saw: something rewrote or truncated input_ids (the old slime router's radix middleware "
            "rewrites them: use TOKEN_TRACKING_MODE=router_radix with it; SGLang's allow_auto_truncate cuts them)"
        )
    return turn


def parse_engine_output(output: object, return_logprob: bool) -> Turn:
    """The sampled ids (and log probs) of a /generate answer; the text is the driver's to decode."""
    if not isinstance(output, dict) or not isinstance(output.get("meta_info"), dict):
        raise EngineProtocolError(f"/generate answered without meta_info: {str(output)[:200]}")
    meta_info = output["meta_info"]
    finish = meta_info.get("finish_reason") or {}
    finish_type = finish.get("type") if isinstance(finish, dict) else str(finish)
    if finish_type == "abort":  # SGLang answers with what it had sampled (nothing when aborted before prefill)
        if return_logprob:
            pairs = meta_info.get("output_token_logprobs") or []
            return Turn(
                [int(p[1]) for p in pairs], "abort", log_probs=[float(p[0]) for p in pairs], meta_info=meta_info
            )
        return Turn([int(i) for i in output.get("output_ids") or []], "abort", meta_info=meta_info)
    if return_logprob:
        pairs = meta_info.get("output_token_logprobs")
        if pairs is None:
            raise EngineProtocolError("/generate answered without meta_info.output_token_logprobs")
        ids, log_probs = [int(p[1]) for p in pairs], [float(p[0]) for p in pairs]
        return Turn(ids, finish_type, log_probs=log_probs, meta_info=meta_info)
    ids = output.get("output_ids")
    if ids is None:
        raise EngineProtocolError(
            "/generate answered without output_ids; this SGLang version only returns generated ids with "
            "log probs, so set TRACK_LOG_PROBS=true (re-tokenizing the text would not be token-exact)"
        )
    return Turn([int(i) for i in ids], finish_type, meta_info=meta_info)


def int32_values(value) -> list[int]:
    """An int32 array as SGLang's top-p replay sends it (base64 of native int32, bytes, or a list) as ints."""
    if isinstance(value, str):
        value = base64.b64decode(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return array("i", bytes(value)).tolist()
    return [int(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]


def keep_first_tokens(turn: Turn, count: int) -> Turn:
    """The turn cut after its first `count` tokens (what a stop at that token would have returned)."""
    meta_info = dict(turn.meta_info)
    meta_info["finish_reason"] = {"type": "stop"}
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
    return replace(turn, ids=turn.ids[:count], finish_type="stop", log_probs=log_probs, meta_info=meta_info)
