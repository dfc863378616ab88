"""Token tracking through the slime router's radix-tree cache (TOKEN_TRACKING_MODE=router_radix / router_handler).

That router (slime before March 2026, removed in THUDM/slime#1735) cached the ids and log probs of
everything it generated, keyed by text, and returned a whole trajectory from
  POST /retrieve_from_text               {"text"}
  POST /retrieve_from_messages_template  {"messages", "tools", "add_generation_prompt"}
as {"tokens", "loss_mask", "rollout_logp", ...} over prompt + response. Text it never generated
(prompt, observations, template glue) comes back re-tokenized with loss mask 0 and log prob 0.0.
"""

import asyncio

import aiohttp

from async_http import loop_session
from sglang_engine import EngineProtocolError, EngineUnavailable, post_with_retries
from trajectory import reset_response_fields

_supported: dict[str, bool] = {}


class RouterTrackingError(RuntimeError):
    """The router cannot provide the trajectory (missing endpoint, or an answer that does not fit the prompt)."""


async def require_endpoint(router: str, endpoint: str, mode: str) -> None:
    """Fail before any rollout work when the router lacks `endpoint` (checked once per router and endpoint)."""
    key = router + endpoint
    if key not in _supported:
        session = loop_session("router-probe", aiohttp.ClientSession)
        try:
            async with session.post(key, json={}, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                _supported[key] = resp.status not in (404, 405)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise RouterTrackingError(f"cannot reach the router at {router} to check {endpoint}: {exc}") from exc
    if not _supported[key]:
        raise RouterTrackingError(
            f"TOKEN_TRACKING_MODE={mode} needs a router that serves {endpoint}: the slime router with its "
            "radix-tree middleware (slime before March 2026, launched with --use-slime-router). Current slime "
            f"removed it, and {router} answers 404. TOKEN_TRACKING_MODE=manual is token-exact with any "
            "SGLang engine or router."
        )


async def post_to_router(url: str, payload: dict) -> dict:
    """A router call, retried like the engine's; a router that stays down fails the rollout, as an engine would."""
    try:
        body = await post_with_retries(url, payload)
    except (EngineProtocolError, EngineUnavailable) as exc:
        raise RouterTrackingError(f"{url}: {exc}") from exc
    if not isinstance(body, dict):
        raise RouterTrackingError(f"{url} answered {str(body)[:200]!r}, not a JSON object")
    return body


async def retrieve(router: str, endpoint: str, payload: dict) -> dict:
    body = await post_to_router(router + endpoint, payload)
    missing = [k for k in ("tokens", "loss_mask", "rollout_logp") if k not in body]
    if missing:
        raise RouterTrackingError(f"{endpoint} answered without {', '.join(missing)}")
    return body


def fill_sample_from_router(
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
