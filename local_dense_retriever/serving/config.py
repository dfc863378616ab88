"""What the server was told: its command line (Search-R1's flags, plus serving and connection limits), checked
before anything loads, as a ServerConfig."""

import argparse
from dataclasses import dataclass
from pathlib import Path

from local_dense_retriever.retrieval.model_source import check_model_source


@dataclass
class ServerConfig:
    index_path: str | None
    corpus_path: str
    pages_path: str | None = None  # ASearcher's pages (wiki_webpages.jsonl): POST /access
    topk: int = 3
    retriever_name: str = "e5"
    retriever_model: str = "intfloat/e5-base-v2"
    backend: str = "faiss"  # faiss | qdrant; `--retriever_name bm25` selects BM25 whatever this says
    faiss_gpu: bool = False
    faiss_fp16: bool = True
    faiss_mmap: bool = False
    faiss_search_params: str | None = None
    torch_search: str | None = None  # exact search with torch: "cpu", "all" or GPU ids "0,1"
    torch_search_dtype: str | None = None  # None: fp16 on GPUs, fp32 on the CPU
    search_workspace_mb: float | None = None  # torch search's score workspace per device
    precision_queries: str | None = None  # questions for choosing the CPU encoder's precision (--dtype measured)
    qdrant_url: str | None = None
    qdrant_path: str | None = None
    qdrant_collection: str = "search_r1"
    device: str = "auto"
    dtype: str = "auto"
    pooling_method: str = "auto"
    max_length: int = 256
    num_threads: int | None = None
    max_batch_size: int | None = None  # None: 64 on CPU, 512 on GPU
    max_batch_tokens: int | None = None  # None: 16 per query of max_batch_size (a FanOutQA question: 13 on average)
    max_wait_ms: float = 5.0  # measured on CPU: 16 clients 216 -> 292 QPS, 64 clients 281 -> 320 QPS vs 0
    max_topk: int = 100
    # The limits are on bytes and work, set above the peers' largest default training traffic: Search-R1 sends
    # every searching sample of a step in one request (train_batch_size 512 x n_agent 5 = 2,560 queries, ~0.3 MB).
    max_request_mb: float = 32.0  # a /retrieve or /access body; 2,560 queries of 12,000 characters fit
    max_queries_in_flight: int = 32768  # queries (and /access URLs) being answered at once, over all requests
    # 2,560 queries x top-3 of wiki-18 is ~6 MB; top-10 of 2,560 ~21 MB.
    max_response_mb: float = 32.0
    timeout_request: float = 30.0  # seconds for the request headers, and again for the body

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 2**20)

    @property
    def is_bm25(self) -> bool:
        return self.retriever_name.lower() == "bm25"


def _existing(parser: argparse.ArgumentParser, flag: str, value: str | None, kind: str = "file") -> None:
    if value is None:
        parser.error(f"{flag} is required")
    path = Path(value)
    ok = path.is_dir() if kind == "directory" else path.is_file()
    if not ok:
        parser.error(f"{flag} {value}: no such {kind}")


