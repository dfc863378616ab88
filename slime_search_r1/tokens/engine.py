"""The engine call: one SGLang /generate request, and its answer read and checked.

  generate_turn        one /generate call (aiohttp, or slime's post()), retried like slime's, its answer checked
  post_with_retries    the retry policy, the same over either transport: connection errors, 5xx and 429 are tried
                       again, a 4xx never (it would be refused again); an engine that answered errors to the last
                       attempt gives EngineProtocolError, one never reached EngineUnavailable (the only error that
                       fails the rollout), and a refusal for length EngineLengthRefusal (the limit is reached)
  parse_engine_output  the answer's sampled ids, log probs and weight-version spans, or EngineProtocolError saying what
                       is wrong with it (the episode then ends FAILED with that message in its record)
  every answer's weight versions go to episode.ENGINE_VERSIONS, the newest any engine has shown in this process

What the answer holds, as SGLang 0.5.15.post1 (slime's image) and 0.5.23 write it (standin/sglang_rules.py
cites the source): `output_ids` and, with return_logprob, `meta_info.output_token_logprobs` as [logprob, id, text]
per sampled token, the same ids in both; a NaN or infinite log prob arrives as null. `finish_reason` is stop, length
or abort; an aborted answer holds every token sampled so far (none, and no prompt_tokens, when it never ran).
`weight_version` is the newest version that sampled it; 0.5.23 adds `weight_versions`, spans of output tokens per
version, when the weights changed under a running request. Keys this reader does not know are left alone.
"""

import logging
import math

import httpx
from tenacity import before_sleep_log, wait_fixed

from slime.rollout.sglang_rollout import get_model_url
from slime.utils.http_utils import post as slime_post
from slime_search_r1.episode import ENGINE_VERSIONS, Turn
from slime_search_r1.http_client import (
    RequestFailed,
    RetryableRequestFailed,
    post_json,
    retry_after_seconds,
    retrying,
    unbounded_session,
)
from slime_search_r1.tokens.engine_rules import is_length_refusal

logger = logging.getLogger(__name__)

# Like slime's post(): an engine that restarts or is briefly overloaded gets 60 tries, 1 s apart (or as long as its
# Retry-After asks, up to http_client.RETRY_AFTER_MAX_S).
ENGINE_ATTEMPTS = 60
ENGINE_RETRY_WAIT_S = 1.0
FINISH_TYPES = ("stop", "length", "abort")
# The policy's name in --sglang-config, as slime's docs name it; without it slime's default router (its first model).
POLICY_MODEL = "actor"


class EngineProtocolError(RuntimeError):
    """The engine rejected the request (4xx), kept answering errors (5xx), or answered without what token-exact
    training needs."""


class EngineLengthRefusal(EngineProtocolError):
    """The engine refused the request for its length (HTTP 400, tokens/engine_rules.py LENGTH_REFUSALS): the episode
    has reached the engine's context length."""


class EngineUnavailable(RuntimeError):
    """No engine could be reached (connection errors, timeouts) for every attempt."""


def engine_url(args) -> str:
    return get_model_url(args, POLICY_MODEL, "/generate")


def routing_headers(args, sample) -> dict | None:
    """Keep every turn of a sample on one engine when slime's router hashes on a key (prefix cache hits)."""
    if getattr(args, "router_policy", None) == "consistent_hashing" and getattr(sample, "session_id", None):
        return {"X-SMG-Routing-Key": sample.session_id}
    return None


def base_url(args) -> str:
    """The policy's router (sglang-router in front of the engines, or the old slime router), found as slime finds
    it: POLICY_MODEL's router from --sglang-config, else --sglang-router-ip/--sglang-router-port."""
    return get_model_url(args, POLICY_MODEL, endpoint="")


