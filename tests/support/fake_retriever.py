"""A loopback retrieval server speaking Search-R1's /retrieve API (and ASearcher's /access) over a small in-memory
corpus whose passages carry their article's URL.

Ranking is plain word overlap (the real E5 + FAISS server has its own tests); what matters here is
the protocol: both result shapes, status codes, latency and injected failures.
"""

import asyncio
import re
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

_WORD = re.compile(r"\w+")

DEFAULT_DOCS = [
    '"Paris"\nParis is the capital and most populous city of France.',
    '"Berlin"\nBerlin is the capital and largest city of Germany.',
    '"Mount Everest"\nMount Everest is Earth\'s highest mountain above sea level, in the Himalayas.',
    '"Python (programming language)"\nPython is a high-level programming language created by Guido van Rossum.',
    '"Marie Curie"\nMarie Curie was a physicist and chemist who won two Nobel Prizes.',
    '"Amazon River"\nThe Amazon River in South America is the largest river by discharge volume of water.',
]


def page_url(contents: str) -> str:
    return "https://en.wikipedia.org/wiki/" + contents.split("\n", 1)[0].strip('"').replace(" ", "_")


def article(contents: str) -> str:
    """A page longer than its passage: the passage and a few sentences more."""
    title, _, text = contents.partition("\n")
    return f"{title.strip(chr(34))}\n\n{text} " + " ".join(
        f"More about {title.strip(chr(34))}, part {i}." for i in range(40)
    )


class Hold:
    def __init__(self):
        self.reached = threading.Event()
        self.released = threading.Event()
        self.status = 200

    def release(self, status: int = 200) -> None:
        self.status = status
        self.released.set()


class FakeRetriever:
    def __init__(self, docs: list[str] | None = None, *, latency_s: float = 0.0, scores_shape: bool | None = None):
        """`scores_shape` forces one result shape whatever the request asks (None: honour return_scores)."""
        self.docs = [
            {"id": str(i), "contents": text, "url": page_url(text)} for i, text in enumerate(docs or DEFAULT_DOCS)
        ]
        # the articles by URL, as ASearcher's wiki_webpages.jsonl holds them
        self.pages = {doc["url"]: {"url": doc["url"], "contents": article(doc["contents"])} for doc in self.docs}
        self.accessed: list[str] = []
        self.access_status: int | None = None  # answer /access with this status (a pages server that is down)
        self.hold: Hold | None = None  # the next /retrieve waits in flight until released
        self.latency_s = latency_s
        self.scores_shape = scores_shape
        self.queries: list[str] = []
        self.failures_left = 0
        self.failure_status = 503
        self.failure_retry_after: str | None = None  # the Retry-After header of the injected failures
        self.down = False
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.answer_seconds: list[float] = []  # how long each /retrieve took to answer, on time.perf_counter's clock
        self.together = 0  # the first `together` /retrieve requests wait until they are all in flight at once
        self._all_together: asyncio.Event | None = None
        self.bodies: list[dict] = []
        # misbehaviour on demand: a fixed answer (body bytes, status; streamed without Content-Length when
        # `stream_answer`), or more hits than the request's topk
        self.raw_answer: tuple[bytes, int] | None = None
        self.stream_answer = False
        self.answer_topk: int | None = None
        self.app = self._build_app()

    def fail_next(self, count: int, status: int = 503, retry_after: str | None = None) -> None:
        self.failures_left, self.failure_status, self.failure_retry_after = count, status, retry_after

    def rank(self, query: str, topk: int) -> list[tuple[dict, float]]:
        words = set(_WORD.findall(query.lower()))

        def overlap(doc) -> float:
            text = str(doc.get("contents", "")) if isinstance(doc, dict) else str(doc)
            return float(len(words & set(_WORD.findall(text.lower()))))

        scored = [(doc, overlap(doc)) for doc in self.docs]
        scored.sort(key=lambda pair: -pair[1])
        return scored[:topk]

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health():
            return {"status": "ok"}

        @app.post("/retrieve")
        async def retrieve(request: Request):
            started = time.perf_counter()
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if self.requests <= self.together:
                    await self._wait_for_the_others()
                return await self._retrieve(await request.json())
            finally:
                self.in_flight -= 1
                self.answer_seconds.append(time.perf_counter() - started)

        @app.post("/access")
        async def access(request: Request):
            urls = (await request.json()).get("urls")
            if self.access_status is not None:
                return JSONResponse({"detail": "pages unavailable"}, status_code=self.access_status)
            if not isinstance(urls, list) or not urls or not all(isinstance(url, str) for url in urls):
                return JSONResponse({"detail": "urls must be a non-empty list of strings"}, 422)
            self.accessed.extend(urls)
            return {"result": [self.pages.get(url.replace("index.php/", "index.php?title=")) for url in urls]}

        return app

    async def _wait_for_the_others(self) -> None:
        # every handler runs on the server's one event loop: an asyncio.Event made there is safe
        if self._all_together is None:
            self._all_together = asyncio.Event()
        if self.requests == self.together:
            self._all_together.set()
        try:  # a client that never sends that many at once (it is bounded lower) shows up in max_in_flight
            await asyncio.wait_for(self._all_together.wait(), timeout=30)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            self._all_together.set()

    def hold_next(self) -> "Hold":
        """The next /retrieve request waits in flight (`reached` is set) until `release(status)`."""
        self.hold = Hold()
        return self.hold

    async def _retrieve(self, body: dict):
        self.bodies.append(body)
        if self.hold is not None:
            hold, self.hold = self.hold, None
            hold.reached.set()
            await asyncio.get_running_loop().run_in_executor(None, hold.released.wait)
            if hold.status != 200:
                return JSONResponse({"detail": "released with an error"}, status_code=hold.status)
        if self.raw_answer is not None:
            content, status = self.raw_answer
            if self.stream_answer:
                chunks = (content[i : i + 65536] for i in range(0, len(content), 65536))
                return StreamingResponse(chunks, status_code=status, media_type="application/json")
            return Response(content, status_code=status, media_type="application/json")
        if self.down:
            return JSONResponse({"detail": "down"}, status_code=503)
        if self.failures_left > 0:
            self.failures_left -= 1
            headers = {"Retry-After": self.failure_retry_after} if self.failure_retry_after else None
            return JSONResponse({"detail": "injected failure"}, status_code=self.failure_status, headers=headers)
        queries = body.get("queries")
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) and q for q in queries):
            return JSONResponse({"detail": "queries must be a non-empty list of non-empty strings"}, 422)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        self.queries.extend(queries)
        topk = self.answer_topk or int(body.get("topk") or 3)
        results = []
        for query in queries:
            ranked = self.rank(query, topk)
            with_scores = body.get("return_scores", False) if self.scores_shape is None else self.scores_shape
            if with_scores:
                results.append([{"document": doc, "score": score} for doc, score in ranked])
            else:
                results.append([doc for doc, _ in ranked])
        return {"result": results}
