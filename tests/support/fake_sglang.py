"""A loopback stand-in for SGLang's native /generate, driven by a scripted policy and a real tokenizer.

It answers as SGLang's source says (slime_search_r1/standin/sglang_rules.py holds the rules, each with its version and
file, for this engine and the stand-in anyone can serve, `python -m slime_search_r1.standin`):
`input_ids` (or `text`) in; `output_ids`, `text` and `meta_info` (finish_reason stop/length/abort with `matched`,
prompt/completion token counts, `output_token_logprobs` as [logprob, id, null], the `weight_version` that sampled it,
and on 0.5.23 the `weight_versions` spans) out. `version` picks 0.5.15.post1 (slime's image, the default) or 0.5.23:
they order the finish checks differently at the last allowed token. Stop strings, looked for in the tail window of the
output as SGLang does (`sampled_as` writes a text in more pieces than its own tokens), end the output at the token that
completes them; stop_token_ids and the served model's EOS set (the base Qwen2.5-3B's, <|endoftext|> alone, by default)
end it at the matched token, kept. `speculative_run=k` accepts k tokens per step, so an EOS can sit inside the output
before a stop string completed later in the same run. A NaN log prob reaches the client as null (`null_log_prob_at`).
Every call is recorded so tests can check what the engine conditioned on and what it sampled. A request is first
admitted as SGLang admits it: 0.5.23's sampling_params schema, then the length rules (`context_length`,
`speculative_reserved`, `allow_auto_truncate`); a refusal is an HTTP 400 kept in `refused`.

The scripted model ends each turn the way a chat model does: inside a ChatML assistant turn with <|im_end|>, after
which, if nothing stops it, it goes on writing (AFTER_TURN, then <|endoftext|>); anywhere else with <|endoftext|>.

Aborts as SGLang answers them: a running request that slime's abort reaches (`hold_call`, POST /abort_request) or a
weight update in the default "abort" mode (`pause_at`) runs one more step, whose token is appended with no stop check,
and answers finish_reason abort with everything sampled; a request still waiting (`aborted`, e.g. arriving while slime
aborts) answers no tokens and no prompt_tokens; one retracted to the queue (`retract_call`) answers from there the
tokens it had streamed, a multiple of 50. Weight updates as slime makes them: `push_weights()` moves the version on;
`pause_at(call, tokens, mode)` is slime's update in fully-async training at a chosen request; the "in_place" and
"retract" modes let the request go on under the new weights (two versions in one answer).
"""

import asyncio
import base64
import functools
import json
import re
import threading
import uuid
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from slime_search_r1.standin.model import (
    BASE_MODEL_EOS,
    assistant_marker,
    question_of,
    scripted_log_prob,
    turn_end_ids,
)
from slime_search_r1.standin.model import turn_index as turns_taken
from slime_search_r1.standin.sglang_rules import (
    SGLANG_0_5_15,
    VERSIONS,
    WAITING_ABORT,
    Decoded,
    FinishRules,
    LengthRules,
    abort_running,
    admit_request,
    answer_meta,
    decode_steps,
    streamed_so_far,
    output_token_logprobs,
    trimmed_text,
    weight_version_spans,
)

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OBSERVATION_ENDS = (  # what ends each observation the model was shown inside one assistant turn (XML mode)
    "</information>",
    "</result>",  # examples/calculator.py's result block
    "Let me try again.",
    "</tool_response>\n<|im_start|>assistant",
    "<|im_start|>user\nYour last reply",
)


def turn_index(context_text: str) -> int:
    """How many turns the model already took: earlier assistant turns (chat) plus replies inside this one (XML)."""
    return turns_taken(context_text, OBSERVATION_ENDS)


class ScriptedPolicy:
    """The 'model': for each question, the text it writes on each turn (the engine then ends the turn)."""

    def __init__(self, scripts: dict[str, list[str]] | None = None, default: list[str] | None = None):
        self.scripts = dict(scripts or {})
        self.default = default or ["<think>I am not sure.</think><answer>unknown</answer>"]

    def __call__(self, context_text: str) -> str:
        turns = self.scripts.get(question_of(context_text), self.default)
        index = turn_index(context_text)
        return turns[min(index, len(turns) - 1)]