def _check_torch_search(parser: argparse.ArgumentParser, args: argparse.Namespace, is_bm25: bool) -> None:
    """--torch_search searches a Flat index's vectors; the GPUs it names must be there (counted without torch)."""
    from local_dense_retriever.retrieval.gpus import parse_gpu_list, visible_gpu_count
    from local_dense_retriever.retrieval.index_files import read_header

    if is_bm25 or args.backend != "faiss" or args.faiss_gpu:
        parser.error("--torch_search replaces FAISS: accepted without --faiss_gpu, --backend qdrant and bm25")
    try:
        parse_gpu_list("--torch_search", args.torch_search, visible_gpu_count())
    except ValueError as err:
        parser.error(str(err))
    header = read_header(args.index_path)
    if header is None or not header.is_flat:
        parser.error(f"--torch_search needs a Flat index (its vectors); --index_path {args.index_path} is not one")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Search-R1 retrieval server with dynamic batching (FAISS / Qdrant / BM25).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = parser.add_argument_group("data (Search-R1 flags)")
    data.add_argument("--index_path", help="FAISS index file (a bm25s directory for --retriever_name bm25)")
    data.add_argument("--corpus_path", required=True, help="corpus .jsonl or .jsonl.gz; line i = index row i")
    data.add_argument(
        "--pages_path",
        help='pages .jsonl, one {"url", "contents", ...} per line (ASearcher\'s wiki_webpages.jsonl): POST /access',
    )
    data.add_argument("--topk", type=int, default=3, help="documents per query when a request gives no topk")
    data.add_argument("--retriever_name", default="e5", help="e5, bge, dpr, any name (mean pooling) or bm25")
    data.add_argument("--retriever_model", default="intfloat/e5-base-v2", help="Hugging Face model id or directory")
    data.add_argument("--faiss_gpu", action="store_true", help="clone the FAISS index to every visible GPU (fp16)")
    data.add_argument("--faiss_fp32", action="store_true", help="with --faiss_gpu: keep fp32 vectors on the GPUs")
    data.add_argument("--faiss_mmap", action="store_true", help="memory-map a Flat index instead of reading it")
    data.add_argument("--faiss_search_params", help='e.g. "nprobe=64" (IVF) or "efSearch=128" (HNSW)')
    data.add_argument(
        "--torch_search",
        metavar="DEVICES",
        help="exact inner-product search with torch over a Flat index's vectors, split over these devices: cpu, all "
        "(every visible GPU) or GPU ids such as 0,1,2,3 (instead of FAISS)",
    )
    data.add_argument(
        "--torch_search_dtype", choices=["fp16", "bf16", "fp32"], help="with --torch_search (default: fp16 on GPUs)"
    )
    data.add_argument(
        "--search_workspace_mb", type=float, help="with --torch_search: score workspace per device (1024 GPU, 256 CPU)"
    )
    data.add_argument("--backend", choices=["faiss", "qdrant"], default="faiss", help="vector store for dense search")
    data.add_argument("--qdrant_url", help="Qdrant server URL (with --backend qdrant)")
    data.add_argument("--qdrant_path", help="qdrant-client embedded storage directory (with --backend qdrant)")
    data.add_argument("--qdrant_collection", default="search_r1", help="Qdrant collection name")
    model = parser.add_argument_group("encoder")
    model.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda, cuda:1, ...")
    model.add_argument(
        "--dtype",
        choices=["auto", "measured", "fp32", "fp16", "bf16", "int8"],
        default="auto",
        help="auto: fp16 on GPU, fp32 on CPU (a query's answer does not depend on its batch-mates); measured: on "
        "CPU, bf16 or int8 where measured faster with the same top-3 rows, else fp32",
    )
    model.add_argument(
        "--precision_queries",
        help="questions (.txt/.json/.jsonl/.parquet) for that measurement (default: cut from corpus passages)",
    )
    model.add_argument("--pooling_method", choices=["auto", "mean", "cls", "pooler"], default="auto")
    model.add_argument("--max_length", type=int, default=256, help="query tokens kept by the encoder")
    model.add_argument("--num_threads", type=int, default=None, help="CPU threads for torch and FAISS (usable CPUs)")
    serving = parser.add_argument_group("serving")
    serving.add_argument("--host", default="127.0.0.1", help="bind address; 0.0.0.0 exposes the server")
    serving.add_argument("--port", type=int, default=8000)
    serving.add_argument("--max_batch_size", type=int, default=None, help="queries per forward pass (64 CPU/512 GPU)")
    serving.add_argument(
        "--max_batch_tokens",
        type=int,
        default=None,
        help="tokens per batch, as the encoder encodes its queries (default: 16 per query of --max_batch_size): a "
        "query sent beside long ones waits for one short batch",
    )
    serving.add_argument(
        "--max_wait_ms", type=float, default=5.0, help="wait for returning clients to refill a batch (0: never)"
    )
    limits = parser.add_argument_group("limits (on bytes and work; a request past one gets a 4xx naming it)")
    limits.add_argument(
        "--max_request_mb", type=float, default=32.0, help="a /retrieve or /access body; larger ones get a 413"
    )
    limits.add_argument(
        "--max_queries_in_flight",
        type=int,
        default=32768,
        help="queries and /access URLs being answered at once, over all requests: a request holding more gets a "
        "422, one arriving while the others hold the rest gets a 503 with Retry-After",
    )
    limits.add_argument("--max_topk", type=int, default=100, help="the largest topk a request may ask for (422)")
    limits.add_argument(
        "--max_response_mb", type=float, default=32.0, help="larger answers are refused with a 422 (ask fewer hits)"
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
    serving.add_argument(
        "--save-address-to",
        "--save_address_to",
        dest="save_address_to",
        help="a directory: once listening, write host:port to Host<ip>_IP<port>.txt there (ASearcher's scripts)",
    )
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
    if args.pages_path is not None:
        _existing(parser, "--pages_path", args.pages_path)
    if args.precision_queries is not None:
        _existing(parser, "--precision_queries", args.precision_queries)
    if args.torch_search is not None:
        _check_torch_search(parser, args, is_bm25)
    if args.save_address_to is not None:
        try:  # now, not once loaded: the file is written when the server listens
            Path(args.save_address_to).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--save-address-to {args.save_address_to}: cannot create the directory ({err.strerror})")
    for flag, value, low in [
        ("--max_topk", args.max_topk, 1),
        ("--max_queries_in_flight", args.max_queries_in_flight, 1),
        ("--max_length", args.max_length, 1),
        ("--max_batch_size", args.max_batch_size, 1),
        ("--max_batch_tokens", args.max_batch_tokens, 1),
        ("--num_threads", args.num_threads, 1),
        ("--max_wait_ms", args.max_wait_ms, 0),
        ("--max_connections", args.max_connections, 1),
        ("--search_workspace_mb", args.search_workspace_mb, 1),
    ]:
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    for flag, value in [
        ("--max_request_mb", args.max_request_mb),
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
        pages_path=args.pages_path,
        topk=args.topk,
        retriever_name=args.retriever_name,
        retriever_model=model,
        backend=args.backend,
        faiss_gpu=args.faiss_gpu,
        faiss_fp16=not args.faiss_fp32,
        faiss_mmap=args.faiss_mmap,
        faiss_search_params=args.faiss_search_params,
        torch_search=args.torch_search,
        torch_search_dtype=args.torch_search_dtype,
        search_workspace_mb=args.search_workspace_mb,
        precision_queries=args.precision_queries,
        qdrant_url=args.qdrant_url,
        qdrant_path=args.qdrant_path,
        qdrant_collection=args.qdrant_collection,
        device=args.device,
        dtype=args.dtype,
        pooling_method=args.pooling_method,
        max_length=args.max_length,
        num_threads=args.num_threads,
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        max_topk=args.max_topk,
        max_request_mb=args.max_request_mb,
        max_queries_in_flight=args.max_queries_in_flight,
        max_response_mb=args.max_response_mb,
        timeout_request=args.timeout_request,
    )
    return config, args
