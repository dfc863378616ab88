"""Where a turn's tokens come from: the engine itself (manual) or the slime router's radix cache (router_radix).

Both drivers serve the XML and the chat-template rollouts: `generate` runs one model turn and returns
its text, `add_observation` appends environment ids, `finish` puts the trajectory on the Sample.
"""

from dataclasses import dataclass

from router_tracking import (
    RouterTrackingError,
    fill_sample_from_router,
    post_to_router,
    require_endpoint,
    retrieve,
)
from sglang_engine import base_url, engine_url, generate_turn, keep_first_tokens, routing_headers
from slime.utils.types import Sample
from trajectory import EpisodeStats, Trajectory, record_finish, reset_response_fields


@dataclass
class GeneratedTurn:
    text: str
    finish_type: str  # "stop" | "length" | "abort"
    ids: list[int]
    message: dict | None = None  # the assistant message, when the server parsed it (router_handler)


def cut_after_first_stop(ids: list[int], tokenizer, text: str, stops: tuple[str, ...]) -> int:
    """How many of `ids` to keep so the turn ends with the token that completes its first stop string.

    An engine that honours stop strings already ends there; one that ran past them is cut, which keeps
    every kept token and log prob exact (they are a prefix of what was sampled).
    """
    hits = [(pos, stop) for stop in stops if (pos := text.find(stop)) >= 0]
    if not hits or len(ids) <= 1:
        return len(ids)
    pos, stop = min(hits)

    def holds_stop(count: int) -> bool:
        return tokenizer.decode(ids[:count], skip_special_tokens=False).find(stop) == pos

    if not holds_stop(len(ids) - 1):  # the usual case: the stop string ends in the last token
        return len(ids)
    low, high = 1, len(ids) - 1
    while low < high:
        mid = (low + high) // 2
        if holds_stop(mid):
            high = mid
        else:
            low = mid + 1
    return low


