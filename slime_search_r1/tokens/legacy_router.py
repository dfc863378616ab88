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

from slime.utils.types import Sample
from slime_search_r1.episode import Turn
from slime_search_r1.http_client import loop_session
from slime_search_r1.tokens.engine import EngineProtocolError, EngineUnavailable, base_url, post_with_retries

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


def router_response(
    retrieved: dict, prompt_ids: list[int], *, track_log_probs: bool
) -> tuple[list[int], list[int], list[float] | None]:
    """(response ids, loss mask, log probs) of the router's trajectory; its prompt must match ours exactly."""
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
    log_probs = None if logp is None else list(logp[prompt_length:end])
    return tokens[prompt_length:end], mask[prompt_length:end], log_probs


class _RouterDriver:
    """Counts tokens as the episode goes; the trajectory itself comes from the router's cache at the end."""

    retrieve_endpoint = ""
    mode = ""  # the TOKEN_TRACKING_MODE this driver serves

    @classmethod
    async def prepare(cls, state) -> None:
        """Fail before the sample is touched when the router lacks this driver's endpoint."""
        await require_endpoint(base_url(state.args), cls.retrieve_endpoint, cls.mode)

    def __init__(self, state, trajectory):
        self.tokenizer, self.config, self.trajectory = state.tokenizer, state.config, trajectory
        self.router = base_url(state.args)
        self.context_length = len(trajectory.prompt_ids)
        self.response_length = 0

    def _count(self, tokens: int) -> None:
        self.context_length += tokens
        self.response_length += tokens

    def add_observation(self, ids: list[int]) -> None:
        self._count(len(ids))

    def retrieve_payload(self) -> dict:
        raise NotImplementedError

    async def finish(self, status: Sample.Status) -> None:
        if status == Sample.Status.ABORTED:  # slime drops aborted samples: no trajectory needed
            return
        retrieved = await retrieve(self.router, self.retrieve_endpoint, self.retrieve_payload())
        response = router_response(
            retrieved, self.trajectory.prompt_ids, track_log_probs=self.trajectory.track_log_probs
        )
        self.trajectory.replace_response(*response)


class RouterRadixDriver(_RouterDriver):
    """TOKEN_TRACKING_MODE=router_radix: text through the router's /generate, the trajectory from its cache."""

    retrieve_endpoint = "/retrieve_from_text"
    mode = "router_radix"

    def __init__(self, state, trajectory, protocol):
        super().__init__(state, trajectory)
        self.text = protocol.prompt_text

    async def generate(self, sampling_params: dict) -> Turn:
        payload = {"text": self.text, "sampling_params": sampling_params, "return_logprob": self.config.return_logprob}
        output = await post_to_router(self.router + "/generate", payload)
        meta = output.get("meta_info") or {}
        finish = (meta.get("finish_reason") or {}).get("type", "stop")
        if finish == "abort":
            return Turn([], "abort")
        ids = output.get("output_ids")
        # Decode the ids when given: the engine's text drops special tokens if skip_special_tokens is set.
        text = self.tokenizer.decode(ids, skip_special_tokens=False) if ids is not None else output["text"]
        self._count(int(meta.get("completion_tokens", len(ids or []))))
        self.text += text
        return Turn(ids or [], finish, text=text)

    def add_observation(self, ids: list[int]) -> None:
        super().add_observation(ids)
        self.text += self.tokenizer.decode(ids, skip_special_tokens=False)

    def retrieve_payload(self) -> dict:
        return {"text": self.text, "return_logp": True}


def openai_sampling(sampling_params: dict) -> dict:
    """slime's SGLang sampling params as /v1/chat/completions fields (SGLang accepts top_k and stop_token_ids)."""
    fields = {"max_tokens": sampling_params["max_new_tokens"]}
    for name in ("temperature", "top_p", "top_k", "stop", "stop_token_ids", "skip_special_tokens"):
        if sampling_params.get(name) is not None:
            fields[name] = sampling_params[name]
    return fields


class RouterHandlerDriver(_RouterDriver):
    """TOKEN_TRACKING_MODE=router_handler: messages through the router's /v1/chat/completions, tokens from its
    /retrieve_from_messages_template at the end (prompt tokens sliced off)."""

    retrieve_endpoint = "/retrieve_from_messages_template"
    mode = "router_handler"

    def __init__(self, state, trajectory, protocol):
        super().__init__(state, trajectory)
        self.state, self.messages, self.tools = state, protocol.messages, protocol.tool_schemas
        self.end_of_turn_token = protocol.renderer.end_of_turn_token
        self.ended_turn = False  # the last turn ended on a stop token (completion_tokens counted it)

    def conversation(self) -> list[dict]:
        return self.messages + self.state.conversation

    async def generate(self, sampling_params: dict) -> Turn:
        request = {"model": "default", "messages": self.conversation(), "tools": self.tools}
        request.update(stream=False, **openai_sampling(sampling_params))
        output = await post_to_router(self.router + "/v1/chat/completions", request)
        try:
            choice = output["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise RouterTrackingError(f"/v1/chat/completions answered without a choice: {exc!r}") from exc
        finish = choice.get("finish_reason")
        self._count(int((output.get("usage") or {}).get("completion_tokens", 0)))
        finish_type = finish if finish in ("abort", "length") else "stop"
        self.ended_turn = finish_type == "stop"
        return Turn([], finish_type, text=message.get("content") or "", message=message)

    def add_observation(self, ids: list[int]) -> None:
        # The reply follows a turn known only as text, so it begins with the end-of-turn token the model generated,
        # which completion_tokens already counted: counted twice, each later turn would be offered one token less.
        if self.ended_turn and ids[:1] == [self.end_of_turn_token]:
            ids = ids[1:]
        super().add_observation(ids)

    def retrieve_payload(self) -> dict:
        # The router renders the follow-ups itself; the ids counted in add_observation only keep the budget.
        return {"messages": self.conversation(), "tools": self.tools, "add_generation_prompt": False}
