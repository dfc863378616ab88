"""Search-R1's retrieval server, batched: `POST /retrieve`, `GET /health`, `/docs`.

Run it like the original (flags and API are the same), as a script or as a module:

    python local_dense_retriever/retrieval_server.py --index_path e5_Flat.index --corpus_path wiki-18.jsonl \
        --topk 3 --retriever_name e5 --retriever_model intfloat/e5-base-v2 --faiss_gpu --port 8000

It binds 127.0.0.1 unless told otherwise, listens at once, and loads the model, index and corpus in the
background; `/health` answers 503 until all three are ready.
"""

import argparse
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

if __package__ in (None, ""):  # run as a script, like the original server: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import Response  # noqa: E402
from pydantic import AfterValidator, BaseModel, Field, StrictStr  # noqa: E402

from local_dense_retriever import cpu_threads  # noqa: E402
from local_dense_retriever.batcher import DynamicBatcher  # noqa: E402
from local_dense_retriever.corpus import Corpus  # noqa: E402

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
        configure_cpu_threads(config.num_threads)  # on GPU too: tokenizing, copies and pooling stay on the CPU
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
                num_threads=config.num_threads,
            )
        searcher = backends.DenseSearcher(encoder, index)
        # Fewer threads while other processes hold cores (--num_threads fixes the count; GPUs need no tuning).
        on_cpu = encoder.device.type == "cpu" or (config.backend == "faiss" and not config.faiss_gpu)
        tuner = cpu_threads.ThreadTuner(
            cpu_threads.thread_count(config.num_threads), adaptive=on_cpu and config.num_threads is None
        )
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
            logger.exception("the retriever failed to load")
            self.status, self.error = "failed", f"{type(err).__name__}: {err}"
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


def _non_blank(query: str) -> str:
    if not query.strip():
        raise ValueError("a query must contain at least one non-whitespace character")
    return query


def build_request_model(max_queries: int, max_query_chars: int, max_topk: int) -> type[BaseModel]:
    Query = Annotated[StrictStr, Field(max_length=max_query_chars), AfterValidator(_non_blank)]

    class RetrieveRequest(BaseModel):
        queries: list[Query] = Field(
            min_length=1,
            max_length=max_queries,
            description=f"1 to {max_queries} search queries, each at most {max_query_chars} characters",
        )
        topk: int | None = Field(
            default=None, ge=1, le=max_topk, description="documents per query; omit for the server's --topk"
        )
        # Search-R1's request model defaults to False; its server then crashed on it. Here both shapes work.
        return_scores: bool = Field(
            default=False, description='false: hits are documents; true: hits are {"document", "score"}'
        )

    return RetrieveRequest


def _json(payload, status_code: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status_code, media_type="application/json")


def create_app(config: ServerConfig, load: Callable[[Callable[[str], None]], Resources] | None = None) -> FastAPI:
    """The FastAPI app; `load` (default: the real model, index and corpus) runs in a background thread."""
    runtime = Runtime(load or (lambda report: load_resources(config, report)))
    RetrieveRequest = build_request_model(config.max_queries_per_request, config.max_query_chars, config.max_topk)
    accepted = {
        "queries": f"a list of 1 to {config.max_queries_per_request} non-blank strings of at most "
        f"{config.max_query_chars} characters",
        "topk": f"an integer from 1 to {config.max_topk}, or omitted for the server default {config.topk}",
        "return_scores": "true or false",
    }

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        runtime.start()
        yield
        if runtime.resources is not None:
            runtime.resources.close()

    app = FastAPI(title="Search-R1 local retriever", lifespan=lifespan)
    app.state.runtime = runtime

    @app.exception_handler(RequestValidationError)
    async def explain_validation_error(request: Request, exc: RequestValidationError) -> Response:
        problems, errors = [], []
        for error in exc.errors():
            path = [str(part) for part in error["loc"][1:]]
            field = path[0] if path and path[0] in accepted else None
            where = ".".join(path) or "request body"
            hint = accepted[field] if field else 'a JSON object like {"queries": ["..."], "topk": 3}'
            problems.append(f"{where}: {error['msg']} (accepted: {hint})")
            errors.append({"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]})
        return _json({"detail": "; ".join(problems), "errors": errors}, status_code=422)

    @app.get("/health")
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

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> Response:
        if runtime.status != "ok":
            return _json({"detail": f"the retriever is not ready ({runtime.status}: {runtime.stage})"}, 503)
        resources = runtime.resources
        topk = request.topk or config.topk
        try:
            scores, rows = await resources.batcher.submit(request.queries, topk)
        except Exception as err:
            return _json({"detail": f"retrieval failed: {type(err).__name__}: {err}"}, status_code=500)
        try:
            result = []
            for query_scores, query_rows in zip(scores.tolist(), rows.tolist(), strict=True):
                kept = [i for i, row in enumerate(query_rows) if row >= 0]  # -1: fewer than topk candidates
                documents = resources.corpus.get_many([query_rows[i] for i in kept])
                if request.return_scores:
                    scored = zip(documents, (query_scores[i] for i in kept), strict=True)
                    result.append([{"document": doc, "score": score} for doc, score in scored])
                else:
                    result.append(documents)
        except (ValueError, IndexError) as err:  # a malformed corpus line: the message names file and line
            return _json({"detail": f"corpus lookup failed: {err}"}, status_code=500)
        return _json({"result": result})

    return app


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
    model_path = args.retriever_model
    # Hub ids ("intfloat/e5-base-v2") are left to transformers; something that looks like a path must exist.
    if not is_bm25 and (model_path.startswith((".", "/", "~")) or model_path.count("/") > 1):
        _existing(parser, "--retriever_model", os.path.expanduser(model_path), "directory")
    for flag, value, low in [
        ("--max_topk", args.max_topk, 1),
        ("--max_queries_per_request", args.max_queries_per_request, 1),
        ("--max_query_chars", args.max_query_chars, 1),
        ("--max_length", args.max_length, 1),
        ("--max_batch_size", args.max_batch_size, 1),
        ("--num_threads", args.num_threads, 1),
        ("--max_wait_ms", args.max_wait_ms, 0),
    ]:
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    if not 1 <= args.topk <= args.max_topk:
        parser.error(f"--topk must be from 1 to --max_topk ({args.max_topk}), got {args.topk}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be from 0 to 65535, got {args.port}")
    config = ServerConfig(
        index_path=args.index_path,
        corpus_path=args.corpus_path,
        topk=args.topk,
        retriever_name=args.retriever_name,
        retriever_model=os.path.expanduser(model_path),
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
    )
    return config, args


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    config, args = parse_config(argv)
    cpu_threads.calm_openmp()  # before torch and faiss load (in the loader thread): OpenMP reads it only then
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs every SIMD variant it tries
    app = create_app(config)
    # Access logs cost more CPU than a batched search at hundreds of requests per second.
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    )
    app.state.runtime.on_failure = lambda: setattr(server, "should_exit", True)
    logger.info("listening on http://%s:%d (GET /health says when the retriever is ready)", args.host, args.port)
    server.run()
    return 1 if app.state.runtime.status == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
