"""Encoder families, device/dtype policy and length-sorted micro-batching, with the real MiniLM."""

import threading

import numpy as np
import pytest
import torch

from local_dense_retriever.retrieval.encoders import (
    BGE_QUERY_INSTRUCTION,
    TextEncoder,
    encoder_family,
    resolve_device,
    resolve_dtype,
)
from local_dense_retriever.demo.mini_wiki import minilm_model_dir


@pytest.fixture(scope="module", name="minilm")
def minilm_fixture() -> TextEncoder:
    return TextEncoder(str(minilm_model_dir()), retriever_name="minilm", device="cpu")


def test_families_follow_their_model_cards():
    e5 = encoder_family("e5")
    assert (e5.query_prefix, e5.passage_prefix, e5.pooling, e5.normalize) == ("query: ", "passage: ", "mean", True)
    bge = encoder_family("bge-large-en-v1.5")
    assert (bge.query_prefix, bge.passage_prefix, bge.pooling) == (BGE_QUERY_INSTRUCTION, "", "cls")
    dpr = encoder_family("DPR")
    assert (dpr.pooling, dpr.normalize) == ("pooler", False)
    generic = encoder_family("minilm")
    assert (generic.query_prefix, generic.pooling, generic.normalize) == ("", "mean", True)


def test_fp32_on_cpu_fp16_on_gpu_unless_told():
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) is torch.float16
    assert resolve_dtype("bf16", torch.device("cpu")) is torch.bfloat16
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")


def test_micro_batches_match_one_at_a_time_and_keep_input_order(minilm):
    texts = ["a", "a much longer sentence about the history of the Roman Empire and its emperors", "Paris"] * 5
    texts += [f"question number {i} about {'very ' * i}long things" for i in range(12)]
    minilm.max_tokens_per_forward = 48  # forces many small forward passes of similar lengths
    batches_seen = []
    try:
        together = minilm.encode(texts, on_batch=batches_seen.append)
    finally:
        minilm.max_tokens_per_forward = 4096
    alone = np.concatenate([minilm.encode([text]) for text in texts])
    assert together.shape == (len(texts), 384) and together.dtype == np.float32
    np.testing.assert_allclose(together, alone, atol=2e-5)
    assert sum(batches_seen) == len(texts) and len(batches_seen) > 3
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_query_and_passage_prefixes_are_applied(minilm, monkeypatch):
    seen = []
    monkeypatch.setattr(minilm, "encode", lambda texts, on_batch=None: seen.extend(texts))
    monkeypatch.setattr(minilm, "family", encoder_family("e5"))
    minilm.encode_queries(["who?"])
    minilm.encode_passages(["text"])
    assert seen == ["query: who?", "passage: text"]


def test_cls_and_mean_pooling_differ(minilm):
    cls = TextEncoder(str(minilm_model_dir()), retriever_name="minilm", pooling="cls", device="cpu")
    a, b = minilm.encode(["The Eiffel Tower"]), cls.encode(["The Eiffel Tower"])
    assert a.shape == b.shape and not np.allclose(a, b, atol=1e-3)


def test_unknown_pooling_is_rejected():
    with pytest.raises(ValueError, match="pooling must be one of"):
        TextEncoder(str(minilm_model_dir()), pooling="max", device="cpu")


def test_empty_input_gives_an_empty_matrix(minilm):
    assert minilm.encode([]).shape == (0, 384)


def test_query_batches_are_split_only_where_padding_costs_more_than_a_pass(minilm):
    assert [len(rows) for rows in minilm._micro_batches([12] * 64)] == [64]
    uneven = minilm._micro_batches([10] * 40 + [200])
    assert sorted(len(rows) for rows in uneven) == [1, 40] and 40 in uneven[-1].tolist()
    # Above the exact-split limit (index building) a greedy split fills each pass up to the token budget.
    many = minilm._micro_batches([100] * 2000)
    assert all(len(rows) * 100 <= minilm.max_tokens_per_forward for rows in many)
    assert sorted(np.concatenate(many).tolist()) == list(range(2000))


def test_a_fork_shares_the_weights_and_has_a_tokenizer_of_its_own(minilm):
    twin = minilm.fork()
    assert twin.model is minilm.model and twin.tokenizer is not minilm.tokenizer
    np.testing.assert_array_equal(twin.encode(["The Eiffel Tower"]), minilm.encode(["The Eiffel Tower"]))


def test_forward_passes_run_by_others_in_any_order_land_in_input_order(minilm):
    texts = [f"question number {i} about {'very ' * (i % 7)}long things" for i in range(40)]
    minilm.max_tokens_per_forward = 64  # many passes
    ran_on: set[str] = set()

    def backwards_on_threads(forward, passes):
        from concurrent.futures import ThreadPoolExecutor

        def tracked(rows):
            ran_on.add(threading.current_thread().name)
            return forward(rows)

        with ThreadPoolExecutor(2, thread_name_prefix="pass") as pool:
            yield from pool.map(tracked, passes[::-1])

    try:
        in_order = minilm.encode(texts)
        shuffled = minilm.encode(texts, run=backwards_on_threads)
    finally:
        minilm.max_tokens_per_forward = 4096
    np.testing.assert_allclose(shuffled, in_order, atol=2e-5)
    assert ran_on and all(name.startswith("pass") for name in ran_on)


def test_on_cpu_the_model_runs_as_one_traced_graph_with_the_models_vectors(minilm):
    eager = TextEncoder(str(minilm_model_dir()), retriever_name="minilm", device="cpu", trace=False)
    texts = ["a", "The Eiffel Tower is in Paris", "who wrote the Iliad and the Odyssey? " * 20]
    assert minilm.traced is True and eager.traced is False
    np.testing.assert_allclose(minilm.encode(texts), eager.encode(texts), atol=1e-5)


class ShapeBakingGraph:
    """Stands in for a trace that baked its example's shape in: right for that shape only."""

    def __init__(self, model, example):
        self.model, self.shape = model, example[0].shape

    def __call__(self, input_ids, attention_mask):
        output = self.model(input_ids=input_ids, attention_mask=attention_mask)
        hidden = output.last_hidden_state
        return {"last_hidden_state": hidden if input_ids.shape == self.shape else hidden + 1.0}


def test_a_trace_that_differs_on_other_shapes_or_fails_leaves_the_model_eager(monkeypatch):
    monkeypatch.setattr(torch.jit, "trace", lambda model, example, **options: ShapeBakingGraph(model, example))
    baked = TextEncoder(str(minilm_model_dir()), retriever_name="minilm", device="cpu")
    monkeypatch.setattr(torch.jit, "trace", lambda *args, **options: (_ for _ in ()).throw(RuntimeError("no")))
    failed = TextEncoder(str(minilm_model_dir()), retriever_name="minilm", device="cpu")
    assert baked.traced is False and failed.traced is False
    assert baked.encode(["some text"]).shape == (1, 384)
