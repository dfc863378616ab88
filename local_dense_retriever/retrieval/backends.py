"""Searchers: queries in, (scores, corpus rows) out. FAISS and Qdrant behind a dense encoder, or BM25.

Every searcher returns float32 scores and int64 rows of shape (len(queries), k); a row of -1 means "no hit"
(FAISS pads that way when an index has fewer than k candidates, and the others follow it).
"""

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # only for annotations: importing encoders loads torch, which BM25 never needs
    from local_dense_retriever.retrieval.encoders import TextEncoder

# Below this many queries FAISS's scalar Flat scan beats BLAS; at or above it one sgemm wins by 5-10x. faiss-cpu
# 1.15 ships 128000 (no BLAS for any realistic batch). Measured here: crossover at 2-4 queries for 100k-1M vectors.
FAISS_BLAS_THRESHOLD = 4
BM25_SETTINGS_FILE = "search_r1_bm25.json"


class Searcher(Protocol):
    size: int  # number of searchable documents (must equal the corpus size)
    description: str

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


class VectorIndex(Protocol):
    size: int
    dim: int
    description: str

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...


def faiss_gpu_count() -> int:
    """GPUs this faiss can use; an error that says what is missing when there are none (for --faiss_gpu)."""
    import faiss

    num_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if num_gpus == 0:
        raise ValueError("--faiss_gpu needs the faiss-gpu package and a visible GPU; this faiss sees none")
    return num_gpus


class FaissIndex:
    """A FAISS index file (any factory type), on CPU or cloned to every visible GPU (fp16, sharded)."""

    def __init__(
        self,
        index_path: str | os.PathLike,
        use_gpu: bool = False,
        gpu_fp16: bool = True,
        search_params: str | None = None,
        mmap: bool = False,
    ):
        import faiss

        faiss.cvar.distance_compute_blas_threshold = FAISS_BLAS_THRESHOLD
        # Memory-mapping the codes makes startup instant for huge Flat indexes; the first searches page them in.
        flags = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if mmap else 0
        try:
            index = faiss.read_index(str(index_path), flags)
        except RuntimeError as err:  # FAISS's message starts with the C++ function and source line: keep the reason
            reason = re.sub(r"^Error in .*? at \S+:\d+: (Error: '.*?' failed: )?", "", str(err))
            raise ValueError(f"--index_path {index_path}: cannot read it as a FAISS index: {reason}") from None
        if search_params:  # e.g. "nprobe=64" for IVF, "efSearch=128" for HNSW
            faiss.ParameterSpace().set_index_parameters(index, search_params)
        self.size, self.dim = int(index.ntotal), int(index.d)
        self.description = f"faiss {type(index).__name__} ({self.size} x {self.dim}) on CPU"
        if use_gpu:
            num_gpus = faiss_gpu_count()
            options = faiss.GpuMultipleClonerOptions()
            options.useFloat16 = gpu_fp16
            options.shard = True  # a 61 GB Flat index fits only when split across GPUs
            index = faiss.index_cpu_to_all_gpus(index, co=options)
            self.description = f"faiss {type(index).__name__} ({self.size} x {self.dim}) on {num_gpus} GPU(s)"
        self.index = index

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        # Searching a CPU index from several threads at once is safe; GPU indexes are not: the server keeps one worker.
        scores, rows = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return scores, rows.astype(np.int64, copy=False)


class QdrantIndex:
    """A Qdrant collection whose point ids are corpus rows: a server URL or qdrant-client's embedded path."""

    def __init__(self, collection: str, url: str | None = None, path: str | None = None):
        from qdrant_client import QdrantClient, models

        if bool(url) == bool(path):
            raise ValueError("give exactly one of --qdrant_url (a Qdrant server) and --qdrant_path (embedded mode)")
        self._models = models
        self.client = QdrantClient(url=url) if url else QdrantClient(path=path)
        if not self.client.collection_exists(collection):
            raise ValueError(f"Qdrant collection {collection!r} does not exist at {url or path}")
        info = self.client.get_collection(collection)
        self.collection = collection
        self.size = int(info.points_count or 0)
        self.dim = int(info.config.params.vectors.size)
        self.description = f"qdrant collection {collection!r} ({self.size} x {self.dim}) at {url or path}"

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        requests = [self._models.QueryRequest(query=vector.tolist(), limit=k) for vector in vectors]
        responses = self.client.query_batch_points(self.collection, requests=requests)
        scores = np.full((len(vectors), k), -np.inf, dtype=np.float32)
        rows = np.full((len(vectors), k), -1, dtype=np.int64)
        for i, response in enumerate(responses):
            for j, point in enumerate(response.points[:k]):
                scores[i, j], rows[i, j] = point.score, int(point.id)
        return scores, rows

    def close(self) -> None:
        self.client.close()


class DenseSearcher:
    def __init__(self, encoder: "TextEncoder", index: VectorIndex):
        if index.dim != encoder.dim:
            raise ValueError(
                f"the index holds {index.dim}-d vectors but the encoder (--retriever_model) produces {encoder.dim}-d "
                "ones: the index was built with another encoder"
            )
        self.encoder, self.index = encoder, index
        self.size = index.size
        self.description = f"{index.description}, encoder on {encoder.device} ({encoder.precision})"

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search_vectors(self.encoder.encode_queries(queries), k)

    def fork(self) -> "DenseSearcher":
        """A searcher for another thread: its own encoder (tokenizer), the same model and index. Only for indexes
        that may be searched from several threads at once (FAISS on CPU)."""
        return DenseSearcher(self.encoder.fork(), self.index)

    def close(self) -> None:
        if hasattr(self.index, "close"):  # embedded Qdrant holds a lock on its directory until closed
            self.index.close()


def bm25_tokenize(texts: list[str], stopwords: str, show_progress: bool = False) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(texts, stopwords=stopwords, return_ids=False, show_progress=show_progress)


class BM25Searcher:
    """A bm25s index directory written by `index_builder --retriever_name bm25`."""

    def __init__(self, index_dir: str | os.PathLike):
        import bm25s

        index_dir = Path(index_dir)
        settings_file = index_dir / BM25_SETTINGS_FILE
        if not settings_file.is_file():
            raise ValueError(f"{index_dir} is not a BM25 index from index_builder ({BM25_SETTINGS_FILE} is missing)")
        self.stopwords = json.loads(settings_file.read_text())["stopwords"]
        self.retriever = bm25s.BM25.load(str(index_dir), mmap=True)
        self.size = int(self.retriever.scores["num_docs"])
        self.description = f"bm25s index ({self.size} documents) at {index_dir}"

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        found = min(k, self.size)
        tokens = bm25_tokenize(queries, self.stopwords)
        rows, scores = self.retriever.retrieve(tokens, k=found, show_progress=False, n_threads=0)
        # bm25s fills up with documents that match no term (score 0); Lucene, behind Search-R1's BM25 server, returns
        # only documents that match: a blank or stopwords-only query gets no hits.
        rows = np.where(scores > 0, rows, -1)
        scores = np.where(scores > 0, scores, -np.inf)
        if found < k:
            rows = np.pad(rows, ((0, 0), (0, k - found)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, k - found)), constant_values=-np.inf)
        return scores.astype(np.float32), rows.astype(np.int64)