class ExactDriver:
    """TOKEN_TRACKING_MODE=manual: `input_ids` in, the engine's ids and log probs out, nothing re-tokenized."""

    def __init__(self, args, sample, tokenizer, prompt_ids, config, *, cut_at_stops: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.trajectory = Trajectory(
            args,
            sample,
            prompt_ids,
            track_log_probs=config.return_logprob,
            train_observations=config.train_observations,
        )
        self.stats = self.trajectory.stats
        self.url = engine_url(args, config.engine_model)
        self.use_slime_post = config.engine_transport == "slime" or bool(getattr(args, "use_distributed_post", False))
        self.headers = routing_headers(args, sample)
        self.cut_at_stops = cut_at_stops

    @property
    def context_length(self) -> int:
        return self.trajectory.context_length

    @property
    def response_length(self) -> int:
        return self.trajectory.response_length

    async def generate(self, sampling_params: dict) -> GeneratedTurn:
        turn = await generate_turn(
            self.url,
            list(self.trajectory.sample.tokens),
            sampling_params,
            self.trajectory.track_log_probs,
            use_slime_post=self.use_slime_post,
            headers=self.headers,
        )
        if turn.finish_type == "abort":
            return GeneratedTurn("", "abort", [])
        text = self.tokenizer.decode(turn.ids, skip_special_tokens=False)
        keep = cut_after_first_stop(turn.ids, self.tokenizer, text, self.cut_at_stops)
        if keep < len(turn.ids):
            turn = keep_first_tokens(turn, keep)
            text = self.tokenizer.decode(turn.ids, skip_special_tokens=False)
        self.trajectory.add_generated(turn.ids, turn.log_probs, turn.meta_info)
        return GeneratedTurn(text, turn.finish_type, turn.ids)

    def add_observation(self, ids: list[int]) -> None:
        self.trajectory.add_observation(ids)

    async def finish(self, status: Sample.Status, reason: str) -> Sample:
        return self.trajectory.finish(status, reason, self.tokenizer)


class _RouterDriver:
    """Counts tokens as the episode goes; the trajectory itself comes from the router's cache at the end."""

    retrieve_endpoint = ""
    mode = ""  # the TOKEN_TRACKING_MODE this driver serves

    @classmethod
    async def check_router(cls, args, config) -> None:
        """Fail before the sample is touched when the router lacks this driver's endpoint."""
        await require_endpoint(base_url(args, config.engine_model), cls.retrieve_endpoint, cls.mode)

    def __init__(self, args, sample, tokenizer, prompt_ids, config):
        self.sample, self.tokenizer, self.config = sample, tokenizer, config
        self.prompt_ids = list(prompt_ids)
        self.stats = EpisodeStats()
        self.router = base_url(args, config.engine_model)
        self.context_length = len(prompt_ids)
        self.response_length = 0
        reset_response_fields(sample, prompt_ids, config.return_logprob)

    def _count(self, tokens: int) -> None:
        self.context_length += tokens
        self.response_length += tokens

    def add_observation(self, ids: list[int]) -> None:
        self._count(len(ids))

    def retrieve_payload(self) -> dict:
        raise NotImplementedError

    async def finish(self, status: Sample.Status, reason: str) -> Sample:
        if status != Sample.Status.ABORTED:  # slime drops aborted samples: no trajectory needed
            retrieved = await retrieve(self.router, self.retrieve_endpoint, self.retrieve_payload())
            fill_sample_from_router(
                self.sample,
                self.prompt_ids,
                retrieved,
                self.tokenizer,
                track_log_probs=self.config.return_logprob,
                train_observations=self.config.train_observations,
            )
        return record_finish(self.sample, self.stats, status, reason)


class RadixDriver(_RouterDriver):
    """TOKEN_TRACKING_MODE=router_radix: text through the router's /generate, the trajectory from its cache."""

    retrieve_endpoint = "/retrieve_from_text"
    mode = "router_radix"

    def __init__(self, args, sample, tokenizer, prompt_ids, config, *, prompt_text: str):
        super().__init__(args, sample, tokenizer, prompt_ids, config)
        self.text = prompt_text

    async def generate(self, sampling_params: dict) -> GeneratedTurn:
        payload = {"text": self.text, "sampling_params": sampling_params, "return_logprob": self.config.return_logprob}
        output = await post_to_router(self.router + "/generate", payload)
        meta = output.get("meta_info") or {}
        finish = (meta.get("finish_reason") or {}).get("type", "stop")
        if finish == "abort":
            return GeneratedTurn("", "abort", [])
        ids = output.get("output_ids")
        # Decode the ids when given: the engine's text drops special tokens if skip_special_tokens is set.
        text = self.tokenizer.decode(ids, skip_special_tokens=False) if ids is not None else output["text"]
        self._count(int(meta.get("completion_tokens", len(ids or []))))
        self.text += text
        return GeneratedTurn(text, finish, ids or [])

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


class HandlerDriver(_RouterDriver):
    """TOKEN_TRACKING_MODE=router_handler: messages through the router's /v1/chat/completions, tokens from its
    /retrieve_from_messages_template at the end (prompt tokens sliced off)."""

    retrieve_endpoint = "/retrieve_from_messages_template"
    mode = "router_handler"

    def __init__(self, args, sample, tokenizer, prompt_ids, config, *, messages, conversation, tools):
        super().__init__(args, sample, tokenizer, prompt_ids, config)
        self.messages, self.conversation, self.tools = messages, conversation, tools

    async def generate(self, sampling_params: dict) -> GeneratedTurn:
        request = {"model": "default", "messages": self.messages + self.conversation, "tools": self.tools}
        request.update(stream=False, **openai_sampling(sampling_params))
        output = await post_to_router(self.router + "/v1/chat/completions", request)
        try:
            choice = output["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise RouterTrackingError(f"/v1/chat/completions answered without a choice: {exc!r}") from exc
        finish = choice.get("finish_reason")
        self._count(int((output.get("usage") or {}).get("completion_tokens", 0)))
        return GeneratedTurn(
            message.get("content") or "", finish if finish in ("abort", "length") else "stop", [], message
        )

    def retrieve_payload(self) -> dict:
        # The router renders the follow-ups itself; the ids counted in add_observation only keep the budget.
        return {"messages": self.messages + self.conversation, "tools": self.tools, "add_generation_prompt": False}
