"""Layouts by name, what they cost in bytes (checked against indexes FAISS writes), and the memory plan that
refuses a layout that cannot fit beside training, with the figures in its one-line message."""

import subprocess
import sys

import faiss
import numpy as np
import pytest

from local_dense_retriever.building.layouts import build_layout, write_index
from local_dense_retriever.retrieval.index_files import FlatVectors, check_dimension, read_header
from local_dense_retriever.retrieval.index_layout import layout_name
from local_dense_retriever.retrieval.layouts import default_nlist, default_pq, index_bytes, parse_layout
from local_dense_retriever.retrieval.memory_plan import (
    GIB,
    MemoryPlanError,
    main,
    markdown_table,
    plan_and_check,
    plan_memory,
)


@pytest.fixture(scope="module", name="flat_file")
def flat_file_fixture(tmp_path_factory):
    vectors = np.random.default_rng(0).normal(size=(6000, 48)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(48)
    index.add(vectors)
    path = tmp_path_factory.mktemp("flat") / "x_Flat.index"
    faiss.write_index(index, str(path))
    return path, vectors


@pytest.mark.parametrize(
    "spec",
    [
        "Flat",
        "HNSW8",
        "HNSW16,SQ8",
        "IVF32,Flat",
        "IVF32,SQ8",
        "IVF32,SQfp16",
        "IVF32,PQ12x4",
    ],  # PQ 8-bit: 40 s to train
)
def test_byte_model_matches_what_faiss_writes(flat_file, tmp_path, spec):
    path, vectors = flat_file
    layout = parse_layout(spec)
    built = build_layout(FlatVectors(path), layout, train_cap=6000, progress=False)
    written = write_index(built.index, tmp_path / "layout.index")
    assert built.index.ntotal == len(vectors)
    assert abs(written - index_bytes(layout.factory, len(vectors), 48)) / written < 0.03, (written, spec)


def test_layouts_keep_row_order_and_their_search_parameters(flat_file):
    path, vectors = flat_file
    built = build_layout(FlatVectors(path), parse_layout("IVF32,Flat:nprobe=32"), progress=False)
    assert faiss.extract_index_ivf(built.index).nprobe == 32
    _, rows = built.index.search(vectors[:50], 1)  # every list probed: exact, so each vector finds itself
    assert rows[:, 0].tolist() == list(range(50))


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("HNSW32:nprobe=4", "nprobe does not apply to HNSW32"),
        ("IVF64,Flat:efSearch=4", "efSearch does not apply"),
        ("HNSW32:efSearch=0", "N >= 1"),
        ("LSH", "accepted are Flat, HNSW"),
        ("torch-fp16:efSearch=3", "GPU layouts take no search parameters"),
    ],
)
def test_bad_layout_specs_name_what_is_accepted(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_layout(spec)


def test_ivf_and_pq_defaults_follow_the_corpus():
    assert default_nlist(21_015_324) == 16384 and default_nlist(1_000_000) == 4096
    assert default_nlist(300) == 4  # at most size / 39 lists
    assert default_pq(768) == 192 and default_pq(384) == 96 and 768 % default_pq(768) == 0


def test_gpu_plan_splits_the_vectors_and_adds_workspace_encoder_and_context():
    one, eight = plan_memory("torch-fp16", 21_015_324, 768, gpus=1), plan_memory("torch-fp16", 21_015_324, 768, 8)
    assert one.gpu_parts["vectors"] == 21_015_324 * 768 * 2
    assert eight.gpu_parts["vectors"] == -(-21_015_324 // 8) * 768 * 2
    assert one.gpu_bytes == sum(one.gpu_parts.values()) and one.gpu_bytes - eight.gpu_bytes == (
        one.gpu_parts["vectors"] - eight.gpu_parts["vectors"]
    )
    faiss_gpu = plan_memory("faiss-gpu-fp16", 21_015_324, 768, 8)
    assert faiss_gpu.ram_bytes == 21_015_324 * 768 * 4  # FAISS reads the whole CPU index before cloning
    assert one.ram_bytes < GIB  # torch streams the vectors from the memory-mapped file


def test_a_gpu_layout_that_does_not_fit_beside_training_is_refused_with_its_figures():
    with pytest.raises(MemoryPlanError) as refused:
        plan_and_check("torch-fp16", 21_015_324, 768, gpus=1, gpu_total_bytes=80 * GIB,
                       sglang_mem_fraction_static=0.7, trainer_bytes=6 * GIB)  # fmt: skip
    message = str(refused.value)
    assert "\n" not in message
    assert "--layout torch-fp16 over 1 GPU(s) needs 31.9 GiB per GPU" in message
    assert "80.0 GiB x (1 - 0.7 SGLang static fraction) - 6.0 GiB trainer - 1.0 GiB reserve = 17.0 GiB" in message
    assert "accepted: 2 or more GPUs" in message
    fits = plan_and_check("torch-fp16", 21_015_324, 768, gpus=2, gpu_total_bytes=80 * GIB,
                          sglang_mem_fraction_static=0.7, trainer_bytes=6 * GIB)  # fmt: skip
    assert fits.gpu_bytes < 17 * GIB


def test_a_cpu_layout_larger_than_the_ram_is_refused_and_mmap_flat_is_not():
    with pytest.raises(MemoryPlanError, match=r"--layout HNSW32 needs 65\.9 GiB of RAM .* but 32\.0 GiB"):
        plan_and_check("HNSW32", 21_015_324, 768, ram_available=32 * GIB)
    assert plan_and_check("Flat", 21_015_324, 768, ram_available=32 * GIB, mmap=True).ram_bytes < GIB
    with pytest.raises(MemoryPlanError, match="accepted for --gpus: 0"):
        plan_memory("HNSW32", 1000, 768, gpus=2)
    with pytest.raises(MemoryPlanError, match=r"accepted is a fraction in \[0, 1\)"):
        plan_and_check("torch-fp16", 1000, 768, gpus=1, sglang_mem_fraction_static=1.5)


def test_cli_prints_the_plan_or_one_error_line(capsys):
    assert main(["--corpus_size", "21015324", "--layout", "torch-fp16", "--gpus", "8", "--gpu_gib", "80",
                 "--sglang_mem_fraction_static", "0.7", "--trainer_gib", "6", "--ram_gib", "64"]) == 0  # fmt: skip
    assert "per GPU over 8: 5.5 GiB" in capsys.readouterr().out
    assert main(["--corpus_size", "21015324", "--layout", "torch-fp16", "--gpus", "1", "--gpu_gib", "80",
                 "--sglang_mem_fraction_static", "0.7", "--ram_gib", "64"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("error: --layout torch-fp16 over 1 GPU(s) needs") and err.count("\n") == 1


def test_cli_reads_size_and_dimension_from_an_index_header(flat_file, capsys):
    path, _ = flat_file
    assert main(["--index_path", str(path), "--layout", "Flat", "--ram_gib", "1", "--json"]) == 0
    assert '"corpus_size": 6000, "dim": 48' in capsys.readouterr().out


def test_the_documented_table_has_every_layout_on_1_2_4_8_gpus():
    table = markdown_table(21_015_324, 768).splitlines()
    assert table[0].count("GPU(s)") == 4
    rows = {line.split(" | ")[0].strip("| "): line for line in table[2:]}
    assert set(rows) >= {
        "Flat",
        "HNSW32",
        "HNSW32,SQ8",
        "IVF16384,SQ8",
        "IVF16384,PQ192",
        "torch-fp16",
        "faiss-gpu-fp16",
    }
    assert rows["torch-fp16"].endswith("| 31.9 GiB | 16.8 GiB | 9.3 GiB | 5.5 GiB |")


def test_module_runs_as_a_command():
    result = subprocess.run(
        [sys.executable, "-m", "local_dense_retriever.memory_plan", "--corpus_size", "1000", "--layout", "HNSW32,SQ9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "layout 'HNSW32,SQ9': accepted are" in result.stderr


def test_index_dimension_is_checked_from_the_header_alone(tmp_path):
    """Only the 16-byte header is read: a file that is nothing else is enough to refuse a mismatched encoder."""
    fake = tmp_path / "huge_Flat.index"
    fake.write_bytes(b"IxFI" + np.int32(768).tobytes() + np.int64(21_015_324).tobytes())
    header = read_header(fake)
    assert (header.dim, header.size, header.is_flat) == (768, 21_015_324, True)
    with pytest.raises(ValueError, match=r"holds 768-d vectors but the encoder .* produces 384-d ones"):
        check_dimension(fake, 384)
    check_dimension(fake, 768)
    other = tmp_path / "not_an_index"
    other.write_bytes(b"this is not a FAISS index")
    assert read_header(other) is None  # not read as a header: FAISS's reader reports such a file itself
    check_dimension(other, 384)


@pytest.mark.parametrize(
    "spec",
    ["Flat", "HNSW8", "HNSW16,SQ8", "HNSW8,SQfp16", "IVF4,Flat", "IVF4,SQ8", "IVF4,PQ4x4"],
)
def test_an_index_file_s_layout_is_read_as_the_memory_plan_names_it(tmp_path, spec):
    """From the file's own fields (the graph and the coarse quantizer are skipped, not read): the names the memory
    plan and the tuner use, not FAISS's type codes (IHNf, IwSq, ...)."""
    vectors = np.random.default_rng(0).random((300, 16), dtype=np.float32)
    index = faiss.index_factory(16, spec, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    path = tmp_path / "x.index"
    faiss.write_index(index, str(path))
    assert layout_name(path) == spec
    (tmp_path / "cut.index").write_bytes(path.read_bytes()[:60])
    assert layout_name(tmp_path / "cut.index") in (None, "Flat")  # a file cut short names no layout it lacks


def test_the_server_refuses_an_index_larger_than_the_ram_available(flat_file, monkeypatch):
    import local_dense_retriever.retrieval.memory_plan as memory_plan
    from local_dense_retriever.serving.loading import check_ram_for_index

    path, _ = flat_file
    check_ram_for_index(str(path))
    monkeypatch.setattr(memory_plan, "available_ram", lambda: 2**20)
    with pytest.raises(
        ValueError, match=r"x_Flat.index is 1\.1 MiB but 1\.0 MiB of RAM is available; accepted: a layout"
    ):
        check_ram_for_index(str(path))
