"""The server's routes: `POST /retrieve` (Search-R1's API, batched across requests), `POST /access` (ASearcher's
pages by URL, with --pages_path) and `GET /health`.

The app listens at once and loads the model, index and corpus in the background (loading.py); requests are read
and checked by bodies.py and answered in the shapes of api.py.
"""

import asyncio
import functools
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from local_dense_retriever.retrieval.corpus import Corpus
from local_dense_retriever.retrieval.pages import Pages
from local_dense_retriever.serving.api import (
    ACCESS_RESPONSES,
    HEALTH_RESPONSES,
    RETRIEVE_RESPONSES,
    build_access_model,
    build_request_model,
    error_response,
    json_response,
    too_large_response,
)
from local_dense_retriever.serving.batcher import BatcherClosed
from local_dense_retriever.serving.bodies import BodyRules, client_left, read_request
from local_dense_retriever.serving.config import ServerConfig
from local_dense_retriever.serving.limits import (
    RETRY_AFTER_SECONDS,
    InFlight,
    ResponseTooLarge,
    check_response_size,
)
from local_dense_retriever.serving.loading import Resources, Runtime, load_resources

RETRY_LATER = {"retry-after": str(RETRY_AFTER_SECONDS)}
CANCELLED_AT_SHUTDOWN = (
    "the retriever is shutting down: this request was still running when --timeout_graceful_shutdown ended, so it "
    "was cancelled; send it again to a running retriever"
)
# Answers to requests of up to this many queries are rendered on the event loop (a thread hop costs more than
# they do); larger ones in a thread.
INLINE_QUERIES = 64


def retrieve_rules(config: ServerConfig) -> BodyRules:
    queries = config.max_queries_in_flight
    return BodyRules(
        model=build_request_model(queries, config.max_topk),
        max_bytes=config.max_request_bytes,
        limit=f"--max_request_mb {config.max_request_mb:g}",
        accepted={
            "queries": f"a list of at most {queries} strings (--max_queries_in_flight), blank or long ones too",
            "topk": f"a JSON integer from 1 to {config.max_topk} (not a string, 3.0 or true), or omitted for the "
            f"server default {config.topk}",
            "return_scores": "true or false (JSON booleans, not strings or numbers)",
        },
        example='{"queries": ["..."], "topk": 3}',
    )


def access_rules(config: ServerConfig) -> BodyRules:
    urls = config.max_queries_in_flight
    return BodyRules(
        model=build_access_model(urls),
        max_bytes=config.max_request_bytes,
        limit=f"--max_request_mb {config.max_request_mb:g}",
        accepted={"urls": f"a list of at most {urls} strings (--max_queries_in_flight)"},
        example='{"urls": ["https://en.wikipedia.org/wiki/Paris"]}',
    )


def read_pages(config: ServerConfig, pages: Pages, urls: list[str]) -> bytes:
    """The answer to /access: the page of every URL, or null; refused before any page is parsed when the lines
    found would be too large."""
    candidates = [pages.candidates(url) for url in urls]
    likeliest = [rows[0] for rows in candidates if rows]
    check_response_size(
        config,
        len(likeliest),
        pages.lines_bytes(likeliest),
        False,
        False,
        "pages",
        "ask for fewer URLs per request",
        entries=len(urls),
    )
    found = [
        next((p for row in rows if (p := pages.page_at(row, url)) is not None), None)
        for url, rows in zip(urls, candidates, strict=True)
    ]
    return orjson.dumps({"result": found})


def render_hits(corpus: Corpus, scores: np.ndarray, rows: np.ndarray, found: np.ndarray, with_scores: bool) -> bytes:
    """The answer to /retrieve: every hit as its whole corpus record (every field of the line), with its score when
    asked."""
    result = []
    for query_scores, query_rows, query_found in zip(scores.tolist(), rows.tolist(), found, strict=True):
        kept = np.flatnonzero(query_found).tolist()
        documents = corpus.get_many([query_rows[i] for i in kept])
        if with_scores:
            scored = zip(documents, (query_scores[i] for i in kept), strict=True)
            result.append([{"document": doc, "score": score} for doc, score in scored])
        else:
            result.append(documents)
    return orjson.dumps({"result": result})


Route = Callable[[Request], Awaitable[Response]]


def answered_at_shutdown(handler: Route) -> Route:
    """The route, answering a request that shutdown cancels with a 503 that says so, and Retry-After.

    When --timeout_graceful_shutdown ends, uvicorn cancels every request still running and answers each one it
    cancelled before its response began with a bare 500 text/plain "Internal Server Error". Clients leaving are seen
    by bodies.client_left, never by cancelling the route, so a cancellation here is always the shutdown's."""

    @functools.wraps(handler)
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except asyncio.CancelledError:
            return error_response(503, CANCELLED_AT_SHUTDOWN, close=True, headers=RETRY_LATER)

    return route


