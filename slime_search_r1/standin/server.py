"""The stand-in's HTTP app, SGLang's native endpoints as the plugin and evaluate.py use them, and its serving.

  POST /generate    `input_ids` (or `text`) and `sampling_params` in; `text`, `output_ids` and `meta_info` out, shaped
                    and ended by sglang_rules.py (0.5.15.post1, slime's image, unless told 0.5.23); the turn is the
                    policy's text (policy.py) ended as model.py says, its log probs model.py's scripted ones
  GET /health       200 once it serves
  GET /model_info   SGLang's fields: the model path says "scripted stand-in", weight_version is the marker
Every answer's meta_info.weight_version is SCRIPTED_WEIGHT_VERSION: the plugin records it per engine call, and the
reports made from these answers say they were scripted.
"""

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from slime_search_r1.standin import SCRIPTED_LABEL, SCRIPTED_WEIGHT_VERSION
from slime_search_r1.standin.model import assistant_marker, scripted_log_prob, turn_end_ids
from slime_search_r1.standin.sglang_rules import (
    SGLANG_0_5_15,
    FinishRules,
    LengthRules,
    admit_request,
    answer_meta,
    decode_steps,
    output_token_logprobs,
    trimmed_text,
)


class StandInEngine:
    """SGLang's /generate, each turn written by `policy` (context text -> the turn's text) and tokenized by
    `tokenizer`, the model's turn ends and EOS as model.py says."""

    def __init__(
        self,
        tokenizer,
        policy: Callable[[str], str],
        *,
        tokenizer_path: str,
        version: str = SGLANG_0_5_15,
        context_length: int = 32768,
    ):
        self.tokenizer = tokenizer
        self.policy = policy
        self.tokenizer_path = tokenizer_path
        self.version = version
        self.context_length = context_length
        self.turn_ends = turn_end_ids(tokenizer)
        self.app = self._build_app()

    def planned(self, input_ids: list[int]) -> list[int]:
        """The ids the scripted model writes after `input_ids`: the policy's turn, then how its turn ends."""
        context_text = self.tokenizer.decode(input_ids, skip_special_tokens=False)
        text = self.policy(context_text)
        in_chat_turn, elsewhere = self.turn_ends
        ends = in_chat_turn if assistant_marker(context_text) in context_text else elsewhere
        return [*self.tokenizer.encode(text, add_special_tokens=False), *ends]

    def answer(self, input_ids: list[int], params: dict, return_logprob: bool) -> dict:
        """The JSON body SGLang answers a finished request with."""
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
        rules = FinishRules.of(self.version, decode, params, self.turn_ends[1][-1:])  # the end of text: its EOS
        decoded = decode_steps(self.planned(input_ids), rules)
        out = decoded.ids
        meta = answer_meta(
            self.version,
            request_id=uuid.uuid4().hex,
            finish=decoded.finish,
            prompt_tokens=len(input_ids),
            completion_tokens=len(out),
            weight_version=SCRIPTED_WEIGHT_VERSION,
        )
        if return_logprob:
            log_probs = [scripted_log_prob(len(input_ids) + i, token) for i, token in enumerate(out)]
            meta.update(output_token_logprobs(log_probs, out))
        skip = bool(params.get("skip_special_tokens", True))
        text_of = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip)  # noqa: E731
        text = trimmed_text(text_of, out, decoded.finish, params)
        return {"text": text, "output_ids": out, "meta_info": meta}

    def _build_app(self) -> FastAPI:
        app = FastAPI(title=f"SGLang's /generate, {SCRIPTED_LABEL}")

        @app.get("/health")
        async def health():
            return {}

        @app.get("/model_info")
        async def model_info():
            return {
                "model_path": f"{SCRIPTED_LABEL} (tokenizer {self.tokenizer_path})",
                "tokenizer_path": self.tokenizer_path,
                "is_generation": True,
                "weight_version": SCRIPTED_WEIGHT_VERSION,
            }

        @app.post("/generate")
        async def generate(request: Request):
            body = await request.json()
            params = body.get("sampling_params") or {}
            if "input_ids" in body:
                input_ids = [int(i) for i in body["input_ids"]]
            elif "text" in body:
                input_ids = self.tokenizer.encode(body["text"], add_special_tokens=False)
            else:
                return JSONResponse({"error": {"message": "Either text or input_ids should be provided."}}, 400)
            refusal, conditioned, max_new = admit_request(
                self.version, input_ids, params, LengthRules(self.context_length)
            )
            if refusal is not None:
                return JSONResponse(refusal, 400)
            params = {**params, "max_new_tokens": max_new}
            # the tokenizer's work off the event loop: requests in flight are answered side by side
            return await asyncio.to_thread(self.answer, conditioned, params, bool(body.get("return_logprob")))

        return app


class _Server(uvicorn.Server):
    """uvicorn's server, with an event set once its startup is over (listening, or failed)."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.startup_over = threading.Event()

    async def startup(self, sockets=None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.startup_over.set()

    def run(self, sockets=None) -> None:
        try:
            super().run(sockets=sockets)
        finally:
            self.startup_over.set()  # it ended before or during its startup


@contextlib.contextmanager
def serving(
    app, host: str, port: int, name: str = "standin", stop_wait: float | None = None
) -> Iterator[threading.Thread]:
    """`app` served by uvicorn in a thread named <name>-<port> (the main thread keeps the signals:
    launch/signals.py); yields the thread once it listens, asks it to stop on exit and waits for it (at most
    `stop_wait` seconds when given). RuntimeError when it cannot listen there."""
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name=f"{name}-{port}", daemon=True)
    thread.start()
    server.startup_over.wait()
    if not server.started:
        thread.join()
        raise RuntimeError(f"cannot listen on {host}:{port} (in use?)")
    try:
        yield thread
    finally:
        server.should_exit = True
        thread.join(stop_wait)
