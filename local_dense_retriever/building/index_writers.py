"""Where the passage vectors go: a FAISS index of any factory string (IVF/PQ trained on the first --train_size
vectors, optionally on a GPU), a layout built from a Flat index's vectors (--from_index), a Qdrant collection, or
a BM25 index of the texts. Row i of each is line i of the corpus."""

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from local_dense_retriever.building.index_config import BuildConfig
from local_dense_retriever.building.layouts import build_layout, new_index, set_search_params, write_index
from local_dense_retriever.retrieval import cpu_threads
from local_dense_retriever.retrieval.corpus import iter_documents
from local_dense_retriever.retrieval.layouts import Layout

logger = logging.getLogger("local_dense_retriever.index_builder")


def write_faiss_index(chunks: Iterable[np.ndarray], config: BuildConfig, index_path: Path) -> int:
    """The chunks added to a new index of config.faiss_type, written to `index_path`; rows added."""
    import faiss

    cpu_threads.configure_pools(cpu_threads.thread_count(config.num_threads))  # IVF/PQ training, adds
    metric = faiss.METRIC_INNER_PRODUCT if config.metric == "ip" else faiss.METRIC_L2
    index, pending, added = None, [], 0
    for chunk in chunks:
        if index is None:
            index = new_index(chunk.shape[1], config.faiss_type, metric, config.hnsw_ef_construction)
            if config.faiss_gpu:
                index = to_gpu(index)
        if not index.is_trained:  # IVF / PQ: hold back vectors until there are enough to train on
            pending.append(chunk)
            if sum(len(part) for part in pending) < config.train_size:
                continue
            chunk, pending = np.concatenate(pending), []
            train(index, chunk[: config.train_size])
        index.add(chunk)
        added += len(chunk)
    if pending:  # the corpus is smaller than --train_size: train on all of it
        chunk = np.concatenate(pending)
        train(index, chunk)
        index.add(chunk)
        added += len(chunk)
    if index is None:
        raise ValueError("no vectors to index")
    if config.faiss_gpu:
        index = faiss.index_gpu_to_cpu(index)
    set_search_params(index, config.faiss_search_params)
    write_index(index, index_path)
    return added


def build_from_flat(config: BuildConfig, total: int) -> int:
    """--from_index: the layout from a Flat index's vectors, memory-mapped and streamed; IVF/PQ/SQ train on a random
    sample of --train_size rows (not the first rows, which follow the corpus's order)."""
    from local_dense_retriever.retrieval.index_files import FlatVectors

    vectors = FlatVectors(config.from_index)
    if vectors.size != total:
        raise ValueError(
            f"--from_index {config.from_index} has {vectors.size} vectors; the corpus has {total} documents"
        )
    cpu_threads.configure_pools(cpu_threads.thread_count(config.num_threads))
    layout = Layout(config.faiss_type, config.faiss_search_params or "", config.hnsw_ef_construction)
    built = build_layout(vectors, layout, config.train_size, progress=config.progress)
    write_index(built.index, Path(config.index_path))
    return built.index.ntotal


def train(index, vectors: np.ndarray) -> None:
    logger.info("training %s on %d vectors", type(index).__name__, len(vectors))
    index.train(vectors)


def to_gpu(index):
    """One GPU: training (k-means) is what gains; shards would each train their own quantizer."""
    import faiss

    from local_dense_retriever.retrieval.backends import faiss_gpu_count

    faiss_gpu_count()  # raises when there is none
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)


def write_qdrant_collection(chunks: Iterable[np.ndarray], config: BuildConfig) -> int:
    from qdrant_client import QdrantClient, models

    if bool(config.qdrant_url) == bool(config.qdrant_path):
        raise ValueError("give exactly one of --qdrant_url and --qdrant_path")
    client = QdrantClient(url=config.qdrant_url) if config.qdrant_url else QdrantClient(path=config.qdrant_path)
    try:
        added = 0
        for chunk in chunks:
            if added == 0:
                if client.collection_exists(config.qdrant_collection):
                    if not config.overwrite:
                        raise ValueError(f"Qdrant collection {config.qdrant_collection!r} exists; pass --overwrite")
                    client.delete_collection(config.qdrant_collection)
                # Dot product = FAISS's inner product, so scores and rankings match the FAISS path.
                vectors = models.VectorParams(size=chunk.shape[1], distance=models.Distance.DOT)
                client.create_collection(config.qdrant_collection, vectors_config=vectors)
            client.upload_collection(
                config.qdrant_collection, vectors=chunk, ids=range(added, added + len(chunk)), batch_size=256
            )
            added += len(chunk)
        return added
    finally:
        client.close()


def write_bm25_index(corpus_path: Path, out_dir: Path, progress: bool = True, stopwords: str = "en") -> int:
    import bm25s

    from local_dense_retriever.retrieval.backends import BM25_SETTINGS_FILE, bm25_tokenize

    texts = [document["contents"] for document in iter_documents(corpus_path)]
    retriever = bm25s.BM25()
    retriever.index(bm25_tokenize(texts, stopwords, show_progress=progress), show_progress=progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    retriever.save(str(out_dir), show_progress=progress)
    (out_dir / BM25_SETTINGS_FILE).write_text(json.dumps({"stopwords": stopwords}))
    return len(texts)
