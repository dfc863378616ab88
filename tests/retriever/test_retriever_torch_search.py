"""Exact search with torch alone: row shards over devices, chunked scoring, merged top-k. On CPU torch here; the
same code runs on GPUs. Rows equal FAISS Flat's (ties aside), scores within the dtype's rounding."""

import weakref

import faiss
import httpx
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from local_dense_retriever.retrieval import gpus
from local_dense_retriever.retrieval.index_files import FlatVectors
from local_dense_retriever.retrieval.torch_search import TorchExactIndex, check_room, parse_devices, streamed_topk
from local_dense_retriever.serving.config import parse_config
from support.rankings import same_ranking
from support.retriever_fixtures import dense_config, serve_ready, small_wiki_fixture  # noqa: F401

CPU = torch.device("cpu")


@pytest.fixture(scope="module", name="flat")
def flat_fixture(tmp_path_factory):
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(5000, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(64)
    index.add(vectors)
    path = tmp_path_factory.mktemp("torch") / "v_Flat.index"
    faiss.write_index(index, str(path))
    queries = rng.normal(size=(40, 64)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return path, index, queries


def agree_with_faiss(index, queries, rows, scores, tolerance: float) -> None:
    """Each row the searcher returns is one FAISS ranks there too, or one whose exact score ties within tolerance."""
    want_scores, want_rows = index.search(queries, rows.shape[1])
    assert np.abs(scores - want_scores).max() <= tolerance
    exact = queries @ flat_array(index).T
    for q in range(len(queries)):
        for j in range(rows.shape[1]):
            if rows[q, j] != want_rows[q, j]:
                assert abs(exact[q, rows[q, j]] - want_scores[q, j]) <= tolerance, (q, j)


def flat_array(index) -> np.ndarray:
    return faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d)


def test_fp32_on_cpu_returns_faiss_flat_rows_and_scores(flat):
    path, index, queries = flat
    searcher = TorchExactIndex(FlatVectors(path), [CPU], dtype="fp32")
    scores, rows = searcher.search_vectors(queries, 10)
    want_scores, want_rows = index.search(queries, 10)
    assert (rows == want_rows).all()
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)


@pytest.mark.parametrize(("dtype", "tolerance"), [("fp16", 2e-3), ("bf16", 1.6e-2)])
def test_half_precision_shards_agree_with_faiss_within_rounding(flat, dtype, tolerance):
    path, index, queries = flat
    searcher = TorchExactIndex(FlatVectors(path), [CPU, CPU, CPU], dtype=dtype)
    assert [len(shard) for shard in searcher.shards] == [1667, 1667, 1666]
    scores, rows = searcher.search_vectors(queries, 5)
    agree_with_faiss(index, queries, rows, scores, tolerance)


def test_shards_and_small_chunks_merge_to_the_same_answer(flat):
    """Three shards scanned 1024 rows at a time (a tiny workspace) give what one shard in one pass gives."""
    path, _, queries = flat
    whole = TorchExactIndex(FlatVectors(path), [CPU], dtype="fp32")
    split = TorchExactIndex(FlatVectors(path), [CPU] * 3, dtype="fp32", workspace_mb=0.001)
    assert split.chunk_rows(len(queries)) == 1024 and whole.chunk_rows(len(queries)) >= 5000
    for k in (1, 7, 30):
        assert (split.search_vectors(queries, k)[1] == whole.search_vectors(queries, k)[1]).all()


class LiveScoreMatrices(TorchDispatchMode):
    """Counts the chunk score matrices (matrix products) alive when each new one is made: the most at once."""

    def __init__(self):
        super().__init__()
        self.alive: list[weakref.ref] = []
        self.most = self.made = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.mm.default, torch.ops.aten.matmul.default):
            self.alive = [ref for ref in self.alive if ref() is not None]
            self.most = max(self.most, len(self.alive) + 1)
            self.alive.append(weakref.ref(out))
            self.made += 1
        return out


def test_one_chunk_score_matrix_is_alive_at_a_time(flat):
    """The workspace bound the memory plan counts (measured on an H100: peak = vectors + workspace within 0.05 GiB)
    holds only if each chunk's score matrix is freed before the next one is made."""
    path, _, queries = flat
    split = TorchExactIndex(FlatVectors(path), [CPU], dtype="fp32", workspace_mb=0.001)
    with LiveScoreMatrices() as live:
        split.search_vectors(queries, 5)
    assert live.made == 5 and live.most == 1  # 5,000 rows, 1,024 at a time


