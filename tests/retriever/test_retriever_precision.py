"""The CPU encoder's precision: a reduced one is used only where measured faster and its top-3 rows agree with
fp32's; the decision is cached per machine, model and index. Timings are injected: the rule is what is tested."""

import json

import numpy as np
import pytest
import torch

from local_dense_retriever.retrieval import precision
from local_dense_retriever.retrieval.backends import DenseSearcher, FaissIndex
from local_dense_retriever.retrieval.corpus import Corpus
from local_dense_retriever.retrieval.encoders import TextEncoder, resolve_dtype
from local_dense_retriever.retrieval.questions import corpus_queries, read_questions
from local_dense_retriever.serving import loading
from local_dense_retriever.serving.loading import choose_encoder_precision
from support.retriever_fixtures import dense_config, small_wiki_fixture  # noqa: F401

QUERIES = [f"q{i}" for i in range(100)]


class FakeEncoder:
    """Encodes query i as a fixed vector; `flip` queries get another row's vector (a precision that disagrees)."""

    def __init__(self, qps: float, flip: int = 0, fails: bool = False):
        self.qps, self.flip, self.fails = qps, flip, fails

    def vectors(self, queries: list[str]) -> np.ndarray:
        rows = np.array([int(q[1:]) for q in queries])
        rows[: self.flip] = (rows[: self.flip] + 50) % 100
        return np.eye(100, dtype=np.float32)[rows]


def fake_measure(encoder: FakeEncoder, queries: list[str], warm_up: bool = True):
    if encoder.fails:
        raise RuntimeError("no kernel for this dtype")
    return encoder.qps, encoder.vectors(queries)


def search(vectors: np.ndarray, k: int):
    order = np.argsort(-vectors, axis=1)[:, :k]  # rows of the unit vectors: the query's own row first
    return np.take_along_axis(vectors, order, 1), order


def decide(candidates: dict[str, FakeEncoder], base_qps: float = 100.0):
    return precision.choose(
        FakeEncoder(base_qps), candidates.__getitem__, search, QUERIES, "fake", list(candidates), measure=fake_measure
    )[0]


def test_a_faster_agreeing_precision_is_chosen_and_the_fastest_wins():
    choice = decide({"bf16": FakeEncoder(170.0), "int8": FakeEncoder(260.0)})
    assert choice.chosen == "int8" and "2.60x" in choice.reason
    assert [(t.precision, t.agreement) for t in choice.trials] == [("fp32", None), ("bf16", 1.0), ("int8", 1.0)]


def test_a_precision_whose_top_rows_differ_on_more_than_one_percent_is_refused():
    choice = decide({"int8": FakeEncoder(260.0, flip=2)})  # 98 of 100 queries agree
    assert choice.chosen == "fp32" and choice.trials[1].agreement == 0.98
    assert decide({"int8": FakeEncoder(260.0, flip=1)}).chosen == "int8"  # 99 of 100: at the bar


def test_a_precision_that_is_not_clearly_faster_is_refused():
    assert decide({"bf16": FakeEncoder(110.0)}).chosen == "fp32"  # 1.10x: within timing noise
    assert decide({"bf16": FakeEncoder(116.0)}).chosen == "bf16"


def test_a_precision_that_fails_leaves_fp32_and_says_why():
    choice = decide({"bf16": FakeEncoder(300.0, fails=True)})
    assert choice.chosen == "fp32" and "no kernel for this dtype" in choice.summary()


def test_candidates_follow_the_cpu_flags():
    assert precision.cpu_candidates({"avx512_bf16", "avx2"}) == ["bf16"]
    assert precision.cpu_candidates({"amx_bf16"}) == ["bf16"]
    assert precision.cpu_candidates({"avx2", "avx512f"}) == ["int8"]  # emulated bf16 is slower than fp32


def test_int8_is_a_cpu_precision_only():
    assert resolve_dtype("int8", torch.device("cpu")) == torch.float32
    with pytest.raises(ValueError, match="runs on the CPU; accepted on GPU: fp16, bf16, fp32"):
        resolve_dtype("int8", torch.device("cuda"))