async def post_with_retries(
    url: str, payload: dict, headers: dict | None = None, *, use_slime_post: bool = False
) -> object:
    """POST to the engine or router (aiohttp, or one slime post() per attempt), retried like slime's post() on 5xx,
    429 and connection errors, never on another 4xx (module docstring)."""
    session = None if use_slime_post else unbounded_session("sglang")
    try:
        async for attempt in retrying(
            ENGINE_ATTEMPTS,
            wait=wait_fixed(ENGINE_RETRY_WAIT_S),
            before_sleep=before_sleep_log(logger, logging.WARNING),
        ):
            with attempt:
                if session is None:
                    return await slime_post_once(url, payload, headers)
                return await post_json(session, url, payload, None, headers=headers)
    except RetryableRequestFailed as exc:
        if exc.status is not None:
            raise EngineProtocolError(f"the engine answered errors to all {ENGINE_ATTEMPTS} attempts: {exc}") from exc
        raise EngineUnavailable(
            f"no SGLang engine reachable at {url} after {ENGINE_ATTEMPTS} attempts: {one_line(str(exc))}"
        ) from None
    except RequestFailed as exc:
        if is_length_refusal(str(exc)):
            raise EngineLengthRefusal(str(exc)) from exc
        raise EngineProtocolError(str(exc)) from exc


async def slime_post_once(url: str, payload: dict, headers: dict | None) -> object:
    """One attempt through slime's post() (its Ray-distributed posts with --use-distributed-post), its errors mapped
    as post_json maps aiohttp's, so that post_with_retries' policy holds: slime's own loop would retry a 4xx too."""
    try:
        return await slime_post(url, payload, max_retries=1, headers=headers)
    except httpx.HTTPStatusError as exc:
        status, answer = exc.response.status_code, exc.response
        detail = one_line(answer.text)[:300]
        if status == 429 or status >= 500:
            retry_after = retry_after_seconds(answer.headers.get("Retry-After"))
            raise RetryableRequestFailed(f"{url} answered HTTP {status}: {detail}", retry_after, status) from exc
        raise RequestFailed(f"{url} rejected the request with HTTP {status}: {detail}") from exc
    except Exception as exc:  # connection errors and timeouts (httpx's, or Ray's around them): not reached
        raise RetryableRequestFailed(f"{url}: {type(exc).__name__}: {exc}") from exc


def one_line(text: str) -> str:
    return " ".join(text.split())


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
    output = await post_with_retries(url, payload, headers, use_slime_post=use_slime_post)
    turn = parse_engine_output(output, return_logprob)
    ENGINE_VERSIONS.observe(version for _, _, version in turn.versions)
    ENGINE_VERSIONS.observe([weight_version_of(turn.meta_info)])
    seen = turn.meta_info.get("prompt_tokens")
    # Every answer that says what the engine conditioned on is checked, aborts too: an aborted turn is resumed from
    # its tokens. One answered from the waiting queue (aborted before it ran, or retracted) carries no prompt_tokens;
    # an abort before prefill says 0 on some versions, and keeps nothing.
    never_ran = turn.finish_type == "abort" and not turn.ids and seen == 0
    if isinstance(seen, int) and seen != len(input_ids) and not never_ran:
        raise EngineProtocolError(
            f"the engine conditioned on {seen} tokens but {len(input_ids)} were sent, so the trajectory would not "
            "be what it saw: something rewrote or truncated input_ids (the old slime router's radix middleware "
            "rewrites them: use TOKEN_TRACKING_MODE=router_radix with it; SGLang's allow_auto_truncate cuts them)"
        )
    return turn


# ---- reading the answer -----------------------------------------------------------------------------------------