def create_app(config: ServerConfig, load: Callable[[Callable[[str], None]], Resources] | None = None) -> FastAPI:
    """The FastAPI app; `load` (default: the real model, index and corpus) runs in a background thread."""
    runtime = Runtime(load or (lambda report: load_resources(config, report)))
    rules, page_rules = retrieve_rules(config), access_rules(config)
    in_flight = InFlight(config.max_queries_in_flight)

    def body_schema(body: BodyRules) -> dict:
        return {
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": body.model.model_json_schema()}},
            }
        }

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        runtime.start()
        yield
        if runtime.resources is not None:
            runtime.resources.close()

    app = FastAPI(title="Search-R1 local retriever", lifespan=lifespan)
    app.state.runtime = runtime

    @app.get("/health", responses=HEALTH_RESPONSES)
    async def health() -> Response:
        if runtime.status != "ok":
            detail = runtime.error if runtime.status == "failed" else runtime.stage
            return json_response({"status": runtime.status, "detail": detail}, status_code=503)
        resources = runtime.resources
        return json_response(
            {
                "status": "ok",
                "retriever": resources.description,
                "documents": len(resources.corpus),
                "max_batch_size": resources.batcher.max_batch_size,
                "max_batch_tokens": resources.batcher.max_batch_tokens,
                "max_wait_ms": resources.batcher.max_wait * 1000.0,
                "batches": resources.batcher.report(),
                "load_seconds": runtime.load_seconds,
                "in_flight": in_flight.report(),
                "cpu_threads": {
                    **resources.thread_settings,
                    **(resources.thread_tuner.report() if resources.thread_tuner else {}),
                },
                "pages": {"loaded": False}
                if resources.pages is None
                else {"loaded": True, "pages": len(resources.pages), "path": str(resources.pages.path)},
                "config": asdict(config),
            }
        )

    async def read_when_ready(request: Request, body: BodyRules):
        """The request's checked body, or the error response: a bad body first, then a server still loading."""
        in_flight.reading += 1
        try:
            payload = await read_request(request, body, config.timeout_request)
        finally:
            in_flight.reading -= 1
        if not isinstance(payload, Response) and runtime.status != "ok":
            return error_response(503, f"the retriever is not ready ({runtime.status}: {runtime.stage})")
        return payload

    @app.post("/retrieve", responses=RETRIEVE_RESPONSES, openapi_extra=body_schema(rules))
    @answered_at_shutdown
    async def retrieve(request: Request) -> Response:
        """Search-R1's retrieval API: `{"queries": [...], "topk": 3, "return_scores": false}`."""
        payload = await read_when_ready(request, rules)
        if isinstance(payload, Response):
            return payload
        if not payload.queries:  # Search-R1 sends the step's searches even when no sample searched
            return json_response({"result": []})
        resources = runtime.resources
        topk = payload.topk or config.topk
        count = len(payload.queries)
        hits = count * min(topk, len(resources.corpus))
        try:  # before any work, from the corpus's mean line size; exactly once the rows are known
            check_response_size(config, hits, hits * resources.corpus.mean_line_bytes, payload.return_scores, True)
        except ResponseTooLarge as err:
            return too_large_response(str(err))
        if not in_flight.admit(count):
            return error_response(503, in_flight.refusal(count), headers=RETRY_LATER)
        try:
            queries, tokens = await resources.reading.read(payload.queries)
            return await answer_queries(request, resources, queries, tokens, topk, payload.return_scores)
        finally:
            in_flight.release(count)

    async def answer_queries(
        request: Request,
        resources: Resources,
        queries: list[str],
        tokens: list[int] | None,
        topk: int,
        return_scores: bool,
    ) -> Response:
        work = asyncio.ensure_future(resources.batcher.submit(queries, topk, tokens))
        left = asyncio.ensure_future(client_left(request))
        try:
            await asyncio.wait({work, left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            if not work.done():  # the client left, or shutdown cancelled us: drop the request's remaining batches
                work.cancel()
        if work.cancelled():
            return error_response(400, "the client disconnected before the answer was ready")
        try:
            scores, rows = work.result()
        except BatcherClosed as err:
            return error_response(503, str(err), headers=RETRY_LATER)
        except Exception as err:
            return error_response(500, f"retrieval failed: {type(err).__name__}: {err}")
        found = rows >= 0  # -1: fewer than topk candidates
        try:
            size = resources.corpus.lines_bytes(rows[found])
            check_response_size(config, int(found.sum()), size, return_scores, False)
            render = (resources.corpus, scores, rows, found, return_scores)
            # A large answer is read and serialised off the event loop, so requests beside it keep being accepted.
            body = (
                render_hits(*render)
                if len(queries) <= INLINE_QUERIES
                else await asyncio.to_thread(render_hits, *render)
            )
        except ResponseTooLarge as err:
            return too_large_response(str(err))
        except (ValueError, IndexError) as err:  # a malformed corpus line: the message names file and line
            return error_response(500, f"corpus lookup failed: {err}")
        return Response(body, media_type="application/json")

    @app.post("/access", responses=ACCESS_RESPONSES, openapi_extra=body_schema(page_rules))
    @answered_at_shutdown
    async def access(request: Request) -> Response:
        """ASearcher's page access: `{"urls": [...]}` -> `{"result": [page or null, ...]}`, one per URL, in order."""
        payload = await read_when_ready(request, page_rules)
        if isinstance(payload, Response):
            return payload
        pages = runtime.resources.pages
        if pages is None:
            return error_response(
                404, "this server has no pages: start it with --pages_path <wiki_webpages.jsonl> to serve /access"
            )
        count = len(payload.urls)
        if not in_flight.admit(count):
            return error_response(503, in_flight.refusal(count), headers=RETRY_LATER)
        try:  # page lines can be large and cold on disk: read them off the event loop
            body = await asyncio.to_thread(read_pages, config, pages, payload.urls)
        except ResponseTooLarge as err:
            return too_large_response(str(err))
        except (ValueError, IndexError) as err:  # a malformed pages line: the message names file and line
            return error_response(500, f"page lookup failed: {err}")
        finally:
            in_flight.release(count)
        return Response(body, media_type="application/json")

    return app
