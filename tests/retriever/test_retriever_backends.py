"""FAISS index types, BM25 (bm25s) and Qdrant (embedded mode) behind the same server API."""

import httpx
import numpy as np
import pytest

from local_dense_retriever.retrieval.backends import FaissIndex, QdrantIndex
from local_dense_retriever.building.index import build
from local_dense_retriever.building.index_config import BuildConfig
from local_dense_retriever.demo.mini_wiki import title_of, write_corpus
from local_dense_retriever.serving.config import ServerConfig
from support.retriever_fixtures import dense_config, dense_server_fixture, serve_ready, small_wiki_fixture  # noqa: F401


def top_titles(url: str, queries: list[str], topk: int) -> list[list[str]]:
    response = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": topk}, timeout=60)
    assert response.status_code == 200, response.text
    return [[title_of(doc["contents"]) for doc in hits] for hits in response.json()["result"]]


def exact_neighbours(embeddings: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(queries @ embeddings.T), axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize(
    ("faiss_type", "search_params", "min_recall"),
    [("HNSW16", "efSearch=64", 0.95), ("IVF8,Flat", "nprobe=8", 1.0), ("IVF4,PQ48x4", "nprobe=4", 0.5)],
)
def test_index_factory_types_from_saved_embeddings(small_wiki, tmp_path, faiss_type, search_params, min_recall):
    embeddings = np.load(small_wiki.embeddings_path)
    index_path = tmp_path / "test.index"
    # Small chunks and a training sample larger than one chunk exercise the hold-back-then-train path.
    config = BuildConfig(
        corpus_path=str(small_wiki.corpus_path),
        index_path=str(index_path),
        faiss_type=faiss_type,
        embeddings_path=str(small_wiki.embeddings_path),
        chunk_size=64,
        train_size=200,
        progress=False,
    )
    assert build(config).documents == len(embeddings)
    index = FaissIndex(index_path, search_params=search_params)
    assert index.size == len(embeddings) and index.dim == 384
    queries = embeddings[::7] + 0.01
    _, rows = index.search_vectors(queries, 5)
    expected = exact_neighbours(embeddings, queries, 5)
    recall = np.mean([len(set(got) & set(want)) / 5 for got, want in zip(rows, expected, strict=True)])
    assert recall >= min_recall, f"{faiss_type}: recall@5 {recall:.2f} against exact search"


def test_bm25_server_finds_pages_by_their_words(small_wiki, tmp_path):
    index_dir = tmp_path / "bm25"
    config = BuildConfig(corpus_path=str(small_wiki.corpus_path), index_path=str(index_dir), retriever_name="bm25")
    config.progress = False
    assert build(config).documents == len(small_wiki.titles)
    server = ServerConfig(index_path=str(index_dir), corpus_path=str(small_wiki.corpus_path), retriever_name="bm25")
    with serve_ready(server) as url:
        titles = small_wiki.titles[::15]
        top1 = [hits[0] for hits in top_titles(url, titles, 1)]
        assert np.mean([got == want for got, want in zip(top1, titles, strict=True)]) >= 0.9
        questions = small_wiki.questions
        found = [
            q.evidence_title in hits
            for q, hits in zip(questions, top_titles(url, [q.question for q in questions], 3), strict=True)
        ]
        assert np.mean(found) >= 0.6, f"BM25 recall@3 {np.mean(found):.2f}"
        # No term matches (only stopwords, or blank): no hits, as Lucene behind Search-R1's BM25 server answers.
        unmatched = httpx.post(f"{url}/retrieve", json={"queries": ["the of and", "", "  "], "return_scores": True})
        assert unmatched.status_code == 200 and unmatched.json() == {"result": [[], [], []]}


def test_bm25_with_fewer_documents_than_topk(tmp_path):
    corpus = write_corpus(
        [{"title": f"Page {i}", "extract": f"alpha beta {'gamma ' * i}"} for i in range(4)], tmp_path / "tiny.jsonl"
    )
    build(
        BuildConfig(corpus_path=str(corpus), index_path=str(tmp_path / "bm25"), retriever_name="bm25", progress=False)
    )
    server = ServerConfig(index_path=str(tmp_path / "bm25"), corpus_path=str(corpus), retriever_name="bm25")
    with serve_ready(server) as url:
        hits = top_titles(url, ["gamma"], 10)[0]
        everywhere = top_titles(url, ["alpha"], 10)[0]
    assert hits == ["Page 3", "Page 2", "Page 1"]  # Page 0 holds no "gamma": not a hit
    assert len(everywhere) == 4


def test_qdrant_embedded_serves_the_same_answers_as_faiss_flat(small_wiki, dense_server, tmp_path):
    qdrant_dir = tmp_path / "qdrant"
    build(
        BuildConfig(
            corpus_path=str(small_wiki.corpus_path),
            backend="qdrant",
            qdrant_path=str(qdrant_dir),
            embeddings_path=str(small_wiki.embeddings_path),
            chunk_size=100,
            progress=False,
        )
    )
    index = QdrantIndex("search_r1", path=str(qdrant_dir))
    assert (index.size, index.dim) == (len(small_wiki.titles), 384)
    index.close()
    config = dense_config(small_wiki, backend="qdrant", qdrant_path=str(qdrant_dir), index_path=None)
    queries = [q.question for q in small_wiki.questions[:20]]
    payload = {"queries": queries, "topk": 3, "return_scores": True}
    with serve_ready(config) as url:
        from_qdrant = httpx.post(f"{url}/retrieve", json=payload, timeout=60).json()["result"]
        assert "qdrant collection" in httpx.get(f"{url}/health").json()["retriever"]
    from_faiss = httpx.post(f"{dense_server}/retrieve", json=payload, timeout=60).json()["result"]
    for q_hits, f_hits in zip(from_qdrant, from_faiss, strict=True):
        assert [h["document"]["id"] for h in q_hits] == [h["document"]["id"] for h in f_hits]
        np.testing.assert_allclose([h["score"] for h in q_hits], [h["score"] for h in f_hits], atol=1e-4)


def test_qdrant_builder_refuses_to_overwrite_without_the_flag(small_wiki, tmp_path):
    config = BuildConfig(
        corpus_path=str(small_wiki.corpus_path),
        backend="qdrant",
        qdrant_path=str(tmp_path / "qdrant"),
        embeddings_path=str(small_wiki.embeddings_path),
        progress=False,
    )
    build(config)
    with pytest.raises(ValueError, match="exists; pass --overwrite"):
        build(config)
    config.overwrite = True
    assert build(config).documents == len(small_wiki.titles)