def parse_engine_output(output: object, return_logprob: bool) -> Turn:
    """The sampled ids (and log probs), the finish type and the weight-version spans of a /generate answer; the
    text is the driver's to decode. Anything a token-exact trajectory cannot be built from raises
    EngineProtocolError naming what was wrong."""
    if not isinstance(output, dict) or not isinstance(output.get("meta_info"), dict):
        raise EngineProtocolError(f"/generate answered without meta_info: {str(output)[:200]}")
    meta_info = output["meta_info"]
    finish_type = _finish_type(meta_info.get("finish_reason"))
    aborted = finish_type == "abort"  # SGLang answers what it had sampled (nothing when it never ran)
    output_ids = output.get("output_ids")
    if output_ids is not None:
        output_ids = _token_ids(output_ids, "output_ids")
    log_probs = None
    if return_logprob:
        pairs = meta_info.get("output_token_logprobs")
        if pairs is None and not aborted:
            raise EngineProtocolError("/generate answered without meta_info.output_token_logprobs")
        ids, log_probs = _log_prob_pairs(pairs or [])
        if output_ids is not None and output_ids != ids:
            raise EngineProtocolError(
                f"/generate answered {len(output_ids)} output_ids and {len(ids)} output_token_logprobs that disagree: "
                "the sampled ids are ambiguous"
            )
    elif output_ids is not None or aborted:
        ids = output_ids or []
    else:
        raise EngineProtocolError(
            "/generate answered without output_ids; this SGLang version only returns generated ids with "
            "log probs, so set TRACK_LOG_PROBS=true (re-tokenizing the text would not be token-exact)"
        )
    versions = read_weight_versions(meta_info, len(ids))
    return Turn(ids, finish_type, log_probs=log_probs, meta_info=meta_info, versions=versions)


def _finish_type(finish: object) -> str:
    finish_type = finish.get("type") if isinstance(finish, dict) else finish
    if finish_type not in FINISH_TYPES:
        raise EngineProtocolError(
            f"/generate answered finish_reason {str(finish)[:200]}; accepted: a type of {', '.join(FINISH_TYPES)}"
        )
    return finish_type


def _token_ids(values: object, name: str) -> list[int]:
    if not isinstance(values, list) or not all(type(value) is int for value in values):
        raise EngineProtocolError(f"/generate answered {name} {str(values)[:200]}, not a list of token ids")
    return values


def _log_prob_pairs(pairs: object) -> tuple[list[int], list[float]]:
    """(ids, log probs) of output_token_logprobs, each entry [logprob, token id, text or null]."""
    if not isinstance(pairs, list):
        raise EngineProtocolError(f"/generate answered output_token_logprobs {str(pairs)[:200]}, not a list")
    ids, log_probs = [], []
    for position, pair in enumerate(pairs):
        if not isinstance(pair, list | tuple) or len(pair) < 2 or type(pair[1]) is not int:
            raise EngineProtocolError(
                f"output_token_logprobs[{position}] is {str(pair)[:100]}, not [logprob, token id, text]"
            )
        value = pair[0]
        if value is None:
            raise EngineProtocolError(
                f"the engine's log prob of output token {position} (id {pair[1]}) is null: SGLang sends a NaN or "
                "infinite log prob as null, so the policy's numbers are broken (check the model's weights, or run "
                "with TRACK_LOG_PROBS=false to let slime recompute them)"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise EngineProtocolError(f"output_token_logprobs[{position}] has log prob {value!r}, not a finite number")
        ids.append(pair[1])
        log_probs.append(float(value))
    return ids, log_probs


def read_weight_versions(meta_info: dict, count: int) -> list[tuple[int, int, str | None]]:
    """(start, end, version) spans over an answer's `count` output tokens: 0.5.23's meta_info.weight_versions when
    sent (the weights changed under the running request), else one span of meta_info.weight_version. Empty spans are
    dropped; spans that do not tile the tokens in order raise EngineProtocolError."""
    spans = meta_info.get("weight_versions")
    if spans is None:
        return [(0, count, weight_version_of(meta_info))] if count else []
    read, position = [], 0
    for span in spans if isinstance(spans, list) else [spans]:
        start, end = (span.get("start"), span.get("end")) if isinstance(span, dict) else (None, None)
        if type(start) is not int or type(end) is not int or start != position or end < start or "version" not in span:
            raise EngineProtocolError(
                f"meta_info.weight_versions {str(spans)[:200]} does not cover the {count} output tokens in order "
                "with {version, start, end} spans"
            )
        if end > start:
            read.append((start, end, str(span["version"])))
        position = end
    if position != count:
        raise EngineProtocolError(
            f"meta_info.weight_versions {str(spans)[:200]} covers {position} of the {count} output tokens"
        )
    return read


def weight_version_of(meta_info: dict | None) -> str | None:
    """The weight version SGLang reports for an answer (meta_info["weight_version"], a string), or None."""
    version = (meta_info or {}).get("weight_version")
    return None if version is None else str(version)
