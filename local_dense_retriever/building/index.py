"""Build a search index from a corpus jsonl: FAISS (any index_factory string), a Qdrant collection, or BM25.

    python -m local_dense_retriever.index_builder --corpus_path wiki-18.jsonl --retriever_name e5 \
        --retriever_model intfloat/e5-base-v2 --faiss_type Flat --save_dir indexes/

Passages are streamed in chunks (bounded memory), encoded in length-sorted micro-batches (fp16 and every GPU
when present, fp32 on CPU), and added as they come; IVF/PQ types are trained on the first --train_size vectors
(on the first GPU with --faiss_gpu).
Row i of the index is line i of the corpus. The corpus's byte-offset sidecar is written too, for the server.

This module is the build's order of steps; index_config.py holds its settings, index_cli.py its flags,
build_checks.py what is checked before encoding, passage_vectors.py where the vectors come from and
index_writers.py where they go.
"""

import time
from dataclasses import dataclass
from pathlib import Path

from local_dense_retriever.building.build_checks import check_free_space, check_output_locations, validate_corpus
from local_dense_retriever.building.index_config import BuildConfig
from local_dense_retriever.building.index_writers import (
    build_from_flat,
    write_bm25_index,
    write_faiss_index,
    write_qdrant_collection,
)
from local_dense_retriever.building.passage_vectors import (
    encoded_chunks,
    load_encoder,
    open_saved,
    saved_chunks,
    saving,
)
from local_dense_retriever.retrieval.corpus import count_documents, ensure_decompressed


@dataclass
class BuildSummary:
    documents: int
    seconds: float
    output: str


def build(config: BuildConfig) -> BuildSummary:
    started = time.perf_counter()
    check_output_locations(config)
    corpus_path = ensure_decompressed(Path(config.corpus_path), progress=config.progress)
    total = count_documents(corpus_path, progress=config.progress)  # also leaves the sidecar for the server
    if config.is_bm25:
        added = write_bm25_index(corpus_path, Path(config.index_path), progress=config.progress)
        output = config.index_path
    elif config.from_index:
        added = build_from_flat(config, total)
        output = config.index_path
    else:
        if config.embeddings_path:
            embeddings = open_saved(config.embeddings_path, total)
            check_free_space(config, total, embeddings.shape[1])
            chunks = saved_chunks(config.embeddings_path, embeddings, config.chunk_size)
        else:
            validate_corpus(corpus_path, total, config.progress)
            encoder, run = load_encoder(config)
            check_free_space(config, total, encoder.dim)
            chunks = encoded_chunks(encoder, run, corpus_path, total, config.chunk_size, config.progress)
        if config.save_embeddings:
            chunks = saving(chunks, config.save_embeddings, total)
        if config.backend == "qdrant":
            added = write_qdrant_collection(chunks, config)
            output = f"qdrant collection {config.qdrant_collection} at {config.qdrant_url or config.qdrant_path}"
        else:
            added = write_faiss_index(chunks, config, Path(config.index_path))
            output = config.index_path
    if added != total:
        raise ValueError(f"indexed {added} documents but {corpus_path} has {total} lines")
    return BuildSummary(documents=added, seconds=time.perf_counter() - started, output=output)
