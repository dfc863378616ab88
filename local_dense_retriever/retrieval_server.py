"""Search-R1's retrieval server, batched: `POST /retrieve`, `GET /health`, `/docs`.

Run it like the original (flags and API are the same), as a script or as a module:

    python local_dense_retriever/retrieval_server.py --index_path e5_Flat.index --corpus_path wiki-18.jsonl \
        --topk 3 --retriever_name e5 --retriever_model intfloat/e5-base-v2 --faiss_gpu --port 8000

It binds 127.0.0.1 unless told otherwise, listens at once, and loads the model, index and corpus in the
background; `/health` answers 503 until all three are ready. Every response it sends is described in its OpenAPI
document (`/openapi.json`, `/docs`); slow, idle and surplus connections are timed out or refused (see connections.py).
"""

import argparse
import asyncio
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

if __package__ in (None, ""):  # run as a script, like the original server: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, ValidationError  # noqa: E402
from starlette.requests import ClientDisconnect  # noqa: E402

from local_dense_retriever import cpu_threads  # noqa: E402
from local_dense_retriever.batcher import BatcherClosed, DynamicBatcher  # noqa: E402
from local_dense_retriever.corpus import Corpus  # noqa: E402
from local_dense_retriever.model_source import check_model_source  # noqa: E402

logger = logging.getLogger("local_dense_retriever")

CPU_MAX_BATCH_SIZE = 64
GPU_MAX_BATCH_SIZE = 512


@dataclass
class ServerConfig:
    index_path: str | None
    corpus_path: str
    topk: int = 3
    retriever_name: str = "e5"
    retriever_model: str = "intfloat/e5-base-v2"
    backend: str = "faiss"  # faiss | qdrant; `--retriever_name bm25` selects BM25 whatever this says
    faiss_gpu: bool = False
    faiss_fp16: bool = True
    faiss_mmap: bool = False
    faiss_search_params: str | None = None
    qdrant_url: str | None = None
    qdrant_path: str | None = None
    qdrant_collection: str = "search_r1"
    device: str = "auto"
    dtype: str = "auto"
    pooling_method: str = "auto"
    max_length: int = 256
    num_threads: int | None = None
    max_batch_size: int | None = None  # None: 64 on CPU, 512 on GPU
    max_wait_ms: float = 5.0  # measured on CPU: 16 clients 216 -> 292 QPS, 64 clients 281 -> 320 QPS vs 0
    max_queries_per_request: int = 512
    max_query_chars: int = 4096
    max_topk: int = 100
    # A maximum-size request (512 queries x topk 100) answered 32 MB of wiki-18 passages; 16 MB is ~25k hits.
    max_response_mb: float = 16.0
    timeout_request: float = 30.0  # seconds for the request headers, and again for the body

    @property
    def max_request_bytes(self) -> int:
        """The largest valid body: every character written as \\uXXXX escapes (12 bytes above U+FFFF)."""
        return self.max_queries_per_request * (12 * self.max_query_chars + 8) + 4096

    @property
    def is_bm25(self) -> bool:
        return self.retriever_name.lower() == "bm25"


@dataclass
class Resources:
    searcher: object
    corpus: Corpus
    batcher: DynamicBatcher
    description: str
    thread_settings: dict = field(default_factory=dict)  # what the process was given (usable CPUs, wait policy)
    thread_tuner: cpu_threads.ThreadTuner | None = None  # the thread count it uses now, per batch size

    def close(self) -> None:
        self.batcher.close()
        self.corpus.close()
        if hasattr(self.searcher, "close"):
            self.searcher.close()