def test_more_hits_than_vectors_are_padded_like_faiss(tmp_path):
    index = faiss.IndexFlatIP(4)
    index.add(np.eye(4, dtype=np.float32)[:3])
    faiss.write_index(index, str(tmp_path / "tiny.index"))
    searcher = TorchExactIndex(FlatVectors(tmp_path / "tiny.index"), [CPU, CPU], dtype="fp32")
    query = np.array([[0.25, 1.0, 0.5, 0.0]], dtype=np.float32)  # distinct scores: no ties to order
    scores, rows = searcher.search_vectors(query, 5)
    want_scores, want_rows = index.search(query, 5)
    assert rows.tolist() == want_rows.tolist() == [[1, 2, 0, -1, -1]]
    assert np.isneginf(scores[0, 3:]).all() and scores[0, :3].tolist() == want_scores[0, :3].tolist()


def test_streamed_exact_answers_equal_faiss(flat):
    path, index, queries = flat
    scores, rows = streamed_topk(queries, FlatVectors(path), 10, chunk_rows=700)
    want_scores, want_rows = index.search(queries, 10)
    assert (rows == want_rows).all()
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)


def test_a_shard_that_does_not_fit_is_refused_before_copying(monkeypatch):
    import local_dense_retriever.retrieval.memory_plan as memory_plan

    monkeypatch.setattr(memory_plan, "available_ram", lambda: 2**30)
    with pytest.raises(ValueError, match=r"0\.9 GiB of RAM available but a shard of 1 needs 2\.0 GiB"):
        check_room([CPU], 2 * 2**30, 2**20)


def test_gpu_lists_name_the_missing_gpu():
    assert gpus.parse_gpu_list("--torch_search", "cpu", 0) is None
    assert gpus.parse_gpu_list("--torch_search", "all", 4) == [0, 1, 2, 3]
    assert gpus.parse_gpu_list("--torch_search", "1,3", 4) == [1, 3]
    with pytest.raises(ValueError, match=r"--torch_search 0,4: GPU 4 is not there; this process sees GPUs 0-3"):
        gpus.parse_gpu_list("--torch_search", "0,4", 4)
    with pytest.raises(ValueError, match="GPU 0 is not there; this process sees no GPU"):
        gpus.parse_gpu_list("--torch_search", "0", 0)
    with pytest.raises(ValueError, match="named twice"):
        gpus.parse_gpu_list("--torch_search", "1,1", 4)
    with pytest.raises(ValueError, match="accepted are cpu, all, or GPU ids"):
        gpus.parse_gpu_list("--torch_search", "cuda:0", 4)
    assert parse_devices("cpu") == [CPU]


def test_visible_gpus_follow_cuda_visible_devices(tmp_path, monkeypatch):
    driver = tmp_path / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (driver / bus).mkdir(parents=True)
    monkeypatch.setattr(gpus, "NVIDIA_GPUS", str(driver))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus.visible_gpu_count() == 3
    for value, count in [("1,2", 2), ("", 0), ("2,7,0", 1), ("GPU-abc", 1), ("-1", 0)]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert gpus.visible_gpu_count() == count, value


def test_server_flag_refuses_a_gpu_that_is_not_there_before_loading(small_wiki, capsys, monkeypatch):
    monkeypatch.setattr(gpus, "visible_gpu_count", lambda: 1)
    argv = ["--index_path", str(small_wiki.index_path), "--corpus_path", str(small_wiki.corpus_path),
            "--retriever_model", str(small_wiki.model_dir), "--torch_search", "0,1"]  # fmt: skip
    with pytest.raises(SystemExit):
        parse_config(argv)
    assert "--torch_search 0,1: GPU 1 is not there; this process sees GPUs 0-0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config([*argv[:-2], "--torch_search", "cpu", "--faiss_gpu"])
    assert "--torch_search replaces FAISS" in capsys.readouterr().err


def test_server_with_torch_search_answers_like_the_faiss_server(small_wiki):
    """The same real questions through both servers (fp32 encoder on both): the same hits, scores within 1e-4."""
    questions = [q.question for q in small_wiki.questions[:20]]

    def answers(**overrides) -> list:
        with serve_ready(dense_config(small_wiki, dtype="fp32", **overrides)) as url:
            health = httpx.get(f"{url}/health", timeout=10).json()
            body = {"queries": questions, "topk": 5, "return_scores": True}
            return health["retriever"], httpx.post(f"{url}/retrieve", json=body, timeout=60).json()["result"]

    faiss_description, faiss_hits = answers()
    torch_description, torch_hits = answers(torch_search="cpu")
    assert torch_description.startswith("torch exact inner product (300 x 384, fp32) on CPU")
    assert faiss_description.startswith("faiss IndexFlatIP")
    assert all(same_ranking(a, b) for a, b in zip(torch_hits, faiss_hits, strict=True))
