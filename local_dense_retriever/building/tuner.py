"""The index tuner: from a built Flat index (or the builder's saved embeddings), build candidate layouts and measure
what each costs and keeps, then name the cheapest that keeps recall@3 at or above a threshold.

    python -m local_dense_retriever.tune_index --index_path e5_Flat.index --corpus_path wiki-18.jsonl \
        --retriever_name e5 --retriever_model intfloat/e5-base-v2 --queries nq_hotpotqa_train/train.parquet

For each candidate: recall@1/3/10 against the Flat answers on held-out queries (the questions of --queries encoded
by the index's own encoder; without it, the first words of passages drawn from the corpus), in-process search
queries/s, single-query latency and QPS at --clients in flight through the real server (a child process on
127.0.0.1), index bytes (RAM; GPU bytes for GPU layouts), the server's peak RSS, and build time. The passages are
never encoded again: the vectors stream from the memory-mapped Flat file, each layout is built, measured, written
for its server, and freed before the next. "Cheapest": among layouts at or above the threshold, those within 5% of
the best QPS (noise), then the fewest bytes.
"""

import argparse
import asyncio
import gc
import json
import logging
import re
import resource
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from local_dense_retriever.building.layouts import build_layout, set_search_params, write_index
from local_dense_retriever.retrieval.index_files import FlatVectors, read_header
from local_dense_retriever.retrieval.layouts import (
    Layout,
    default_nlist,
    default_pq,
    file_part,
    index_bytes,
    parse_layout,
)
from local_dense_retriever.retrieval.memory_plan import available_ram, gib

logger = logging.getLogger("local_dense_retriever.tuner")

RECALL_KS = (1, 3, 10)
QPS_TIE = 0.95  # layouts within 5% of the best QPS count as equally fast: the fewest bytes wins among them
SEARCH_BATCH = 64  # the server's CPU batch size


@dataclass
class TuneConfig:
    index_path: str
    corpus_path: str
    retriever_name: str = "e5"
    retriever_model: str = "intfloat/e5-base-v2"
    max_length: int = 256
    pooling_method: str = "auto"
    queries_path: str | None = None
    num_queries: int = 1000
    threshold: float = 0.99
    candidates: list[str] | None = None  # specs; "/" separates values to try: "HNSW32:efSearch=64/128/256"
    out_dir: str | None = None
    serve: str = "all"  # all | passing (only layouts at or above the threshold) | none
    clients: int = 256
    seconds: float = 10.0
    warmup: float = 3.0
    train_size: int = 200_000
    server_args: list[str] = field(default_factory=list)
    keep: bool = True  # keep the recommended layout's index file in out_dir
    progress: bool = True


@dataclass
class Row:
    layout: str
    recall: dict  # "1", "3", "10" -> recall@k against the Flat answers
    search_qps: float  # in-process, batches of 64, every CPU
    index_bytes: int
    build_seconds: float
    gpu_bytes: int = 0
    single_ms: float | None = None  # server, one client: p50
    qps: float | None = None  # server, --clients in flight
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int | None = None
    server_rss_mb: float | None = None
    note: str = ""

    @property
    def recall_at_3(self) -> float:
        return self.recall["3"]


@dataclass
class Report:
    rows: list[Row]
    recommended: str | None
    threshold: float
    queries: str
    corpus_size: int
    dim: int
    server_precision: str | None
    tuner_peak_rss_mb: float
    index_file: str | None  # the recommended layout, written with its search parameters
    seconds: float


# ---------------------------------------------------------------------------------------------- candidates


