"""What one index build makes, from what and how: the builder's settings (index_cli.py fills them from its flags;
the embedded demo and the benchmarks fill them directly)."""

from dataclasses import dataclass
from pathlib import Path


@dataclass
class BuildConfig:
    corpus_path: str
    index_path: str | None = None  # FAISS file or BM25 directory; Qdrant uses the qdrant_* fields
    retriever_name: str = "e5"
    retriever_model: str = "intfloat/e5-base-v2"
    backend: str = "faiss"  # faiss | qdrant (bm25 is chosen with retriever_name="bm25")
    faiss_type: str = "Flat"
    metric: str = "ip"
    faiss_gpu: bool = False
    train_size: int = 200_000
    chunk_size: int = 16_384
    max_length: int = 256
    batch_size: int | None = None  # rows per forward pass; the token budget below usually decides
    max_tokens_per_forward: int | None = None
    num_threads: int | None = None  # CPU threads for encoding and FAISS; None: the CPUs this process may use
    pooling_method: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    embeddings_path: str | None = None  # reuse saved embeddings instead of encoding
    from_index: str | None = None  # a Flat index whose vectors the layout is built from (random training sample)
    faiss_search_params: str | None = None  # written into the index (efSearch, nprobe): the server starts with them
    hnsw_ef_construction: int | None = None  # HNSW's build-time breadth; None: FAISS's default (40)
    save_embeddings: str | None = None
    qdrant_url: str | None = None
    qdrant_path: str | None = None
    qdrant_collection: str = "search_r1"
    overwrite: bool = False
    progress: bool = True

    @property
    def is_bm25(self) -> bool:
        return self.retriever_name.lower() == "bm25"


def default_index_path(save_dir: str, retriever_name: str, faiss_type: str) -> str:
    """FlashRAG / Search-R1 naming: e5_Flat.index; a `bm25` directory for BM25."""
    if retriever_name.lower() == "bm25":
        return str(Path(save_dir) / "bm25")
    return str(Path(save_dir) / f"{retriever_name}_{faiss_type.replace(',', '_')}.index")