@dataclass
class EngineCall:
    input_ids: list[int]
    sent_text: bool
    sampling_params: dict
    return_logprob: bool
    prompt_tokens: int = 0  # what the engine conditioned on (fewer than sent when --allow-auto-truncate cut them)
    output_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    weight_version: str = ""  # the version of the weights that sampled it (the newest, if two did)
    meta_info: dict = field(default_factory=dict)  # the answer's, as sent


class Gate:
    """Where an engine holds requests: `reached` is set once one waits; `open()` lets every waiting one go."""

    def __init__(self, after: int):
        self.after = after
        self.reached = threading.Event()
        self._open = threading.Event()

    async def wait(self) -> None:
        self.reached.set()
        await asyncio.get_running_loop().run_in_executor(None, self._open.wait)

    def open(self) -> None:
        self._open.set()


class Hold:
    """A request held in flight: `reached` is set once it waits; slime's abort (POST /abort_request) releases it.
    `retracted`: it waits in the queue, retracted under memory pressure, and the abort answers it from there."""

    def __init__(self, tokens: int, retracted: bool = False):
        self.tokens = tokens
        self.retracted = retracted
        self.reached = threading.Event()
        self.skipped = False
        self._released: asyncio.Event | None = None

    async def wait(self) -> None:
        self._released = asyncio.Event()
        self.reached.set()
        await self._released.wait()

    def abort(self) -> None:
        self._released.set()


PAUSE_MODES = ("abort", "in_place", "retract")  # POST /pause_generation's modes (managers/io_struct.py, 0.5.23)


class Pause:
    """A weight update at a chosen request, after it sampled `tokens` tokens. slime pauses in the default "abort" mode:
    that request (and every held one) answers abort, with the one more unchecked token every abort brings, then the
    version moves on. "in_place" and "retract" keep it running: it finishes under the new version, and on 0.5.23 its
    answer's weight_versions says which tokens each version sampled. `reached` is set once the update happened;
    `aborted` says whether the request was cut, `split` whether two versions sampled it (a turn of `tokens` tokens or
    fewer finishes first: neither)."""

    def __init__(self, tokens: int, mode: str = "abort"):
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode {mode!r}; SGLang has {PAUSE_MODES}")
        self.tokens = tokens
        self.mode = mode
        self.reached = threading.Event()
        self.aborted = False
        self.split = False
        self.version_before: str | None = None
        self.version_after: str | None = None


def next_version(version: str) -> str:
    """The version after `version`, as slime counts its updates (SGLang's "default" comes before slime's "1")."""
    return str(int(version) + 1) if version.isdigit() else "1"