def load_resources(config: ServerConfig, report: Callable[[str], None] = lambda stage: None) -> Resources:
    """Model, index and corpus, checked against each other, plus the batching worker."""
    report("importing torch and faiss")
    from local_dense_retriever import backends

    tuner = None
    if config.is_bm25:
        report("loading the BM25 index")
        searcher = backends.BM25Searcher(config.index_path)
        max_batch_size = config.max_batch_size or CPU_MAX_BATCH_SIZE
    else:
        from local_dense_retriever.encoders import configure_cpu_threads, encoder_from_config

        report("loading the encoder")
        encoder = encoder_from_config(config)
        threads = cpu_threads.thread_count(config.num_threads)
        configure_cpu_threads(threads)  # on GPU too: tokenizing, copies and pooling stay on the CPU
        report("loading the index")
        if config.backend == "qdrant":
            index = backends.QdrantIndex(config.qdrant_collection, url=config.qdrant_url, path=config.qdrant_path)
        else:
            index = backends.FaissIndex(
                config.index_path,
                use_gpu=config.faiss_gpu,
                gpu_fp16=config.faiss_fp16,
                search_params=config.faiss_search_params,
                mmap=config.faiss_mmap,
                num_threads=threads,
            )
        searcher = backends.DenseSearcher(encoder, index)
        # Fewer threads while other processes hold cores (--num_threads fixes the count; GPUs need no tuning).
        on_cpu = encoder.device.type == "cpu" or (config.backend == "faiss" and not config.faiss_gpu)
        tuner = cpu_threads.ThreadTuner(threads, adaptive=on_cpu and config.num_threads is None)
        max_batch_size = config.max_batch_size or (
            GPU_MAX_BATCH_SIZE if encoder.device.type == "cuda" else CPU_MAX_BATCH_SIZE
        )
    report("opening the corpus")
    corpus = Corpus(config.corpus_path)
    if len(corpus) != searcher.size:
        raise ValueError(
            f"--corpus_path {corpus.path} has {len(corpus)} documents but the index has {searcher.size}; "
            "row i of the index must be line i of the corpus (were they built from the same file?)"
        )
    report("warming up")
    searcher.search(["warm-up query"], min(config.topk, len(corpus)))
    search = tuner.wrap(searcher.search) if tuner else searcher.search
    batcher = DynamicBatcher(search, max_batch_size=max_batch_size, max_wait_ms=config.max_wait_ms)
    description = f"{searcher.description}; corpus {corpus.path} ({len(corpus)} documents)"
    threads = cpu_threads.report()
    logger.info("CPU threads: %s", threads)
    return Resources(searcher, corpus, batcher, description, thread_settings=threads, thread_tuner=tuner)


class Runtime:
    """Loading state shared by the routes: loading -> ok, or loading -> failed."""

    def __init__(self, load: Callable[[Callable[[str], None]], Resources]):
        self._load = load
        self.status = "loading"
        self.stage = "starting"
        self.load_seconds: dict[str, float] = {}  # per stage, so slow startups say where the time went
        self._stage_started = time.perf_counter()
        self.error: str | None = None
        self.resources: Resources | None = None
        self.on_failure: Callable[[], None] = lambda: None

    def start(self) -> None:
        threading.Thread(target=self._run, name="retriever-loader", daemon=True).start()

    def _run(self) -> None:
        try:
            self.resources = self._load(self._report)
        except Exception as err:
            self.status, self.error = "failed", f"{type(err).__name__}: {err}"
            if isinstance(err, ValueError | OSError):  # bad or mismatched inputs: the message says which
                logger.error("the retriever failed to load: %s", " ".join(str(err).split()))
            else:  # a bug: keep the traceback
                logger.exception("the retriever failed to load")
            self.on_failure()
            return
        self._close_stage("ready")
        gc.freeze()  # the model, index and tokenizer live forever: keep them out of every full GC pass
        self.status = "ok"
        logger.info("retriever ready in %.1f s: %s", sum(self.load_seconds.values()), self.resources.description)

    def _close_stage(self, next_stage: str) -> None:
        now = time.perf_counter()
        self.load_seconds[self.stage] = round(now - self._stage_started, 3)
        self.stage, self._stage_started = next_stage, now

    def _report(self, stage: str) -> None:
        self._close_stage(stage)
        logger.info("%s ...", stage)


