"""The index tuner: from a built Flat index (or the builder's saved embeddings), build candidate layouts and measure
what each costs and keeps, then name the cheapest that keeps recall@3 at or above a threshold (Flat itself when no
layout beats it).

    python -m local_dense_retriever.tune_index --index_path e5_Flat.index --corpus_path wiki-18.jsonl \
        --retriever_name e5 --retriever_model intfloat/e5-base-v2 --queries nq_hotpotqa_train/train.parquet

For each candidate: recall@1/3/10 against the Flat answers on held-out queries (the questions of --queries encoded
by the index's own encoder; without it, the first words of passages drawn from the corpus), in-process search
queries/s, single-query latency and QPS at --clients in flight through the real server (a child process on
127.0.0.1), index bytes (RAM; GPU bytes for GPU layouts), the server's peak RSS, and build time. The passages are
never encoded again: the vectors stream from the memory-mapped Flat file, each layout is built, measured, written
for its server, and freed before the next. "Cheapest": among layouts at or above the threshold, exact Flat included,
those within 5% of the best QPS (noise), then the fewest bytes.

This module runs the tuning; tuner_candidates.py says what is tried, tuner_measures.py how each layout is measured,
tuner_report.py what is chosen and written, tuner_cli.py the command line.
"""

import gc
import logging
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from local_dense_retriever.building.layouts import build_layout, set_search_params, write_index
from local_dense_retriever.building.tuner_candidates import check_candidates_fit, default_candidates, expand
from local_dense_retriever.building.tuner_measures import (
    RECALL_KS,
    TorchAsFaiss,
    flat_search_qps,
    measure_server,
    recalls,
    search_all,
)
from local_dense_retriever.building.tuner_report import Report, Row, recommend
from local_dense_retriever.retrieval.index_files import FlatVectors
from local_dense_retriever.retrieval.layouts import Layout, file_part, parse_layout

logger = logging.getLogger("local_dense_retriever.tuner")


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

    @property
    def output_dir(self) -> Path:
        """--out_dir, or `tuning` beside the index."""
        return Path(self.out_dir or Path(self.index_path).parent / "tuning")