def default_candidates(size: int, dim: int) -> list[str]:
    """HNSW with full vectors and with 8-bit codes at two M and three efSearch; IVF with Flat, SQ8 and PQ codes
    at about 4 sqrt(size) lists and three nprobe."""
    nlist, pq = default_nlist(size), default_pq(dim)
    probes = "/".join(str(p) for p in sorted({max(1, nlist // 256), max(1, nlist // 64), max(1, nlist // 16)}))
    return [
        "HNSW16:efSearch=64/128/256",
        "HNSW32:efSearch=64/128/256",
        "HNSW32,SQ8:efSearch=128/256/512",
        f"IVF{nlist},Flat:nprobe={probes}",
        f"IVF{nlist},SQ8:nprobe={probes}",
        f"IVF{nlist},PQ{pq}:nprobe={probes}",
    ]


def expand(spec: str) -> list[Layout]:
    """`HNSW32:efConstruction=200,efSearch=64/128` -> HNSW32:efConstruction=200,efSearch=64 and ...=128: one family,
    built once and searched with each value (each checked by parse_layout)."""
    factory, _, params = spec.partition(":")
    fixed, varied = [], ("", [""])
    for param in filter(None, params.split(",")):
        name, _, values = param.partition("=")
        if "/" in values:
            if varied[0]:
                raise ValueError(f"--candidates {spec!r}: one parameter may list several values (a/b/c), not two")
            varied = (name, values.split("/"))
        else:
            fixed.append(param)
    name, values = varied
    return [parse_layout(f"{factory}:" + ",".join(fixed + ([f"{name}={value}"] if name else []))) for value in values]


# ---------------------------------------------------------------------------------------------- measuring


def recall_at(found: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Mean share of the exact top-k rows that the layout's top-k holds."""
    hits = [len(set(f[:k].tolist()) & set(e[:k].tolist())) for f, e in zip(found, exact, strict=True)]
    return float(np.mean(hits)) / k


def search_all(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Rows of every query in server-sized batches, and the queries/s that took."""
    index.search(queries[:SEARCH_BATCH], k)  # warm-up: first-call allocations and page faults
    started = time.perf_counter()
    batches = range(0, len(queries), SEARCH_BATCH)
    rows = np.concatenate([index.search(queries[i : i + SEARCH_BATCH], k)[1] for i in batches])
    return rows, len(queries) / (time.perf_counter() - started)


class PeakRss:
    """Peak RSS of a process (and its children), polled every 0.2 s in a thread."""

    def __init__(self, pid: int):
        import psutil

        self.process, self.peak = psutil.Process(pid), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except Exception:
                return
            self._stop.wait(0.2)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


async def closed_loop(url: str, questions: list[str], clients: int, warmup: float, seconds: float) -> dict:
    """`clients` closed-loop single-query clients: warm-up, then a measured window; QPS, p50/p99, errors."""
    import aiohttp

    latencies: list[float] = []
    state = {"measuring": False, "stop": False, "errors": 0, "next": 0}

    async def client(session: aiohttp.ClientSession) -> None:
        while not state["stop"]:
            question = questions[state["next"] % len(questions)]
            state["next"] += 1
            started = time.perf_counter()
            try:
                async with session.post(f"{url}/retrieve", json={"queries": [question], "topk": 3}) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            if state["measuring"] and not state["stop"]:
                if ok:
                    latencies.append(time.perf_counter() - started)
                else:
                    state["errors"] += 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(clients)]
        await asyncio.sleep(warmup)
        state["measuring"], began = True, time.perf_counter()
        await asyncio.sleep(seconds)
        state["stop"], window = True, time.perf_counter() - began
        await asyncio.gather(*tasks, return_exceptions=True)
    ms = np.array(latencies or [np.nan]) * 1000
    return {
        "qps": len(latencies) / window,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "errors": state["errors"],
    }


def measure_server(config: TuneConfig, flags: list[str], questions: list[str], log_path: Path) -> dict:
    """The real server on `flags`: p50 of one client, then QPS and p50/p99 at config.clients; its peak RSS."""
    from local_dense_retriever.serving.launcher import ServerProcess

    base = [
        "--corpus_path", config.corpus_path, "--retriever_name", config.retriever_name,
        "--retriever_model", config.retriever_model, "--max_length", str(config.max_length),
        "--pooling_method", config.pooling_method, *config.server_args,
    ]  # fmt: skip
    server = ServerProcess(base + flags, log_path=log_path, startup_timeout=3600)
    server.start()
    rss = PeakRss(server.process.pid)
    try:
        import httpx

        description = httpx.get(f"{server.url}/health", timeout=30).json().get("retriever", "")
        single = asyncio.run(closed_loop(server.url, questions, 1, 1.0, max(2.0, config.seconds / 3)))
        loaded = asyncio.run(closed_loop(server.url, questions, config.clients, config.warmup, config.seconds))
    finally:
        server.stop()
        peak = rss.stop()
    precision = re.search(r"encoder on \S+ \((\w+)\)", description)
    return {
        "single_ms": single["p50_ms"],
        **{key: loaded[key] for key in ("qps", "p50_ms", "p99_ms", "errors")},
        "server_rss_mb": peak,
        "precision": precision[1] if precision else None,
    }


# ---------------------------------------------------------------------------------------------- choosing


def recommend(rows: list[Row], threshold: float) -> Row | None:
    """Among CPU rows at or above the threshold (exact Flat aside; GPU rows are shown beside, not chosen: GPU
    memory and RAM are not the same cost): those within 5% of the best QPS (server QPS when measured for all of
    them, else in-process search queries/s), then the fewest bytes, then the fastest."""
    passing = [row for row in rows if row.layout != "Flat" and not row.gpu_bytes and row.recall_at_3 >= threshold]
    if not passing:
        return None
    served = all(row.qps is not None for row in passing)

    def speed(row: Row) -> float:
        return row.qps if served else row.search_qps

    best = max(speed(row) for row in passing)
    near = [row for row in passing if speed(row) >= QPS_TIE * best]
    return min(near, key=lambda row: (row.index_bytes + row.gpu_bytes, -speed(row)))


# ---------------------------------------------------------------------------------------------- the run


def load_queries(config: TuneConfig) -> tuple[list[str], str]:
    from local_dense_retriever.retrieval.corpus import Corpus
    from local_dense_retriever.retrieval.questions import corpus_queries, read_questions

    if config.queries_path:
        questions = read_questions(config.queries_path, limit=config.num_queries)
        return questions, f"{len(questions)} questions of {config.queries_path}"
    corpus = Corpus(config.corpus_path)
    try:
        questions = corpus_queries(corpus, config.num_queries)
    finally:
        corpus.close()
    what = f"the first 12 words of {len(questions)} passages drawn from the corpus (no --queries file given)"
    return questions, what


def encode_queries(config: TuneConfig, questions: list[str], dim: int) -> np.ndarray:
    from local_dense_retriever.retrieval.encoders import TextEncoder

    encoder = TextEncoder(
        config.retriever_model,
        retriever_name=config.retriever_name,
        pooling=config.pooling_method,
        max_length=config.max_length,
    )
    if encoder.dim != dim:
        raise ValueError(
            f"--index_path {config.index_path} holds {dim}-d vectors but --retriever_model produces {encoder.dim}-d "
            "ones: accepted is the encoder the index was built with"
        )
    parts = []
    with tqdm(total=len(questions), unit="q", desc="encode queries", disable=not config.progress) as bar:
        for start in range(0, len(questions), 256):
            parts.append(encoder.encode_queries(questions[start : start + 256]))
            bar.update(len(parts[-1]))
    return np.concatenate(parts)


def check_candidates_fit(families: list[list[Layout]], size: int, dim: int, explicit: bool) -> list[list[Layout]]:
    """Drop (defaults) or refuse (the user's) candidates whose index cannot be held in the RAM available now."""
    available = available_ram()
    kept = []
    for family in families:
        needed = index_bytes(family[0].factory, size, dim) or 0
        if needed <= 0.9 * available:
            kept.append(family)
            continue
        message = f"layout {family[0].factory} needs {gib(needed)} of RAM to build and {gib(available)} is available"
        if explicit:
            raise ValueError(f"--candidates: {message}; accepted: layouts that fit (SQ8 or PQ codes, IVF)")
        print(f"skipping {message}", file=sys.stderr)
    return kept


def tune(config: TuneConfig) -> Report:
    started = time.perf_counter()
    vectors = FlatVectors(config.index_path)
    out_dir = Path(config.out_dir or Path(config.index_path).parent / "tuning")
    out_dir.mkdir(parents=True, exist_ok=True)
    explicit = config.candidates is not None
    families = [expand(spec) for spec in (config.candidates or default_candidates(vectors.size, vectors.dim))]
    gpu_layouts = [family[0] for family in families if family[0].on_gpu]
    for layout in gpu_layouts:
        if not layout.factory.startswith("torch-"):
            raise ValueError(f"--candidates {layout}: accepted GPU candidates are torch-fp16, torch-bf16, torch-fp32 "
                             "(FAISS GPU's memory: python -m local_dense_retriever.memory_plan)")  # fmt: skip
    if gpu_layouts:
        from local_dense_retriever.retrieval.torch_search import parse_devices

        parse_devices("all", flag="--candidates torch-*")  # refuses at once where no GPU is visible
    families = [family for family in families if not family[0].on_gpu]
    families = check_candidates_fit(families, vectors.size, vectors.dim, explicit)

    questions, what = load_queries(config)
    queries = encode_queries(config, questions, vectors.dim)
    k = min(max(RECALL_KS), vectors.size)
    exact_started = time.perf_counter()
    _, exact = streamed_topk_rows(queries, vectors, k, config.progress)
    exact_qps = len(queries) / (time.perf_counter() - exact_started)

    rows: list[Row] = []
    precision_flags: list[str] = []
    server_precision = None
    is_npy = config.index_path.endswith(".npy")
    flat_qps = exact_qps if is_npy else flat_search_qps(config.index_path, queries)
    flat_row = Row("Flat", {str(r): 1.0 for r in RECALL_KS}, flat_qps, vectors.size * vectors.dim * 4, 0.0)
    if is_npy:
        flat_row.note = "saved embeddings: search q/s is the exact pass's; not served (no Flat index file)"
    if config.serve != "none" and not is_npy:
        flat = measure_server(config, ["--index_path", config.index_path, "--faiss_mmap"], questions,
                              out_dir / "server_Flat.log")  # fmt: skip
        server_precision = flat.pop("precision")
        _fill(flat_row, flat)
        # Every layout is served with the precision the server chose for Flat, so only the layout differs.
        precision_flags = ["--dtype", server_precision] if server_precision else []
    rows.append(flat_row)
    for layout in gpu_layouts:
        rows.append(measure_gpu_layout(config, layout, vectors, queries, exact, questions, out_dir, precision_flags))
    quantizers: dict = {}
    kept_file: Path | None = None
    total = sum(len(family) for family in families)
    overall = tqdm(total=total, unit="layout", desc="layouts measured", disable=not config.progress, position=1)
    for family in families:
        built = build_layout(vectors, family[0], config.train_size, quantizers, config.progress)
        family_rows = []
        for layout in family:
            set_search_params(built.index, layout.params)
            found, qps = search_all(built.index, queries, k)
            recall = {str(r): recall_at(found, exact, min(r, k)) for r in RECALL_KS}
            family_rows.append(Row(layout.spec, recall, qps, 0, built.seconds))
        path = out_dir / f"{Path(config.index_path).stem}__{file_part(family[0].built_as)}.index"
        size = write_index(built.index, path)
        del built
        gc.collect()  # the server loads its own copy: free this one first
        for layout, row in zip(family, family_rows, strict=True):
            row.index_bytes = size
            serve = config.serve == "all" or (config.serve == "passing" and row.recall_at_3 >= config.threshold)
            if serve:
                flags = ["--index_path", str(path), *precision_flags]
                flags += ["--faiss_search_params", layout.params] if layout.params else []
                log = out_dir / f"server_{file_part(layout.spec)}.log"
                _fill(row, measure_server(config, flags, questions, log))
            rows.append(row)
            overall.update(1)
            logger.info("%s: recall@3 %.4f, %s", row.layout, row.recall_at_3, row.qps)
        best = recommend(rows, config.threshold)
        if best is not None and parse_layout(best.layout).built_as == family[0].built_as:
            if kept_file is not None and kept_file != path:
                kept_file.unlink(missing_ok=True)
            kept_file = path
        elif path != kept_file:
            path.unlink(missing_ok=True)
    overall.close()
    best = recommend(rows, config.threshold)
    index_file = None
    if best is not None and kept_file is not None and config.keep:
        import faiss

        index = faiss.read_index(str(kept_file))
        set_search_params(index, parse_layout(best.layout).params)  # the file carries them; the server keeps them
        name = Path(config.index_path).stem.split("_Flat")[0]
        final = out_dir / f"{name}_{file_part(parse_layout(best.layout).built_as)}.index"
        write_index(index, final)
        if final != kept_file:
            kept_file.unlink(missing_ok=True)
        index_file = str(final)
    elif kept_file is not None:
        kept_file.unlink(missing_ok=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Report(rows, best.layout if best else None, config.threshold, what, vectors.size, vectors.dim,
                  server_precision, peak, index_file, time.perf_counter() - started)  # fmt: skip


def measure_gpu_layout(
    config: TuneConfig,
    layout: Layout,
    vectors: FlatVectors,
    queries: np.ndarray,
    exact: np.ndarray,
    questions: list[str],
    out_dir: Path,
    precision_flags: list[str],
) -> Row:
    """Exact torch search over every visible GPU (`--torch_search all`): recall (1 but for fp16 rounding of
    near-ties), in-process queries/s, the largest shard's GPU bytes, and the server's figures."""
    from local_dense_retriever.retrieval.torch_search import TorchExactIndex, parse_devices

    dtype = layout.factory.split("-", 1)[1]
    started = time.perf_counter()
    index = TorchExactIndex(vectors, parse_devices("all"), dtype=dtype, progress=config.progress)
    seconds = time.perf_counter() - started
    k = exact.shape[1]
    found, qps = search_all(TorchAsFaiss(index), queries, k)
    row = Row(layout.spec, {str(r): recall_at(found, exact, min(r, k)) for r in RECALL_KS}, qps, 0, seconds,
              gpu_bytes=max(index.shard_bytes()))  # fmt: skip
    del index
    gc.collect()
    if config.serve == "all" or (config.serve == "passing" and row.recall_at_3 >= config.threshold):
        flags = ["--index_path", config.index_path, "--torch_search", "all", "--torch_search_dtype", dtype]
        _fill(row, measure_server(config, flags + precision_flags, questions, out_dir / f"server_{layout}.log"))
    return row


class TorchAsFaiss:
    """search(queries, k) -> (scores, rows), as a FAISS index answers, for search_all."""

    def __init__(self, index):
        self.index = index

    def search(self, queries: np.ndarray, k: int):
        return self.index.search_vectors(queries, k)


def streamed_topk_rows(queries: np.ndarray, vectors: FlatVectors, k: int, progress: bool):
    from local_dense_retriever.retrieval.torch_search import streamed_topk

    return streamed_topk(queries, vectors, k, progress=progress)


def flat_search_qps(index_path: str, queries: np.ndarray) -> float:
    """In-process queries/s of the Flat index itself (memory-mapped, as the tuner reads it), on a few batches."""
    import faiss

    from local_dense_retriever.retrieval.backends import FAISS_BLAS_THRESHOLD

    faiss.cvar.distance_compute_blas_threshold = FAISS_BLAS_THRESHOLD
    index = faiss.read_index(index_path, faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
    index.search(queries[:SEARCH_BATCH], 3)  # pages the vectors in
    return search_all(index, queries[: 4 * SEARCH_BATCH], 10)[1]


def _fill(row: Row, measured: dict) -> None:
    for key, value in measured.items():
        if hasattr(row, key) and key != "precision":
            setattr(row, key, value)


# ---------------------------------------------------------------------------------------------- output


def render_markdown(report: Report, command: str) -> str:
    lines = [
        f"# Index tuning: {report.corpus_size:,} vectors x {report.dim}",
        "",
        f"`{command}`",
        "",
        f"Queries: {report.queries}. Recall@k: share of the Flat (exact) top-k rows the layout returns. "
        "Search q/s: in-process, batches of 64, every CPU. Server: the real server on 127.0.0.1, p50 of one client, "
        f"QPS and p50/p99 at the clients in flight; encoder precision {report.server_precision or 'not served'}.",
        "",
        "| layout | recall@1 | recall@3 | recall@10 | search q/s | single-query ms | QPS | p50 / p99 ms | errors "
        "| index MiB | server peak RSS MiB | build s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def number(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for row in report.rows:
        mark = " **(recommended)**" if row.layout == report.recommended else ""
        p50_p99 = "-" if row.p50_ms is None else f"{row.p50_ms:.0f} / {row.p99_ms:.0f}"
        rss = "-" if row.server_rss_mb is None else f"{row.server_rss_mb:.0f}"
        lines.append(
            f"| {row.layout}{mark} | {row.recall['1']:.4f} | {row.recall['3']:.4f} | {row.recall['10']:.4f} "
            f"| {row.search_qps:.0f} | {number(row.single_ms, '.1f')} | {number(row.qps, '.1f')} | {p50_p99} "
            f"| {number(row.errors, 'd')} | {row.index_bytes / 2**20:.1f} | {rss} | {row.build_seconds:.1f} |"
        )
    lines += ["", recommendation_text(report), "", f"Tuner peak RSS {report.tuner_peak_rss_mb / 1024:.2f} GiB; "
              f"{report.seconds:.0f} s in all."]  # fmt: skip
    return "\n".join(lines) + "\n"


def recommendation_text(report: Report) -> str:
    if report.recommended is None:
        return (f"No approximate layout kept recall@3 >= {report.threshold}: keep Flat (or --torch_search on GPUs), "
                "or try larger efSearch / nprobe (--candidates).")  # fmt: skip
    layout = parse_layout(report.recommended)
    serve = f"--index_path {report.index_file}" if report.index_file else f"--index_path <the {layout.factory} index>"
    params = f" --faiss_search_params {layout.params}" if layout.params else ""
    return (
        f"Recommended: **{report.recommended}** (recall@3 >= {report.threshold}, the fewest bytes among the "
        f"fastest). Serve it: `retrieval_server.py {serve}{params} ...`; build it again from the Flat index: "
        f"`python -m local_dense_retriever.index_builder --corpus_path <corpus> --from_index <Flat index> "
        f"--faiss_type {layout.factory}{' --faiss_search_params ' + layout.params if layout.params else ''}"
        f"{f' --hnsw_ef_construction {layout.ef_construction}' if layout.ef_construction else ''} --index_path <out>`."
    )


def write_report(report: Report, out_dir: Path, command: str) -> tuple[Path, Path]:
    markdown, data = out_dir / "tuning.md", out_dir / "tuning.json"
    markdown.write_text(render_markdown(report, command))
    data.write_text(json.dumps({**asdict(report), "command": command}, indent=1))
    return markdown, data


# ---------------------------------------------------------------------------------------------- command line


def threshold_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: accepted is a recall in (0, 1], e.g. 0.99")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Measure candidate index layouts against a Flat index and name the cheapest that keeps recall.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--index_path", required=True, help="the Flat index (or the builder's saved .npy embeddings)")
    parser.add_argument("--corpus_path", required=True, help="its corpus .jsonl (the server needs it)")
    parser.add_argument("--retriever_name", default="e5")
    parser.add_argument("--retriever_model", default="intfloat/e5-base-v2", help="the encoder of the index")
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--pooling_method", choices=["auto", "mean", "cls", "pooler"], default="auto")
    parser.add_argument(
        "--queries", help="training or test questions as held-out queries (.parquet/.jsonl/.json/.txt)"
    )
    parser.add_argument("--num_queries", type=int, default=1000, help="queries drawn from that file (or the corpus)")
    parser.add_argument("--threshold", type=threshold_value, default=0.99, help="recall@3 to keep, in (0, 1]")
    parser.add_argument(
        "--candidates",
        nargs="+",
        help='layouts to try, "/" between values: HNSW32:efSearch=64/128 "IVF4096,SQ8:nprobe=32/64" (default: '
        "HNSW16/32 and HNSW32,SQ8 at three efSearch; IVF Flat, SQ8, PQ at three nprobe)",
    )
    parser.add_argument("--out_dir", help="for tuning.md, tuning.json and the recommended index (default: beside it)")
    parser.add_argument(
        "--serve",
        choices=["all", "passing", "none"],
        default="all",
        help="measure through the real server: every layout, only those at the threshold, or none",
    )
    parser.add_argument("--clients", type=int, default=256, help="closed-loop clients in flight for the QPS figure")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per layout at --clients")
    parser.add_argument("--train_size", type=int, default=200_000, help="vectors IVF/PQ/SQ train on (>= 64 per list)")
    parser.add_argument("--no_keep", action="store_true", help="do not keep the recommended layout's index file")
    parser.add_argument("--no_progress", action="store_true")
    parser.add_argument(
        "--server_args", default="", help="more flags for the measured servers, e.g. '--num_threads 8'"
    )
    return parser


def parse_config(argv: list[str] | None = None) -> TuneConfig:
    import shlex

    from local_dense_retriever.retrieval.model_source import check_model_source

    parser = build_parser()
    args = parser.parse_args(argv)
    header = read_header(args.index_path) if Path(args.index_path).is_file() else None
    if not Path(args.index_path).is_file():
        parser.error(f"--index_path {args.index_path}: no such file")
    if not args.index_path.endswith(".npy") and (header is None or not header.is_flat):
        parser.error(f"--index_path {args.index_path}: accepted is a Flat FAISS index or a .npy of embeddings")
    if not Path(args.corpus_path).is_file():
        parser.error(f"--corpus_path {args.corpus_path}: no such file")
    if args.queries and not Path(args.queries).is_file():
        parser.error(f"--queries {args.queries}: no such file")
    for flag in ("num_queries", "clients", "max_length", "train_size"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if not args.seconds > 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    for spec in args.candidates or []:
        try:
            expand(spec)
        except ValueError as err:
            parser.error(f"--candidates {err}")
    try:
        model = check_model_source(args.retriever_model)
    except ValueError as err:
        parser.error(f"--retriever_model {err}")
    return TuneConfig(
        index_path=args.index_path,
        corpus_path=args.corpus_path,
        retriever_name=args.retriever_name,
        retriever_model=model,
        max_length=args.max_length,
        pooling_method=args.pooling_method,
        queries_path=args.queries,
        num_queries=args.num_queries,
        threshold=args.threshold,
        candidates=args.candidates,
        out_dir=args.out_dir,
        serve=args.serve,
        clients=args.clients,
        seconds=args.seconds,
        train_size=args.train_size,
        server_args=shlex.split(args.server_args),
        keep=not args.no_keep,
        progress=not args.no_progress,
    )


def main(argv: list[str] | None = None) -> int:
    import shlex

    from local_dense_retriever.retrieval import cpu_threads

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_config(argv)
    import faiss  # noqa: F401  (loaded now, so that both pools are sized)
    import torch  # noqa: F401

    cpu_threads.configure_pools(cpu_threads.thread_count())
    command = "python -m local_dense_retriever.tune_index " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    try:
        report = tune(config)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    out_dir = Path(config.out_dir or Path(config.index_path).parent / "tuning")
    markdown, data = write_report(report, out_dir, command)
    print(render_markdown(report, command))
    print(f"wrote {markdown} and {data}")
    return 0