# ---------------------------------------------------------------------------------------------- API models
# The OpenAPI document is generated from these; every response the server sends is one of them.


def _non_blank(query: str) -> str:
    if not query.strip():
        raise ValueError("a query must contain at least one non-whitespace character")
    return query


def build_request_model(max_queries: int, max_query_chars: int, max_topk: int) -> type[BaseModel]:
    """Search-R1's request, strictly typed: no "3" or 3.0 for topk, no 1 for true, no unknown fields."""
    Query = Annotated[
        StrictStr,
        Field(max_length=max_query_chars, json_schema_extra={"pattern": r"\S"}),
        AfterValidator(_non_blank),
    ]

    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")

        queries: list[Query] = Field(
            min_length=1,
            max_length=max_queries,
            description=f"1 to {max_queries} search queries, each at most {max_query_chars} characters",
        )
        topk: int | None = Field(
            default=None,
            ge=1,
            le=max_topk,
            description="documents per query, an integer literal (3, not 3.0); omit for the server's --topk",
        )
        # Search-R1's request model defaults to False; its server then crashed on it. Here both shapes work.
        return_scores: bool = Field(
            default=False, description='false: hits are documents; true: hits are {"document", "score"}'
        )

    return RetrieveRequest


class Document(BaseModel):
    """A corpus line as stored: `contents` is always a string; other fields (usually `id`) are passed through."""

    model_config = ConfigDict(extra="allow")
    contents: str


class ScoredHit(BaseModel):
    document: Document
    score: float


class RetrieveResponse(BaseModel):
    result: list[list[Document]] | list[list[ScoredHit]] = Field(
        description="one list of hits per query, best first; scored hits when return_scores is true"
    )


class ErrorResponse(BaseModel):
    detail: str = Field(description="what was wrong, and what is accepted")


class FieldError(BaseModel):
    loc: list[str | int] = Field(description='where: ["body", field, index]')
    msg: str
    type: str


class ValidationErrorResponse(BaseModel):
    detail: str = Field(description="every problem, each with what is accepted there")
    errors: list[FieldError]


class HealthReady(BaseModel):
    status: Literal["ok"]
    retriever: str
    documents: int
    max_batch_size: int
    max_wait_ms: float
    batches: dict[str, float]
    load_seconds: dict[str, float]
    cpu_threads: dict[str, Any] = Field(
        description="usable CPUs and where that came from, the OpenMP wait policy, and per batch size the thread "
        "count in use with its measured batch times"
    )
    config: dict[str, Any]


class HealthNotReady(BaseModel):
    status: Literal["loading", "failed"]
    detail: str = Field(description="the stage being loaded, or why loading failed")


RETRIEVE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": RetrieveResponse, "description": "the hits of every query"},
    400: {"model": ErrorResponse, "description": "the body is not UTF-8 JSON, or the client left while sending it"},
    408: {"model": ErrorResponse, "description": "the body did not arrive within --timeout_request seconds"},
    413: {"model": ErrorResponse, "description": "the body is larger than any valid request"},
    415: {"model": ErrorResponse, "description": "the Content-Type is not application/json"},
    422: {
        "model": ValidationErrorResponse,
        "description": "the JSON is not a valid request, or its response would exceed --max_response_mb",
    },
    500: {"model": ErrorResponse, "description": "retrieval or the corpus lookup failed (the message says where)"},
    503: {"model": ErrorResponse, "description": "the retriever is still loading, failed to load, or is stopping"},
}
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": HealthReady, "description": "model, index and corpus are loaded"},
    503: {"model": HealthNotReady, "description": "still loading (the stage), or loading failed (why)"},
}


def _json(payload, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status_code, media_type="application/json", headers=headers)


def _error(status_code: int, detail: str, close: bool = False) -> Response:
    # close: the rest of the body may still be on the wire, so this connection cannot carry another request
    return _json({"detail": detail}, status_code, headers={"connection": "close"} if close else None)


class RequestTooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"the body is {int(declared)} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _client_left(request: Request) -> None:
    """Returns when the client closes the connection (the body is read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _is_json(content_type: str | None) -> bool:
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


class ResponseTooLarge(Exception):
    pass


def create_app(config: ServerConfig, load: Callable[[Callable[[str], None]], Resources] | None = None) -> FastAPI:
    """The FastAPI app; `load` (default: the real model, index and corpus) runs in a background thread."""
    runtime = Runtime(load or (lambda report: load_resources(config, report)))
    RetrieveRequest = build_request_model(config.max_queries_per_request, config.max_query_chars, config.max_topk)
    accepted = {
        "queries": f"a list of 1 to {config.max_queries_per_request} non-blank strings of at most "
        f"{config.max_query_chars} characters",
        "topk": f"a JSON integer from 1 to {config.max_topk} (not a string, 3.0 or true), or omitted for the "
        f"server default {config.topk}",
        "return_scores": "true or false (JSON booleans, not strings or numbers)",
    }
    max_response_bytes = int(config.max_response_mb * 2**20)
    request_body_schema = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": RetrieveRequest.model_json_schema()}},
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

    def explain(err: ValidationError) -> Response:
        problems, errors = [], []
        for error in err.errors(include_url=False):
            path = [str(part) for part in error["loc"]]
            where = ".".join(path) or "request body"
            if error["type"] == "extra_forbidden":
                problems.append(f"{where}: unknown field (accepted fields: {', '.join(accepted)})")
            else:
                field = path[0] if path and path[0] in accepted else None
                hint = accepted[field] if field else 'a JSON object like {"queries": ["..."], "topk": 3}'
                problems.append(f"{where}: {error['msg']} (accepted: {hint})")
            errors.append({"loc": ["body", *error["loc"]], "msg": error["msg"], "type": error["type"]})
        return _json({"detail": "; ".join(problems), "errors": errors}, status_code=422)

    def response_too_large(detail: str) -> Response:
        error = {"loc": ["body"], "msg": detail, "type": "response_too_large"}
        return _json({"detail": detail, "errors": [error]}, status_code=422)

    def check_response_size(hits: int, size: float, return_scores: bool, estimated: bool) -> None:
        size += hits * (32 if return_scores else 2)  # {"document":...,"score":...} or the comma and brackets
        if size > max_response_bytes:
            about = "about " if estimated else ""
            raise ResponseTooLarge(
                f"the response would hold {hits} documents, {about}{size / 2**20:.1f} MB, over the server's "
                f"--max_response_mb {config.max_response_mb:g}; ask for fewer queries per request or a smaller topk"
            )

    @app.get("/health", responses=HEALTH_RESPONSES)
    async def health() -> Response:
        if runtime.status != "ok":
            detail = runtime.error if runtime.status == "failed" else runtime.stage
            return _json({"status": runtime.status, "detail": detail}, status_code=503)
        resources = runtime.resources
        return _json(
            {
                "status": "ok",
                "retriever": resources.description,
                "documents": len(resources.corpus),
                "max_batch_size": resources.batcher.max_batch_size,
                "max_wait_ms": resources.batcher.max_wait * 1000.0,
                "batches": resources.batcher.stats.as_dict(),
                "load_seconds": runtime.load_seconds,
                "cpu_threads": {
                    **resources.thread_settings,
                    **(resources.thread_tuner.report() if resources.thread_tuner else {}),
                },
                "config": asdict(config),
            }
        )

    @app.post("/retrieve", responses=RETRIEVE_RESPONSES, openapi_extra=request_body_schema)
    async def retrieve(request: Request) -> Response:
        """Search-R1's retrieval API: `{"queries": [...], "topk": 3, "return_scores": false}`."""
        if not _is_json(request.headers.get("content-type")):
            got = request.headers.get("content-type")
            return _error(
                415,
                f"the body must be JSON sent with Content-Type: application/json (got {got!r})"
                if got
                else "the request has no Content-Type header; send the JSON body with Content-Type: application/json",
                close=True,
            )
        try:
            body = await asyncio.wait_for(_read_body(request, config.max_request_bytes), config.timeout_request)
        except RequestTooLarge as err:
            return _error(
                413,
                f"{err}: no valid request is larger than {config.max_request_bytes} bytes "
                f"({config.max_queries_per_request} queries of {config.max_query_chars} characters)",
                close=True,
            )
        except asyncio.TimeoutError:
            return _error(408, f"the body did not arrive within {config.timeout_request:g} s", close=True)
        except ClientDisconnect:
            return _error(400, "the client disconnected before sending the whole body", close=True)
        try:
            payload = RetrieveRequest.model_validate_json(body)
        except ValidationError as err:
            if err.errors()[0]["type"] == "json_invalid":
                return _error(400, f"the body is not valid UTF-8 JSON: {err.errors()[0]['msg']}")
            return explain(err)
        if runtime.status != "ok":
            return _error(503, f"the retriever is not ready ({runtime.status}: {runtime.stage})")
        resources = runtime.resources
        topk = payload.topk or config.topk
        hits = len(payload.queries) * min(topk, len(resources.corpus))
        try:  # before any work, from the corpus's mean line size; exactly once the rows are known
            check_response_size(hits, hits * resources.corpus.mean_line_bytes, payload.return_scores, True)
        except ResponseTooLarge as err:
            return response_too_large(str(err))
        work = asyncio.ensure_future(resources.batcher.submit(payload.queries, topk))
        left = asyncio.ensure_future(_client_left(request))
        try:
            await asyncio.wait({work, left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            if not work.done():  # the client left, or shutdown cancelled us: drop the request's remaining batches
                work.cancel()
        if work.cancelled():
            return _error(400, "the client disconnected before the answer was ready")
        try:
            scores, rows = work.result()
        except BatcherClosed as err:
            return _error(503, str(err))
        except Exception as err:
            return _error(500, f"retrieval failed: {type(err).__name__}: {err}")
        found = rows >= 0  # -1: fewer than topk candidates
        try:
            size = resources.corpus.lines_bytes(rows[found])
            check_response_size(int(found.sum()), size, payload.return_scores, False)
            result = render_hits(resources.corpus, scores, rows, found, payload.return_scores)
        except ResponseTooLarge as err:
            return response_too_large(str(err))
        except (ValueError, IndexError) as err:  # a malformed corpus line: the message names file and line
            return _error(500, f"corpus lookup failed: {err}")
        return _json({"result": result})

    return app


def render_hits(corpus: Corpus, scores: np.ndarray, rows: np.ndarray, found: np.ndarray, with_scores: bool) -> list:
    result = []
    for query_scores, query_rows, query_found in zip(scores.tolist(), rows.tolist(), found, strict=True):
        kept = np.flatnonzero(query_found).tolist()
        documents = corpus.get_many([query_rows[i] for i in kept])
        if with_scores:
            scored = zip(documents, (query_scores[i] for i in kept), strict=True)
            result.append([{"document": doc, "score": score} for doc, score in scored])
        else:
            result.append(documents)
    return result


def _existing(parser: argparse.ArgumentParser, flag: str, value: str | None, kind: str = "file") -> None:
    if value is None:
        parser.error(f"{flag} is required")
    path = Path(value)
    ok = path.is_dir() if kind == "directory" else path.is_file()
    if not ok:
        parser.error(f"{flag} {value}: no such {kind}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Search-R1 retrieval server with dynamic batching (FAISS / Qdrant / BM25).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = parser.add_argument_group("data (Search-R1 flags)")
    data.add_argument("--index_path", help="FAISS index file (a bm25s directory for --retriever_name bm25)")
    data.add_argument("--corpus_path", required=True, help="corpus .jsonl or .jsonl.gz; line i = index row i")
    data.add_argument("--topk", type=int, default=3, help="documents per query when a request gives no topk")
    data.add_argument("--retriever_name", default="e5", help="e5, bge, dpr, any name (mean pooling) or bm25")
    data.add_argument("--retriever_model", default="intfloat/e5-base-v2", help="Hugging Face model id or directory")
    data.add_argument("--faiss_gpu", action="store_true", help="clone the FAISS index to every visible GPU (fp16)")
    data.add_argument("--faiss_fp32", action="store_true", help="with --faiss_gpu: keep fp32 vectors on the GPUs")
    data.add_argument("--faiss_mmap", action="store_true", help="memory-map a Flat index instead of reading it")
    data.add_argument("--faiss_search_params", help='e.g. "nprobe=64" (IVF) or "efSearch=128" (HNSW)')
    data.add_argument("--backend", choices=["faiss", "qdrant"], default="faiss", help="vector store for dense search")
    data.add_argument("--qdrant_url", help="Qdrant server URL (with --backend qdrant)")
    data.add_argument("--qdrant_path", help="qdrant-client embedded storage directory (with --backend qdrant)")
    data.add_argument("--qdrant_collection", default="search_r1", help="Qdrant collection name")
    model = parser.add_argument_group("encoder")
    model.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda, cuda:1, ...")
    model.add_argument("--dtype", choices=["auto", "fp32", "fp16", "bf16"], default="auto", help="auto: fp16 on GPU")
    model.add_argument("--pooling_method", choices=["auto", "mean", "cls", "pooler"], default="auto")
    model.add_argument("--max_length", type=int, default=256, help="query tokens kept by the encoder")
    model.add_argument("--num_threads", type=int, default=None, help="CPU threads for torch and FAISS (usable CPUs)")
    serving = parser.add_argument_group("serving")
    serving.add_argument("--host", default="127.0.0.1", help="bind address; 0.0.0.0 exposes the server")
    serving.add_argument("--port", type=int, default=8000)
    serving.add_argument("--max_batch_size", type=int, default=None, help="queries per forward pass (64 CPU/512 GPU)")
    serving.add_argument(
        "--max_wait_ms", type=float, default=5.0, help="wait for returning clients to refill a batch (0: never)"
    )
    serving.add_argument("--max_queries_per_request", type=int, default=512)
    serving.add_argument("--max_query_chars", type=int, default=4096)
    serving.add_argument("--max_topk", type=int, default=100)
    serving.add_argument(
        "--max_response_mb", type=float, default=16.0, help="larger answers are refused with a 422 (ask fewer hits)"
    )
    connections = parser.add_argument_group("connections")
    connections.add_argument(
        "--timeout_request",
        type=float,
        default=30.0,
        help="seconds a client gets for the request headers (from connecting, or from the first byte on a kept-alive "
        "connection) and again for the body; slower connections are closed (408 for the body)",
    )
    connections.add_argument(
        "--timeout_keep_alive", type=float, default=5.0, help="seconds an idle kept-alive connection stays open"
    )
    connections.add_argument(
        "--timeout_graceful_shutdown",
        type=float,
        default=5.0,
        help="on SIGTERM, seconds in-flight requests get to finish; then they are cancelled and queued work dropped",
    )
    connections.add_argument(
        "--max_connections",
        type=int,
        default=None,
        help="open connections kept at once; more get a 503 (default: the open-file limit minus 100)",
    )
    serving.add_argument("--log_level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def parse_config(argv: list[str] | None = None) -> tuple[ServerConfig, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    is_bm25 = args.retriever_name.lower() == "bm25"
    if is_bm25:
        _existing(parser, "--index_path", args.index_path, "directory")
    elif args.backend == "qdrant":
        if bool(args.qdrant_url) == bool(args.qdrant_path):
            parser.error("--backend qdrant needs exactly one of --qdrant_url and --qdrant_path")
        if args.qdrant_path:
            _existing(parser, "--qdrant_path", args.qdrant_path, "directory")
    else:
        _existing(parser, "--index_path", args.index_path)
    _existing(parser, "--corpus_path", args.corpus_path)
    for flag, value, low in [
        ("--max_topk", args.max_topk, 1),
        ("--max_queries_per_request", args.max_queries_per_request, 1),
        ("--max_query_chars", args.max_query_chars, 1),
        ("--max_length", args.max_length, 1),
        ("--max_batch_size", args.max_batch_size, 1),
        ("--num_threads", args.num_threads, 1),
        ("--max_wait_ms", args.max_wait_ms, 0),
        ("--max_connections", args.max_connections, 1),
    ]:
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    for flag, value in [
        ("--max_response_mb", args.max_response_mb),
        ("--timeout_request", args.timeout_request),
        ("--timeout_keep_alive", args.timeout_keep_alive),
        ("--timeout_graceful_shutdown", args.timeout_graceful_shutdown),
    ]:
        if not value > 0:  # also refuses nan
            parser.error(f"{flag} must be a positive number of {'MB' if 'mb' in flag else 'seconds'}, got {value}")
    if not 1 <= args.topk <= args.max_topk:
        parser.error(f"--topk must be from 1 to --max_topk ({args.max_topk}), got {args.topk}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be from 0 to 65535, got {args.port}")
    model = args.retriever_model
    if not is_bm25:  # last: for a hub id that is not cached this asks the hub
        try:
            model = check_model_source(args.retriever_model)
        except ValueError as err:
            parser.error(f"--retriever_model {err}")
    config = ServerConfig(
        index_path=args.index_path,
        corpus_path=args.corpus_path,
        topk=args.topk,
        retriever_name=args.retriever_name,
        retriever_model=model,
        backend=args.backend,
        faiss_gpu=args.faiss_gpu,
        faiss_fp16=not args.faiss_fp32,
        faiss_mmap=args.faiss_mmap,
        faiss_search_params=args.faiss_search_params,
        qdrant_url=args.qdrant_url,
        qdrant_path=args.qdrant_path,
        qdrant_collection=args.qdrant_collection,
        device=args.device,
        dtype=args.dtype,
        pooling_method=args.pooling_method,
        max_length=args.max_length,
        num_threads=args.num_threads,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_queries_per_request=args.max_queries_per_request,
        max_query_chars=args.max_query_chars,
        max_topk=args.max_topk,
        max_response_mb=args.max_response_mb,
        timeout_request=args.timeout_request,
    )
    return config, args


def uvicorn_config(app: FastAPI, args: argparse.Namespace):
    """uvicorn settings for the server: bounded connection times and counts (see connections.py)."""
    import uvicorn

    from local_dense_retriever.connections import default_max_connections, guarded_http_protocol, raise_open_file_limit

    open_file_limit = raise_open_file_limit()
    max_connections = args.max_connections or default_max_connections(open_file_limit)
    if max_connections > open_file_limit:
        logger.warning(
            "--max_connections %d is above the open-file limit %d: connections past it will be reset unlogged",
            max_connections,
            open_file_limit,
        )
    logger.info("accepting up to %d connections (open-file limit %d)", max_connections, open_file_limit)
    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,  # access logs cost more CPU than a batched search at hundreds of requests per second
        http=guarded_http_protocol(args.timeout_request, max_connections, open_file_limit),
        timeout_keep_alive=args.timeout_keep_alive,
        timeout_graceful_shutdown=args.timeout_graceful_shutdown,
    )


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    config, args = parse_config(argv)
    cpu_threads.calm_openmp()  # before torch and faiss load (in the loader thread): OpenMP reads it only then
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs every SIMD variant it tries
    app = create_app(config)
    server = uvicorn.Server(uvicorn_config(app, args))
    app.state.runtime.on_failure = lambda: setattr(server, "should_exit", True)
    logger.info("listening on http://%s:%d (GET /health says when the retriever is ready)", args.host, args.port)
    server.run()
    return 1 if app.state.runtime.status == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