class FakeSGLangEngine:
    def __init__(
        self,
        tokenizer,
        policy: Callable[[str], str],
        *,
        version: str = SGLANG_0_5_15,
        eos_ids: tuple[int, ...] = BASE_MODEL_EOS,
        context_length: int = 32768,
        speculative_reserved: int = 0,
        allow_auto_truncate: bool = False,
        honor_stop_strings: bool = True,
        record: bool = True,
        split_every: int = 0,
        speculative_run: int = 1,
        top_p_replay: str | None = None,
        weight_version: str = "1",
    ):
        """`version`: the SGLang whose answers it gives (sglang_rules.VERSIONS); `eos_ids`: the served model's EOS set;
        `context_length`, `speculative_reserved` (EAGLE's draft slots) and `allow_auto_truncate`: its length rules
        (sglang_rules.LengthRules); `top_p_replay`: None, "list" or "base64" (with slime's top-p patch, the nucleus of
        each sampled token)."""
        if version not in VERSIONS:
            raise ValueError(f"SGLang version {version!r}; the engine answers as {VERSIONS}")
        self.tokenizer = tokenizer
        self.policy = policy
        self.version = version
        self.eos_ids = eos_ids
        self.context_length = context_length
        self.speculative_reserved = speculative_reserved
        self.allow_auto_truncate = allow_auto_truncate
        self.honor_stop_strings = honor_stop_strings
        self.record = record
        self.split_every = split_every
        # text -> the pieces (one token each) the model samples it as, wherever the plan holds its canonical tokens
        self.sampled_as: dict[str, list[str]] = {}
        self.speculative_run = speculative_run
        self.top_p_replay = top_p_replay
        # slime pushes the trained weights before the first rollout (train.py, train_async.py): its first version
        self.weight_version = weight_version
        self.pauses: dict[int, Pause] = {}  # call number -> the weight update it brings
        self.calls: list[EngineCall] = []
        self.refused: list[dict] = []  # the bodies of the length and schema refusals (HTTP 400), in order
        self.failures_answered = 0  # requests answered with an injected failure (fail_next)
        self.failures_left = 0
        self.failure_status = 500
        self.failure_body: str | None = None  # a 200 answer with this body instead of JSON (fail_next)
        self.aborted = False  # requests that arrive now wait in the queue and are aborted there
        self.gate: Gate | None = None
        self.url = ""  # set by whoever serves it (its /workers answer names it, as a router would)
        self.holds: dict[int, Hold] = {}  # call number -> where that request waits for slime's abort
        self.held: set[Hold] = set()  # requests waiting now (what /v1/loads counts)
        self.continuations: dict[tuple[int, ...], tuple[list[int], int]] = {}
        self.null_log_prob_at: dict[int, int] = {}  # call number -> the position whose log prob is NaN (sent as null)
        self.rewrite_next: Callable[[dict], dict] | None = None  # the next answer's body, as a broken engine sends it
        self._arrivals: list[tuple[int, threading.Event]] = []  # (call count, set once that many have arrived)
        # (context ids, sampled ids) -> the sampled ids' log probs; None: scripted_log_prob by position and token
        self.log_probs_of: Callable[[list[int], list[int]], list[float]] | None = None
        self.app = self._build_app()

    # ---- test controls -------------------------------------------------------------------------
    def hold_after(self, calls: int) -> "Gate":
        """Requests after the first `calls` wait until the returned gate is opened (a run held at a known point)."""
        self.gate = Gate(calls)
        return self.gate

    def hold_call(self, call: int, tokens: int) -> "Hold":
        """The `call`-th /generate request (counting from 1 over the engine's life) samples `tokens` tokens and then
        waits, running, until slime's abort reaches it; it answers those tokens plus the one more step every abort
        runs, with finish_reason abort. A turn that ends within `tokens` tokens is not held (`reached` is set and
        `skipped` is true)."""
        hold = self.holds[call] = Hold(tokens)
        return hold

    def retract_call(self, call: int, tokens: int) -> "Hold":
        """The `call`-th /generate request samples `tokens` tokens and is then retracted to the waiting queue (memory
        pressure), where slime's abort reaches it: it answers "Abort in waiting queue" with the tokens the tokenizer
        manager had been sent (sglang_rules.streamed_so_far: a multiple of 50) and their log probs, without
        prompt_tokens. A turn that ends within `tokens` tokens is not held, as with hold_call."""
        hold = self.holds[call] = Hold(tokens, retracted=True)
        return hold

    def when_calls(self, count: int) -> threading.Event:
        """An event set once `count` /generate requests have arrived over the engine's life (recorded ones)."""
        arrived = threading.Event()
        self._arrivals.append((count, arrived))
        self._count_arrivals()
        return arrived

    def _count_arrivals(self) -> None:
        for count, arrived in self._arrivals:
            if len(self.calls) >= count:
                arrived.set()

    def push_weights(self) -> str:
        """A weight update with nothing in flight to abort (it landed while the episodes ran their tools): the
        next answers carry the next version, which is returned."""
        self.weight_version = next_version(self.weight_version)
        return self.weight_version

    def pause_at(self, call: int, tokens: int, mode: str = "abort") -> Pause:
        """The `call`-th /generate request (counting from 1 over the engine's life) brings a weight update after
        sampling `tokens` tokens (see Pause)."""
        pause = self.pauses[call] = Pause(tokens, mode)
        return pause

    def fail_next(self, count: int, status: int = 500, body: str | None = None) -> None:
        """The next `count` requests fail: HTTP `status`, or with `body` an HTTP 200 whose body is that text."""
        self.failures_left, self.failure_status, self.failure_body = count, status, body

    def calls_for(self, prompt_ids: list[int]) -> list[EngineCall]:
        return [c for c in self.calls if c.input_ids[: len(prompt_ids)] == prompt_ids]

    # ---- what the model writes -----------------------------------------------------------------
    @functools.cached_property
    def _vocab(self) -> dict[str, int]:
        # built only by engines that split tokens (the property tests): 0.15 s per engine otherwise wasted
        return self.tokenizer.get_vocab()

    @functools.cached_property
    def _turn_ends(self) -> tuple[list[int], list[int]]:
        """(how a turn ends inside an assistant turn, how it ends anywhere else)."""
        return turn_end_ids(self.tokenizer)

    def _split(self, token: int) -> list[int]:
        """Two smaller tokens that decode to the same bytes, if the vocabulary has them."""
        piece = self.tokenizer.convert_ids_to_tokens(token)
        for cut in range(1, len(piece)):
            left, right = self._vocab.get(piece[:cut]), self._vocab.get(piece[cut:])
            if left is not None and right is not None and token < 151643:
                return [left, right]
        return [token]

    def _non_canonical(self, planned: list[int]) -> list[int]:
        """Real models often sample a tokenization that re-tokenizing the text would not give back."""
        if not self.split_every:
            return planned
        out = []
        for index, token in enumerate(planned):
            out.extend(self._split(token) if index % self.split_every == 0 else [token])
        return out

    def _as_sampled(self, planned: list[int]) -> list[int]:
        """`planned` with each text of `sampled_as` written in its pieces."""
        for text, pieces in self.sampled_as.items():
            canonical, written = self._encode(text), [token for piece in pieces for token in self._encode(piece)]
            assert len(written) == len(pieces), f"each of {pieces} must be one token"
            position = 0
            while (found := _find(planned, canonical, position)) >= 0:
                planned = planned[:found] + written + planned[found + len(canonical) :]
                position = found + len(written)
        return planned

    def _planned(self, input_ids: list[int]) -> list[int]:
        """What the model writes next. A request that extends an aborted one (its context plus the tokens it had
        sampled) continues the same plan: the policy is asked about the turn's context, not its own partial text."""
        context, already = self.continuations.get(tuple(input_ids), (input_ids, 0))
        context_text = self.tokenizer.decode(context, skip_special_tokens=False)
        planned = self._non_canonical(self._as_sampled(self._encode(self.policy(context_text))))
        in_chat_turn, elsewhere = self._turn_ends
        in_chat = assistant_marker(context_text) in context_text
        return [*planned, *(in_chat_turn if in_chat else elsewhere)][already:]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    # ---- generation ----------------------------------------------------------------------------
    async def _run(self, input_ids: list[int], params: dict) -> tuple[Decoded, list[tuple[str, int]], int]:
        """One request from its first decode step to its answer: (what it answers, the weight-version changes it lived
        through as (old version, tokens then), retractions)."""
        number = len(self.calls)
        plan = self._planned(input_ids)
        rules = FinishRules.of(self.version, self._decode, params, self.eos_ids, self._encode)
        if not self.honor_stop_strings:
            rules.stop_strs = []
        run = self.speculative_run
        hold, pause = self.holds.pop(number, None), self.pauses.pop(number, None)
        until = hold.tokens if hold else pause.tokens if pause else None
        decoded = decode_steps(plan, rules, run=run, until=until)
        events: list[tuple[str, int]] = []
        if hold is not None:
            if decoded.finished:
                hold.skipped = True
                hold.reached.set()
            else:
                self.held.add(hold)
                await hold.wait()
                if hold.retracted:
                    kept = streamed_so_far(len(decoded.ids))
                    decoded = Decoded(ids=decoded.ids[:kept], finish=dict(WAITING_ABORT), spans=decoded.spans)
                else:
                    decoded = abort_running(plan, decoded, rules.max_new_tokens, run=run)
        if pause is None:
            return decoded, events, 0
        pause.version_before = self.weight_version
        if pause.mode == "abort":  # every request in flight is aborted; the update comes once they answered
            if not decoded.finished:
                decoded = abort_running(plan, decoded, rules.max_new_tokens, run=run)
                pause.aborted = True
            for held in self.held:
                held.abort()
            self.held.clear()
            pause.version_after = self.push_weights()
            pause.reached.set()
            return decoded, events, 0
        # in place or retracted: the weights change under the running request, which then goes on to its end
        # (0.5.23: scheduler.py record_weight_version_change adds an event to every live request)
        pause.version_after = self.push_weights()
        if not decoded.finished:
            events.append((pause.version_before, len(decoded.ids)))
            decoded = decode_steps(plan, rules, run=run, out=decoded.ids)
            pause.split = True
        pause.reached.set()
        return decoded, events, int(pause.mode == "retract" and pause.split)

    def _answer(self, call: EngineCall, decoded: Decoded, events, retractions: int, params: dict) -> dict:
        """The JSON body SGLang answers a finished (or aborted running) request with."""
        out, finish = decoded.ids, decoded.finish
        version = self.weight_version if events else call.weight_version
        call.output_ids, call.finish = out, finish
        call.log_probs = (
            self.log_probs_of(call.input_ids, out)
            if self.log_probs_of
            else [scripted_log_prob(len(call.input_ids) + i, t) for i, t in enumerate(out)]
        )
        meta = answer_meta(
            self.version,
            request_id=uuid.uuid4().hex,
            finish=finish,
            prompt_tokens=call.prompt_tokens,
            completion_tokens=len(out),
            weight_version=version,
            retractions=retractions,
            version_events=events,
        )
        if call.return_logprob:
            log_probs: list[float | None] = list(call.log_probs)
            nan_at = self.null_log_prob_at.pop(len(self.calls), None)
            if nan_at is not None and nan_at < len(log_probs):
                log_probs[nan_at] = None  # orjson writes NaN and infinities as null
            meta.update(output_token_logprobs(log_probs, out))
        if self.top_p_replay:
            nucleus = [[t, (t + 1) % 151643] for t in out]  # the sampled token and one more per position
            ids = [i for kept in nucleus for i in kept]
            offsets = [2 * i for i in range(len(out) + 1)]
            if self.top_p_replay == "base64":
                ids, offsets = (base64.b64encode(array("i", v).tobytes()).decode() for v in (ids, offsets))
            meta["top_p_kept_token_ids"], meta["top_p_kept_token_offsets"] = ids, offsets
        call.weight_version = version
        call.meta_info = meta
        skip = bool(params.get("skip_special_tokens", True))
        text = trimmed_text(lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip), out, finish, params)
        return {"text": text, "output_ids": out, "meta_info": meta}

    def _refuse(self, body: dict) -> JSONResponse:
        """HTTP 400 with `body`, kept in `refused` for the test to read."""
        self.refused.append(body)
        return JSONResponse(body, 400)

    def _waiting_abort(self, call: EngineCall) -> dict:
        """A request aborted before it ran (managers/tokenizer_manager.py, _handle_abort_req, both versions): no
        tokens, and meta_info without prompt_tokens and cached_tokens."""
        call.finish = dict(WAITING_ABORT)
        call.weight_version = self.weight_version
        meta = {"id": uuid.uuid4().hex, "finish_reason": call.finish, "weight_version": self.weight_version}
        meta["e2e_latency"] = 0.0
        if self.version != SGLANG_0_5_15:
            meta["weight_versions"] = weight_version_spans([], self.weight_version, 0)
        if call.return_logprob:
            meta.update(input_token_logprobs=[], output_token_logprobs=[], output_token_logprobs_length=0)
        meta["completion_tokens"] = 0
        call.meta_info = meta
        return {"text": "", "output_ids": [], "meta_info": meta}

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health():
            return {}

        @app.get("/model_info")
        async def model_info():
            return {"model_path": "Qwen/Qwen2.5-3B (scripted stand-in)", "is_generation": True}

        @app.post("/abort_request")
        async def abort_request(request: Request):
            body = await request.json()
            if body.get("abort_all"):  # as SGLang: the requests in flight answer what they have sampled
                for hold in self.held:
                    hold.abort()
                self.held.clear()
            return {}

        @app.get("/workers")
        async def workers():  # the router's list, which slime's abort() reads
            return {"workers": [{"url": self.url}]}

        @app.get("/v1/loads")
        async def loads():  # slime's abort() waits until every engine reports none in flight
            return {"num_reqs": len(self.held)}

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request):
            body = await request.json()
            prompt = render_openai_messages(self.tokenizer, body["messages"], body.get("tools"), True)
            params = openai_sampling_params(body)
            output = await generate_ids(self.tokenizer.encode(prompt, add_special_tokens=False), False, params, False)
            if isinstance(output, JSONResponse):
                return output
            return openai_response(output, self.tokenizer)

        @app.post("/generate")
        async def generate(request: Request):
            body = await request.json()
            if self.failures_left > 0:
                self.failures_left -= 1
                self.failures_answered += 1
                if self.failure_body is not None:
                    return Response(self.failure_body, media_type="application/json")
                return JSONResponse({"error": {"message": "injected failure"}}, status_code=self.failure_status)
            params = body.get("sampling_params") or {}
            if "input_ids" in body:
                input_ids, sent_text = [int(i) for i in body["input_ids"]], False
            elif "text" in body:
                input_ids, sent_text = self.tokenizer.encode(body["text"], add_special_tokens=False), True
            else:
                return JSONResponse({"error": {"message": "Either text or input_ids should be provided."}}, 400)
            return await generate_ids(input_ids, sent_text, params, bool(body.get("return_logprob")), request)

        async def generate_ids(input_ids, sent_text, params, return_logprob, request=None):
            lengths = LengthRules(self.context_length, self.speculative_reserved, self.allow_auto_truncate)
            refusal, conditioned, max_new = admit_request(self.version, input_ids, params, lengths)
            if refusal is not None:
                return self._refuse(refusal)
            call = EngineCall(input_ids, sent_text, dict(params), return_logprob, len(conditioned))
            call.headers = dict(request.headers) if request is not None else {}
            if self.record:
                self.calls.append(call)
                self._count_arrivals()
            if self.gate is not None and len(self.calls) > self.gate.after:
                await self.gate.wait()
            if self.aborted:
                return self._waiting_abort(call)
            call.weight_version = self.weight_version  # the weights that start sampling it
            decoded, events, retractions = await self._run(conditioned, {**params, "max_new_tokens": max_new})
            if decoded.finish.get("type") == "abort":  # a later request that extends it continues the same plan
                base, already = self.continuations.get(tuple(input_ids), (input_ids, 0))
                self.continuations[tuple(input_ids + decoded.ids)] = (base, already + len(decoded.ids))
            body = self._answer(call, decoded, events, retractions, params)
            if self.rewrite_next is not None:
                body, self.rewrite_next = self.rewrite_next(body), None
            return body

        return app


