"""One generation turn against SGLang's native /generate: token ids in, token ids and log probs out."""

from dataclasses import dataclass

from slime.utils.http_utils import post

_TOP_P_KEYS = ("top_p_token_ids", "top_p_token_offsets")


class EngineProtocolError(RuntimeError):
    """The engine answered without what token-exact training needs."""


@dataclass
class EngineTurn:
    ids: list[int]
    log_probs: list[float] | None
    finish_type: str  # "stop" | "length" | "abort"
    meta_info: dict


def engine_url(args) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"


async def generate_turn(url: str, input_ids: list[int], sampling_params: dict, return_logprob: bool) -> EngineTurn:
    payload = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": return_logprob}
    return parse_engine_output(await post(url, payload), return_logprob)


def parse_engine_output(output: object, return_logprob: bool) -> EngineTurn:
    if not isinstance(output, dict) or not isinstance(output.get("meta_info"), dict):
        raise EngineProtocolError(f"/generate answered without meta_info: {str(output)[:200]}")
    meta_info = output["meta_info"]
    finish = meta_info.get("finish_reason") or {}
    finish_type = finish.get("type") if isinstance(finish, dict) else str(finish)
    if finish_type == "abort":
        return EngineTurn([], [] if return_logprob else None, "abort", meta_info)
    if return_logprob:
        pairs = meta_info.get("output_token_logprobs")
        if pairs is None:
            raise EngineProtocolError("/generate answered without meta_info.output_token_logprobs")
        return EngineTurn([int(p[1]) for p in pairs], [float(p[0]) for p in pairs], finish_type, meta_info)
    ids = output.get("output_ids")
    if ids is None:
        raise EngineProtocolError(
            "/generate answered without output_ids; this SGLang version only returns generated ids with "
            "log probs, so set TRACK_LOG_PROBS=true (re-tokenizing the text would not be token-exact)"
        )
    return EngineTurn([int(i) for i in ids], None, finish_type, meta_info)


def keep_first_tokens(turn: EngineTurn, count: int) -> EngineTurn:
    """The turn cut after its first `count` tokens (what a stop at that token would have returned)."""
    meta_info = dict(turn.meta_info)
    meta_info["finish_reason"] = {"type": "stop"}
    if "output_token_logprobs" in meta_info:
        meta_info["output_token_logprobs"] = meta_info["output_token_logprobs"][:count]
    if all(key in meta_info for key in _TOP_P_KEYS):
        offsets = list(meta_info["top_p_token_offsets"])[: count + 1]
        meta_info["top_p_token_offsets"] = offsets
        meta_info["top_p_token_ids"] = list(meta_info["top_p_token_ids"])[: offsets[-1]]
    log_probs = None if turn.log_probs is None else turn.log_probs[:count]
    return EngineTurn(turn.ids[:count], log_probs, "stop", meta_info)