def tune(config: TuneConfig) -> Report:
    started = time.perf_counter()
    vectors = FlatVectors(config.index_path)
    out_dir = config.output_dir
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
    exact_started = time.perf_counter()
    exact = exact_rows(queries, vectors, config.progress)
    exact_qps = len(queries) / (time.perf_counter() - exact_started)

    is_npy = config.index_path.endswith(".npy")
    flat_qps = exact_qps if is_npy else flat_search_qps(config.index_path, queries)
    flat_row = Row("Flat", {str(r): 1.0 for r in RECALL_KS}, flat_qps, vectors.size * vectors.dim * 4, 0.0)
    if is_npy:
        flat_row.note = "saved embeddings: search q/s is the exact pass's; not served (no Flat index file)"
    precision_flags: list[str] = []
    server_precision = None
    if config.serve != "none" and not is_npy:
        flags = ["--index_path", config.index_path, "--faiss_mmap"]
        flat = served(config, flags, questions, out_dir / "server_Flat.log")
        server_precision = flat.pop("precision")
        flat_row.fill(flat)
        # Every layout is served with the precision the server chose for Flat, so only the layout differs.
        precision_flags = ["--dtype", server_precision] if server_precision else []
    rows: list[Row] = [flat_row]
    for layout in gpu_layouts:
        rows.append(measure_gpu_layout(config, layout, vectors, queries, exact, questions, precision_flags))
    kept_file = measure_cpu_families(config, families, vectors, queries, exact, questions, precision_flags, rows)
    best = recommend(rows, config.threshold, flat_comparable=not is_npy)
    index_file = None
    if best is not None and best.layout == "Flat":
        index_file = config.index_path  # the index given is the one to serve
    if best is not None and best.layout != "Flat" and kept_file is not None and config.keep:
        index_file = str(keep_recommended(config, parse_layout(best.layout), kept_file))
    elif kept_file is not None:
        kept_file.unlink(missing_ok=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Report(rows, best.layout if best else None, config.threshold, what, vectors.size, vectors.dim,
                  server_precision, peak, index_file, time.perf_counter() - started)  # fmt: skip


def measure_cpu_families(config: TuneConfig, families: list[list[Layout]], vectors: FlatVectors, queries: np.ndarray,
                         exact: np.ndarray, questions: list[str], precision_flags: list[str],
                         rows: list[Row]) -> Path | None:  # fmt: skip
    """Each family built once, searched with each of its parameter values, written for its server and freed; rows
    appended to `rows`. Returns the file of the family the recommendation belongs to so far (the others deleted)."""
    quantizers: dict = {}
    kept_file: Path | None = None
    out_dir, k = config.output_dir, exact.shape[1]
    flat_comparable = not config.index_path.endswith(".npy")
    overall = tqdm(total=sum(len(family) for family in families), unit="layout", desc="layouts measured",
                   disable=not config.progress, position=1)  # fmt: skip
    for family in families:
        built = build_layout(vectors, family[0], config.train_size, quantizers, config.progress)
        family_rows = []
        for layout in family:
            set_search_params(built.index, layout.params)
            found, qps = search_all(built.index, queries, k)
            family_rows.append(Row(layout.spec, recalls(found, exact), qps, 0, built.seconds))
        path = out_dir / f"{Path(config.index_path).stem}__{file_part(family[0].built_as)}.index"
        size = write_index(built.index, path)
        del built
        gc.collect()  # the server loads its own copy: free this one first
        for layout, row in zip(family, family_rows, strict=True):
            row.index_bytes = size
            if serves(config, row):
                flags = ["--index_path", str(path), *precision_flags]
                flags += ["--faiss_search_params", layout.params] if layout.params else []
                row.fill(served(config, flags, questions, out_dir / f"server_{file_part(layout.spec)}.log"))
            rows.append(row)
            overall.update(1)
            served_text = "not served" if row.qps is None else f"server {row.qps:.1f} QPS at {config.clients} clients"
            logger.info("%s: recall@3 %.4f, search %.0f q/s, %s", row.layout, row.recall_at_3, row.search_qps,
                        served_text)  # fmt: skip
        best = recommend(rows, config.threshold, flat_comparable)
        if best is not None and parse_layout(best.layout).built_as == family[0].built_as:
            if kept_file is not None and kept_file != path:
                kept_file.unlink(missing_ok=True)
            kept_file = path
        elif path != kept_file:
            path.unlink(missing_ok=True)
    overall.close()
    return kept_file


def keep_recommended(config: TuneConfig, layout: Layout, kept_file: Path) -> Path:
    """The recommended layout's file, with its search parameters written in (the server keeps them), named as the
    builder names it: <name>_<layout>.index in the output folder."""
    import faiss

    index = faiss.read_index(str(kept_file))
    set_search_params(index, layout.params)
    name = Path(config.index_path).stem.split("_Flat")[0]
    final = config.output_dir / f"{name}_{file_part(layout.built_as)}.index"
    write_index(index, final)
    if final != kept_file:
        kept_file.unlink(missing_ok=True)
    return final


def measure_gpu_layout(config: TuneConfig, layout: Layout, vectors: FlatVectors, queries: np.ndarray,
                       exact: np.ndarray, questions: list[str], precision_flags: list[str]) -> Row:  # fmt: skip
    """Exact torch search over every visible GPU (`--torch_search all`): recall (1 but for fp16 rounding of
    near-ties), in-process queries/s, the largest shard's GPU bytes, and the server's figures."""
    from local_dense_retriever.retrieval.torch_search import TorchExactIndex, parse_devices

    dtype = layout.factory.split("-", 1)[1]
    started = time.perf_counter()
    index = TorchExactIndex(vectors, parse_devices("all"), dtype=dtype, progress=config.progress)
    seconds = time.perf_counter() - started
    found, qps = search_all(TorchAsFaiss(index), queries, exact.shape[1])
    row = Row(layout.spec, recalls(found, exact), qps, 0, seconds, gpu_bytes=max(index.shard_bytes()))
    del index
    gc.collect()
    if serves(config, row):
        flags = ["--index_path", config.index_path, "--torch_search", "all", "--torch_search_dtype", dtype]
        row.fill(served(config, flags + precision_flags, questions, config.output_dir / f"server_{layout}.log"))
    return row


def serves(config: TuneConfig, row: Row) -> bool:
    """Whether --serve measures this layout through the real server."""
    return config.serve == "all" or (config.serve == "passing" and row.recall_at_3 >= config.threshold)


def served(config: TuneConfig, flags: list[str], questions: list[str], log_path: Path) -> dict:
    """The real server on the tuner's encoder flags, --server_args and the layout's `flags`, measured."""
    encoder = [
        "--corpus_path", config.corpus_path, "--retriever_name", config.retriever_name,
        "--retriever_model", config.retriever_model, "--max_length", str(config.max_length),
        "--pooling_method", config.pooling_method,
    ]  # fmt: skip
    return measure_server([*encoder, *config.server_args, *flags], questions, log_path, config.clients,
                          config.warmup, config.seconds)  # fmt: skip


def exact_rows(queries: np.ndarray, vectors: FlatVectors, progress: bool) -> np.ndarray:
    """The exact top-k rows of every query (k: the largest recall@k, at most the corpus), streamed over the file."""
    from local_dense_retriever.retrieval.torch_search import streamed_topk

    return streamed_topk(queries, vectors, min(max(RECALL_KS), vectors.size), progress=progress)[1]


def load_queries(config: TuneConfig) -> tuple[list[str], str]:
    """The held-out questions and a line saying what they are."""
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