def _find(ids: list[int], part: list[int], start: int) -> int:
    """Where `part` first occurs in `ids` from `start` on, or -1."""
    for position in range(start, len(ids) - len(part) + 1):
        if ids[position : position + len(part)] == part:
            return position
    return -1


def render_openai_messages(tokenizer, messages: list[dict], tools, add_generation_prompt: bool) -> str:
    """Apply the chat template to OpenAI messages, tool-call arguments turned into objects as SGLang does."""
    messages = json.loads(json.dumps(messages))
    for message in messages:
        for call in message.get("tool_calls") or []:
            if isinstance(call["function"].get("arguments"), str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def openai_sampling_params(body: dict) -> dict:
    """SGLang's sampling params for an OpenAI chat request (the fields the plugin sends)."""
    params = {"max_new_tokens": body.get("max_tokens", 512)}
    for name in ("temperature", "top_p", "top_k", "stop", "stop_token_ids"):
        if name in body:
            params[name] = body[name]
    return params


def openai_response(output: dict, tokenizer) -> dict:
    """An SGLang /generate answer as a /v1/chat/completions answer, tool calls parsed Qwen-style."""
    meta = output["meta_info"]
    finish = meta["finish_reason"]["type"]
    text = tokenizer.decode(output["output_ids"], skip_special_tokens=True)
    calls, content = [], text
    if TOOL_CALL.search(text):
        try:
            parsed = [json.loads(block) for block in TOOL_CALL.findall(text)]
            calls = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": p["name"], "arguments": json.dumps(p.get("arguments", {}))},
                }
                for i, p in enumerate(parsed)
            ]
            content = text[: text.index("<tool_call>")].rstrip("\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            calls = []  # SGLang leaves an unparsable call in the content
    reason = "abort" if finish == "abort" else "length" if finish == "length" else "tool_calls" if calls else "stop"
    message = {"role": "assistant", "content": content, "tool_calls": calls or None}
    return {
        "id": meta.get("id", "chatcmpl"),
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": reason}],
        "usage": {
            "prompt_tokens": meta.get("prompt_tokens", 0),
            "completion_tokens": meta.get("completion_tokens", 0),
        },
    }
