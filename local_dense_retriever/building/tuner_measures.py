"""What the index tuner measures of one layout: recall@k against the exact answers, in-process search queries/s in
the server's batch size, and the real server on the layout's flags (single-client p50, QPS and p50/p99 at many
clients, its peak RSS, the encoder precision it chose)."""

import asyncio
import time
from pathlib import Path

import numpy as np

from local_dense_retriever.serving.launcher import ServerProcess
from local_dense_retriever.serving.server_load import PeakRss, closed_loop, encoder_precision

RECALL_KS = (1, 3, 10)
SEARCH_BATCH = 64  # the server's CPU batch size


def recall_at(found: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Mean share of the exact top-k rows that the layout's top-k holds."""
    hits = [len(set(f[:k].tolist()) & set(e[:k].tolist())) for f, e in zip(found, exact, strict=True)]
    return float(np.mean(hits)) / k


def recalls(found: np.ndarray, exact: np.ndarray) -> dict[str, float]:
    """recall@k for each k of RECALL_KS, keyed "1", "3", "10" (k capped at the rows searched)."""
    k = exact.shape[1]
    return {str(r): recall_at(found, exact, min(r, k)) for r in RECALL_KS}


def search_all(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Rows of every query in server-sized batches, and the queries/s that took. `index` answers search(queries, k)
    with (scores, rows), as a FAISS index does."""
    index.search(queries[:SEARCH_BATCH], k)  # warm-up: first-call allocations and page faults
    started = time.perf_counter()
    batches = range(0, len(queries), SEARCH_BATCH)
    rows = np.concatenate([index.search(queries[i : i + SEARCH_BATCH], k)[1] for i in batches])
    return rows, len(queries) / (time.perf_counter() - started)


class TorchAsFaiss:
    """search(queries, k) -> (scores, rows), as a FAISS index answers, for search_all."""

    def __init__(self, index):
        self.index = index

    def search(self, queries: np.ndarray, k: int):
        return self.index.search_vectors(queries, k)


def flat_search_qps(index_path: str, queries: np.ndarray) -> float:
    """In-process queries/s of the Flat index itself (memory-mapped, as the tuner reads it), on a few batches."""
    import faiss

    from local_dense_retriever.retrieval.backends import FAISS_BLAS_THRESHOLD

    faiss.cvar.distance_compute_blas_threshold = FAISS_BLAS_THRESHOLD
    index = faiss.read_index(index_path, faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
    index.search(queries[:SEARCH_BATCH], 3)  # pages the vectors in
    return search_all(index, queries[: 4 * SEARCH_BATCH], 10)[1]


def measure_server(flags: list[str], questions: list[str], log_path: Path, clients: int, warmup: float,
                   seconds: float) -> dict:  # fmt: skip
    """The real server on `flags`: p50 of one client, then QPS and p50/p99 at `clients`; its peak RSS (MiB) and
    the encoder precision its /health reports."""
    server = ServerProcess(flags, log_path=log_path, startup_timeout=3600)
    server.start()
    rss = PeakRss(server.process.pid)
    try:
        precision = encoder_precision(server.url)
        single = asyncio.run(closed_loop(server.url, questions, 1, 1.0, max(2.0, seconds / 3)))
        loaded = asyncio.run(closed_loop(server.url, questions, clients, warmup, seconds))
    finally:
        server.stop()
        peak = rss.stop()
    return {
        "single_ms": single.p50_ms,
        "qps": loaded.qps,
        "p50_ms": loaded.p50_ms,
        "p99_ms": loaded.p99_ms,
        "errors": loaded.errors,
        "server_rss_mb": peak,
        "precision": precision,
    }
