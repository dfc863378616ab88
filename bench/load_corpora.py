"""The corpora and questions of the retriever load benchmark (bench/retriever_load.py).

10k is the embedded mini-Wikipedia (10,033 real summaries, real MiniLM embeddings). 100k and 1M are synthetic: row i
repeats summary i mod 10,033 with a "[copy k]" title, and its vector is that summary's real MiniLM embedding plus
Gaussian noise (NOISE_SIGMA per dimension, then re-normalised; cosine ~0.8 to the source); rows below 10,033 are the
real ones. Generated once and cached under .cache/bench. Queries are real FanOutQA sub-questions.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from local_dense_retriever.building import fingerprints  # noqa: E402
from local_dense_retriever.demo import embedded_default, mini_wiki  # noqa: E402

CACHE_DIR = REPO / ".cache" / "bench"
SIZES = {"10k": 10_033, "100k": 100_000, "1m": 1_000_000}
NOISE_SIGMA = 0.04


def synthetic_vectors(real: np.ndarray, n: int, chunk: int = 100_000):
    """The synthetic corpus's n unit vectors, `chunk` rows at a time: row i is real row i mod len(real), plus
    Gaussian noise (NOISE_SIGMA per dimension, seed 0) on every row past the real ones, re-normalised."""
    rng = np.random.default_rng(0)
    for start in range(0, n, chunk):
        rows = np.arange(start, min(n, start + chunk))
        vectors = real[rows % len(real)].copy()
        copies = rows >= len(real)
        vectors[copies] += rng.normal(0.0, NOISE_SIGMA, size=(int(copies.sum()), real.shape[1])).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        yield vectors


def synthetic_corpus(n: int, assets: embedded_default.MiniWikiAssets) -> tuple[Path, Path]:
    """Corpus jsonl + Flat index of n rows derived from the real summaries and their MiniLM vectors (cached)."""
    import faiss

    out = CACHE_DIR / f"synthetic_{n}"
    corpus_path, index_path, manifest_path = out / "corpus.jsonl", out / "minilm_Flat.index", out / "manifest.json"
    # by content: the real vectors it derives from, not where they sit
    manifest = {"n": n, "sigma": NOISE_SIGMA, "seed": 0, "source": fingerprints.file_digest(assets.embeddings_path)}
    cached = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    reason = fingerprints.stale_reason(cached, manifest)
    if reason is None and index_path.exists() and corpus_path.exists():
        return corpus_path, index_path
    print(f"  generating the {n}-row synthetic corpus in {out}: {reason or 'a cached file is missing'}")
    out.mkdir(parents=True, exist_ok=True)
    summaries = mini_wiki.load_summaries()
    real = np.load(assets.embeddings_path)
    base = len(summaries)
    started = time.perf_counter()
    copies = (
        {**summary, "title": f"{summary['title']} [copy {row // base}]"} if row >= base else summary
        for row, summary in ((row, summaries[row % base]) for row in range(n))
    )
    mini_wiki.write_corpus(copies, corpus_path)
    index = faiss.IndexFlatIP(real.shape[1])
    for vectors in synthetic_vectors(real, n):
        index.add(vectors)
    faiss.write_index(index, str(index_path))
    manifest_path.write_text(json.dumps(manifest))
    print(f"  generated the {n}-row synthetic corpus and index in {time.perf_counter() - started:.0f} s")
    return corpus_path, index_path


def corpus_files(size: str, assets: embedded_default.MiniWikiAssets) -> tuple[Path, Path]:
    """Corpus jsonl and Flat index for a --sizes entry: the real mini-Wikipedia for 10k, synthetic above."""
    if size == "10k":
        return assets.corpus_path, assets.index_path
    return synthetic_corpus(SIZES[size], assets)


def load_questions() -> list[str]:
    return [sub["question"] for sub in mini_wiki.fanoutqa_sub_questions()]
