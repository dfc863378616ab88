"""A stand-in for the slime router with its radix-tree middleware (slime before March 2026).

It fronts the loopback engine the way that router did: `/generate` with text (or ids) looks the input
up in a cache of everything it generated (longest token-aligned text prefix; the rest is tokenized
with loss mask 0 and log prob 0.0), sends the engine those ids, and caches input + output.
`/retrieve_from_text` and `/retrieve_from_messages_template` answer from that cache.
`/v1/chat/completions` renders the chat template and generates through the same cache, then parses
Qwen-style tool calls into OpenAI `tool_calls`, as SGLang's OpenAI layer does.
With `legacy_endpoints=False` it behaves like today's slime router: the retrieval endpoints are 404.
"""

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from support.fake_sglang import openai_response, openai_sampling_params, render_openai_messages


class RadixCache:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.entries: list[tuple[list[int], list[int], list[float], list[int]]] = []  # ends, ids, logp, mask
        self.texts: list[str] = []

    def insert(self, ids: list[int], logp: list[float], mask: list[int]) -> None:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        ends = [len(self.tokenizer.decode(ids[: i + 1], skip_special_tokens=False)) for i in range(len(ids))]
        self.entries.append((ends, ids, logp, mask))
        self.texts.append(text)

    def lookup(self, text: str) -> tuple[list[int], list[float], list[int]]:
        best = (0, [], [], [])
        for (ends, ids, logp, mask), cached in zip(self.entries, self.texts, strict=True):
            count = 0
            for i, end in enumerate(ends):
                if end <= len(text) and cached[:end] == text[:end]:
                    count = i + 1
                else:
                    break
            matched = ends[count - 1] if count else 0
            if matched > best[0]:
                best = (matched, ids[:count], logp[:count], mask[:count])
        matched, ids, logp, mask = best
        rest = self.tokenizer.encode(text[matched:], add_special_tokens=False) if matched < len(text) else []
        return list(ids) + rest, list(logp) + [0.0] * len(rest), list(mask) + [0] * len(rest)


class FakeSlimeRouter:
    def __init__(self, tokenizer, engine_url: str, *, legacy_endpoints: bool = True):
        self.tokenizer = tokenizer
        self.engine_url = engine_url
        self.legacy_endpoints = legacy_endpoints
        self.cache = RadixCache(tokenizer)
        self.failures_left = 0  # the next generation requests answer 503
        self.app = self._build_app()

    def _injected_failure(self) -> JSONResponse | None:
        if self.failures_left > 0:
            self.failures_left -= 1
            return JSONResponse({"error": "injected failure"}, 503)
        return None

    async def _generate(self, text: str, body: dict) -> dict:
        ids, logp, mask = self.cache.lookup(text)
        forward = {k: v for k, v in body.items() if k not in ("text", "input_ids")}
        forward.update(input_ids=ids, return_logprob=True)
        async with httpx.AsyncClient(timeout=None) as client:
            response = await client.post(self.engine_url + "/generate", json=forward)
            response.raise_for_status()
            output = response.json()
        meta = output["meta_info"]
        if meta["finish_reason"]["type"] != "abort":
            pairs = meta["output_token_logprobs"]
            self.cache.insert(ids + [p[1] for p in pairs], logp + [p[0] for p in pairs], mask + [1] * len(pairs))
        return output

    def _retrieve(self, text: str) -> dict:
        ids, logp, mask = self.cache.lookup(text)
        return {
            "tokens": ids,
            "response": text,
            "loss_mask": mask,
            "token_length": len(ids),
            "loss_mask_length": len(mask),
            "rollout_logp": logp,
        }

    def _render(self, messages: list[dict], tools, add_generation_prompt: bool) -> str:
        return render_openai_messages(self.tokenizer, messages, tools, add_generation_prompt)

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/generate")
        async def generate(request: Request):
            if failure := self._injected_failure():
                return failure
            body = await request.json()
            text = body["text"] if "text" in body else self.tokenizer.decode(body["input_ids"])
            return await self._generate(text, body)

        @app.post("/retrieve_from_text")
        async def retrieve_from_text(request: Request):
            if not self.legacy_endpoints:
                return JSONResponse({"detail": "Not Found"}, 404)
            body = await request.json()
            return self._retrieve(body.get("text", ""))

        @app.post("/retrieve_from_messages_template")
        async def retrieve_from_messages_template(request: Request):
            if not self.legacy_endpoints:
                return JSONResponse({"detail": "Not Found"}, 404)
            body = await request.json()
            if not body.get("messages"):
                return JSONResponse({"error": "messages is required"}, 400)
            if not self.cache.entries:
                return JSONResponse({"error": "radix cache is empty"}, 503)
            text = self._render(body["messages"], body.get("tools"), bool(body.get("add_generation_prompt")))
            return self._retrieve(text)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request):
            if failure := self._injected_failure():
                return failure
            body = await request.json()
            prompt = self._render(body["messages"], body.get("tools"), True)
            params = openai_sampling_params(body)
            output = await self._generate(prompt, {"sampling_params": params})
            return openai_response(output, self.tokenizer)

        return app
