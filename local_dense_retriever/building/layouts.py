"""Build a FAISS layout from vectors that are already encoded (a Flat index's, or saved embeddings), streaming them
from the memory-mapped file in chunks: training draws a random sample, adding reads chunk after chunk, so the only
full-size structure in RAM is the layout being built.
"""

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from local_dense_retriever.retrieval.index_files import FlatVectors
from local_dense_retriever.retrieval.layouts import Layout

logger = logging.getLogger(__name__)

ADD_CHUNK_ROWS = 65_536
TRAIN_POINTS_PER_LIST = 64  # FAISS warns below 39 per centroid; 64 gives k-means room without costing much


@dataclass
class Built:
    index: object  # faiss.Index
    seconds: float


def train_size_for(layout: Layout, size: int, cap: int) -> int:
    """Vectors to train on: enough for every IVF list and PQ codebook, at most `cap` and the corpus."""
    match = re.match(r"IVF(\d+),", layout.factory)
    needed = int(match[1]) * TRAIN_POINTS_PER_LIST if match else 0
    if "PQ" in layout.factory or "SQ" in layout.factory:
        needed = max(needed, 256 * TRAIN_POINTS_PER_LIST)
    return min(size, max(needed, min(cap, size)) if needed else min(cap, size))


def new_index(dim: int, factory: str, metric: int, ef_construction: int | None = None):
    """An empty `faiss.index_factory` index, its HNSW graph built at `ef_construction` when given."""
    import faiss

    index = faiss.index_factory(dim, factory, metric)
    if ef_construction:
        faiss.downcast_index(index).hnsw.efConstruction = ef_construction
    return index


def build_layout(
    vectors: FlatVectors,
    layout: Layout,
    train_cap: int = 200_000,
    quantizers: dict | None = None,
    progress: bool = True,
) -> Built:
    """`layout` over every row of `vectors`, rows in order (row i of the index is row i of the vectors), with the
    layout's search parameters set. IVF layouts train as index_factory's do (k-means on the sample); `quantizers`
    (nlist -> trained coarse quantizer) shares one training between IVF layouts of the same nlist."""
    import faiss

    started = time.perf_counter()
    metric = faiss.METRIC_INNER_PRODUCT if vectors.metric == "ip" else faiss.METRIC_L2
    index = new_index(vectors.dim, layout.factory, metric, layout.ef_construction)
    if not index.is_trained:
        sample = vectors.sample(train_size_for(layout, vectors.size, train_cap))
        ivf = re.match(r"IVF(\d+),", layout.factory)
        nlist = int(ivf[1]) if ivf else None
        cache = quantizers if quantizers is not None else {}
        if nlist in cache:  # the IVF lists of another layout: only the codes (SQ ranges, PQ codebooks) are trained
            index = _ivf_with_quantizer(layout.factory, faiss.clone_index(cache[nlist]), vectors.dim, nlist, metric)
        logger.info("training %s on %d vectors", layout.factory, len(sample))
        index.train(sample)
        if nlist is not None and nlist not in cache:
            cache[nlist] = faiss.clone_index(faiss.extract_index_ivf(index).quantizer)
    with tqdm(total=vectors.size, unit="vec", desc=f"add to {layout.factory}", disable=not progress) as bar:
        for _, chunk in vectors.chunks(ADD_CHUNK_ROWS):
            index.add(chunk)
            bar.update(len(chunk))
    set_search_params(index, layout.params)
    return Built(index, time.perf_counter() - started)


def _ivf_with_quantizer(factory: str, quantizer, dim: int, nlist: int, metric: int):
    import faiss

    codes = factory.split(",", 1)[1]
    if codes == "Flat":
        return faiss.IndexIVFFlat(quantizer, dim, nlist, metric)
    pq = re.fullmatch(r"PQ(\d+)(?:x(\d+))?", codes)
    if pq:
        return faiss.IndexIVFPQ(quantizer, dim, nlist, int(pq[1]), int(pq[2] or 8), metric)
    kinds = {"SQ8": "QT_8bit", "SQ6": "QT_6bit", "SQ4": "QT_4bit", "SQfp16": "QT_fp16", "SQbf16": "QT_bf16"}
    if codes in kinds:
        qtype = getattr(faiss.ScalarQuantizer, kinds[codes])
        return faiss.IndexIVFScalarQuantizer(quantizer, dim, nlist, qtype, metric)
    raise ValueError(f"layout {factory}: IVF codes {codes!r} are not supported here")


def set_search_params(index, params: str) -> None:
    import faiss

    if params:
        faiss.ParameterSpace().set_index_parameters(index, params)


def write_index(index, path: Path) -> int:
    """Write through a temporary name (a whole file or none); returns its size in bytes."""
    import faiss

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    faiss.write_index(index, str(partial))
    os.replace(partial, path)
    return path.stat().st_size