def test_int8_encoder_quantises_its_linear_layers_and_keeps_the_vectors_close(small_wiki):
    fp32 = TextEncoder(str(small_wiki.model_dir), retriever_name="minilm", device="cpu", dtype="fp32")
    int8 = TextEncoder(str(small_wiki.model_dir), retriever_name="minilm", device="cpu", dtype="int8")
    assert int8.precision == "int8" and fp32.precision == "fp32"
    assert any("quantized" in type(module).__module__ for module in int8.model.modules())
    questions = [q.question for q in small_wiki.questions[:16]]
    cosine = (fp32.encode_queries(questions) * int8.encode_queries(questions)).sum(axis=1)
    assert cosine.min() > 0.8 and cosine.mean() > 0.95


def test_the_server_measures_once_and_caches_the_decision(small_wiki, tmp_path, monkeypatch):
    monkeypatch.setenv(precision.CACHE_ENV, str(tmp_path))
    config = dense_config(small_wiki)
    encoder = TextEncoder(str(small_wiki.model_dir), retriever_name="minilm", device="cpu", dtype="fp32")
    searcher = DenseSearcher(encoder, FaissIndex(small_wiki.index_path))
    corpus = Corpus(small_wiki.corpus_path)
    try:
        chosen = choose_encoder_precision(config, searcher, corpus)
        entries = json.loads((tmp_path / "encoder_precision.json").read_text())
        (entry,) = entries.values()
        assert chosen.encoder.precision == entry["chosen"]
        assert [t["precision"] for t in entry["trials"]] == ["fp32", *precision.cpu_candidates()]
        assert "corpus passages" in entry["probe"]
        calls = []
        monkeypatch.setattr(precision, "choose", lambda *args, **kwargs: calls.append(1))
        again = choose_encoder_precision(config, searcher, corpus)
        assert calls == [] and again.encoder.precision == entry["chosen"]  # read from the cache, not measured
    finally:
        corpus.close()


@pytest.mark.parametrize(("dtype", "measures"), [("auto", False), ("measured", True)])
def test_only_dtype_measured_trades_fp32_for_speed_on_cpu(small_wiki, tmp_path, monkeypatch, dtype, measures):
    """The default keeps fp32 on the CPU, where a query's answer does not depend on its batch-mates; the measured
    choice is asked for by name."""
    monkeypatch.setenv(precision.CACHE_ENV, str(tmp_path))
    asked = []
    monkeypatch.setattr(
        loading, "choose_encoder_precision", lambda config, searcher, corpus: asked.append(1) or searcher
    )
    resources = loading.load_resources(dense_config(small_wiki, dtype=dtype, device="cpu", num_threads=1))
    try:
        assert asked == ([1] if measures else [])
        assert resources.searcher.encoder.precision == "fp32"
    finally:
        resources.close()


def test_question_files_of_every_accepted_kind(tmp_path):
    (tmp_path / "q.txt").write_text("Who?\n\nWhere?\nWho?\n")
    (tmp_path / "q.jsonl").write_text('{"question": "Who?"}\n{"query": "Where?"}\n')
    (tmp_path / "q.json").write_text('["Who?", {"question": "Where?"}]')
    for name in ("q.txt", "q.jsonl", "q.json"):
        assert read_questions(tmp_path / name) == ["Who?", "Where?"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["a?", "b?", "c?"]}), tmp_path / "q.parquet")
    assert sorted(read_questions(tmp_path / "q.parquet", limit=2)) in (["a?", "b?"], ["a?", "c?"], ["b?", "c?"])
    with pytest.raises(ValueError, match="accepted are .txt"):
        read_questions(tmp_path / "q.csv") if (tmp_path / "q.csv").write_text("x") else None


def test_corpus_queries_are_the_first_words_of_passages_without_the_title(small_wiki):
    corpus = Corpus(small_wiki.corpus_path)
    try:
        queries = corpus_queries(corpus, 5, words=6)
    finally:
        corpus.close()
    assert len(queries) == 5 and all(len(q.split()) == 6 and not q.startswith('"') for q in queries)


def test_agreement_is_the_share_of_queries_with_the_same_top_rows_in_any_order():
    fp32 = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 5, 9]])
    other = np.array([[1, 3, 2], [4, 5, 7], [7, 8, 9], [1, 9, 5]])  # the second differs in its third row only
    assert precision.agreement(other, fp32) == 0.75
