"""Token tracking through the slime router's radix-tree cache (TOKEN_TRACKING_MODE=router_radix / router_handler).

That router (slime before March 2026, removed in THUDM/slime#1735) cached the ids and log probs of
everything it generated, keyed by text, and returned a whole trajectory from
  POST /retrieve_from_text               {"text"}
  POST /retrieve_from_messages_template  {"messages", "tools", "add_generation_prompt"}
as {"tokens", "loss_mask", "rollout_logp", ...} over prompt + response. Text it never generated
(prompt, observations, template glue) comes back re-tokenized with loss mask 0 and log prob 0.0.
"""

import aiohttp

from async_http import RequestFailed, loop_session, post_json
from trajectory import reset_response_fields

_supported: dict[str, bool] = {}
ROUTER_TIMEOUT_S = 120.0


class RouterTrackingError(RuntimeError):
    """The router cannot provide the trajectory (missing endpoint, or an answer that does not fit the prompt)."""


def router_base_url(args) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


def router_session() -> aiohttp.ClientSession:
    return loop_session("router", lambda: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))


async def require_endpoint(base_url: str, endpoint: str, mode: str) -> None:
    """Fail before any rollout work when the router lacks `endpoint` (checked once per router and endpoint)."""
    key = base_url + endpoint
    if key not in _supported:
        try:
            async with router_session().post(key, json={}, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                _supported[key] = resp.status not in (404, 405)
        except aiohttp.ClientError as exc:
            raise RouterTrackingError(f"cannot reach the router at {base_url} to check {endpoint}: {exc}") from exc
    if not _supported[key]:
        raise RouterTrackingError(
            f"TOKEN_TRACKING_MODE={mode} needs a router that serves {endpoint}: the slime router with its "
            "radix-tree middleware (slime before March 2026, launched with --use-slime-router). Current slime "
            f"removed it, and {base_url} answers 404. TOKEN_TRACKING_MODE=manual is token-exact with any "
            "SGLang engine or router."
        )


async def retrieve(base_url: str, endpoint: str, payload: dict) -> dict:
    try:
        body = await post_json(router_session(), base_url + endpoint, payload, ROUTER_TIMEOUT_S)
    except RequestFailed as exc:
        raise RouterTrackingError(f"{endpoint} failed: {exc}") from exc
    missing = [k for k in ("tokens", "loss_mask", "rollout_logp") if not isinstance(body, dict) or k not in body]
    if missing:
        raise RouterTrackingError(f"{endpoint} answered without {', '.join(missing)}")
    return body


def fill_sample_from_router(
    args,
    sample,
    prompt_ids: list[int],
    retrieved: dict,
    tokenizer,
    *,
    track_log_probs: bool,
    train_observations: bool,
) -> None:
    """Put the router's trajectory on `sample`, prompt tokens sliced off; the prompt must match ours exactly."""
    tokens, mask, logp = list(retrieved["tokens"]), list(retrieved["loss_mask"]), retrieved["rollout_logp"]
    prompt_length = len(prompt_ids)
    if tokens[:prompt_length] != list(prompt_ids):
        raise RouterTrackingError(
            "the router's tokens do not start with the prompt's tokens (different tokenizer or chat template?)"
        )
    if len(mask) != len(tokens) or (logp is not None and len(logp) != len(tokens)):
        raise RouterTrackingError(
            f"router lengths disagree: {len(tokens)} tokens, {len(mask)} loss mask, "
            f"{'no' if logp is None else len(logp)} log probs"
        )
    if track_log_probs and logp is None:
        raise RouterTrackingError("the router returned no log probs; set TRACK_LOG_PROBS=false or use manual mode")
    # Template text after the model's last token (an end of turn it never wrote) is not part of the episode.
    end = len(tokens)
    while end > prompt_length and not mask[end - 1]:
        end -= 1
    tokens, mask = tokens[:end], mask[:end]
    logp = None if logp is None else logp[:end]
    response_ids = tokens[prompt_length:]
    reset_response_fields(sample, tokens, track_log_probs)
    sample.response_length = len(response_ids)
    sample.loss_mask = [1] * len(response_ids) if train_observations else [int(m) for m in mask[prompt_length:]]
    if track_log_probs:
        sample.rollout_log_probs = [float(v) for v in logp[prompt_length:]]
    sample.response = tokenizer.decode(response_ids, skip_special_tokens=False)
