"""The index tuner: candidate layouts from a built Flat index, recall against its exact answers, the real server's
figures, the recommendation, and its bad-input refusals."""

import json

import faiss
import numpy as np
import pytest

from local_dense_retriever.building import tuner_candidates, tuner_cli
from local_dense_retriever.building.index_cli import main as build_main
from local_dense_retriever.building.tuner import TuneConfig, tune
from local_dense_retriever.building.tuner_candidates import expand
from local_dense_retriever.building.tuner_measures import recall_at
from local_dense_retriever.building.tuner_report import Row, recommend, write_report
from support.retriever_fixtures import small_wiki_fixture  # noqa: F401


def config_for(wiki, tmp_path, **overrides) -> TuneConfig:
    settings = dict(
        index_path=str(wiki.index_path),
        corpus_path=str(wiki.corpus_path),
        retriever_name="minilm",
        retriever_model=str(wiki.model_dir),
        num_queries=60,
        out_dir=str(tmp_path / "tuning"),
        serve="none",
        progress=False,
    )
    settings.update(overrides)
    return TuneConfig(**settings)


def row(layout: str, recall3: float, qps: float | None, size: int, search_qps: float = 100.0) -> Row:
    return Row(layout, {"1": recall3, "3": recall3, "10": recall3}, search_qps, size, 0.0, qps=qps)


def test_recall_counts_the_exact_rows_found():
    exact = np.array([[1, 2, 3], [4, 5, 6]])
    assert recall_at(np.array([[1, 2, 3], [4, 5, 6]]), exact, 3) == 1.0
    assert recall_at(np.array([[3, 9, 1], [6, 7, 8]]), exact, 3) == pytest.approx(0.5)  # 2/3 and 1/3
    assert recall_at(np.array([[2, 1, 9], [4, 9, 9]]), exact, 1) == 0.5  # order within top-1 matters


def test_the_recommendation_is_the_fewest_bytes_among_the_fastest_that_keep_recall():
    rows = [
        row("Flat", 1.0, 100.0, 10_000),
        row("HNSW32:efSearch=256", 0.999, 400.0, 11_000),
        row("HNSW32,SQ8:efSearch=256", 0.995, 390.0, 4_000),  # within 5% of the fastest, a third of the bytes
        row("IVF64,PQ16:nprobe=64", 0.90, 450.0, 500),  # fastest and smallest, but below the threshold
        row("IVF64,SQ8:nprobe=8", 0.992, 200.0, 3_000),  # smaller still, but half as fast
    ]
    assert recommend(rows, 0.99).layout == "HNSW32,SQ8:efSearch=256"
    assert recommend(rows, 0.998).layout == "HNSW32:efSearch=256"
    assert recommend(rows, 1.0).layout == "Flat"  # exact: the only row that keeps every row
    assert recommend(rows[1:], 1.0) is None
    unserved = [row("A", 0.995, None, 100, search_qps=1000.0), row("B", 0.995, None, 50, search_qps=500.0)]
    assert recommend(unserved, 0.99).layout == "A"  # without server figures, in-process speed decides


def test_flat_is_recommended_when_it_is_the_fastest_and_no_layout_as_fast_is_smaller():
    """The mini-wiki's table: Flat 2,256 q/s at 14.7 MiB, HNSW32 623 q/s at 17.3 MiB; Flat is the answer."""
    mib = 2**20
    table = [
        row("Flat", 1.0, None, int(14.7 * mib), search_qps=2256.0),
        row("HNSW32:efSearch=128", 0.995, None, int(17.3 * mib), search_qps=623.0),
        row("HNSW32,SQ8:efSearch=128", 0.991, None, int(5.2 * mib), search_qps=540.0),
        row("IVF400,Flat:nprobe=32", 0.993, None, int(14.9 * mib), search_qps=2200.0),  # as fast, but larger
    ]
    assert recommend(table, 0.99).layout == "Flat"
    smaller_and_as_fast = [*table, row("IVF400,SQ8:nprobe=32", 0.992, None, int(4.0 * mib), search_qps=2150.0)]
    assert recommend(smaller_and_as_fast, 0.99).layout == "IVF400,SQ8:nprobe=32"  # within 5% of Flat, smaller
    served = [row("Flat", 1.0, 300.0, 10 * mib, search_qps=10.0), row("HNSW32", 0.995, 200.0, 12 * mib, 5000.0)]
    assert recommend(served, 0.99).layout == "Flat"  # the server's QPS decides when every row has it
    # Saved embeddings: Flat's speed is the exact pass over the file, not a Flat index's: it is left out.
    assert recommend(table, 0.99, flat_comparable=False).layout == "IVF400,Flat:nprobe=32"


def test_a_tuning_where_flat_wins_names_the_flat_index_keeps_no_other_file_and_logs_no_none(
    small_wiki, tmp_path, monkeypatch, caplog
):
    from local_dense_retriever.building import tuner

    monkeypatch.setattr(tuner, "flat_search_qps", lambda index_path, queries: 1e9)  # Flat far the fastest
    caplog.set_level("INFO", logger="local_dense_retriever.tuner")
    report = tune(config_for(small_wiki, tmp_path, candidates=["HNSW8:efSearch=16", "IVF4,Flat:nprobe=4"]))
    assert report.recommended == "Flat" and report.index_file == str(small_wiki.index_path)
    assert list((tmp_path / "tuning").glob("*.index")) == []  # the candidates' files are gone
    markdown, _ = write_report(report, tmp_path / "tuning", "cmd")
    text = markdown.read_text()
    assert "| Flat **(recommended)** |" in text
    assert "Recommended: **Flat** (exact;" in text and f"Keep serving `--index_path {small_wiki.index_path}`" in text
    logged = [record.getMessage() for record in caplog.records if record.name == "local_dense_retriever.tuner"]
    assert any(message.startswith("HNSW8:efSearch=16: recall@3 ") for message in logged), logged
    assert all("not served" in message and "None" not in message for message in logged), logged


def test_candidate_grids_expand_and_bad_ones_name_what_is_accepted():
    assert [str(layout) for layout in expand("HNSW32,SQ8:efSearch=64/128")] == [
        "HNSW32,SQ8:efSearch=64",
        "HNSW32,SQ8:efSearch=128",
    ]
    assert tuner_candidates.default_candidates(1_000_000, 384)[3:] == [
        "IVF4096,Flat:nprobe=16/64/256",
        "IVF4096,SQ8:nprobe=16/64/256",
        "IVF4096,PQ96:nprobe=16/64/256",
    ]
    with pytest.raises(ValueError, match="nprobe does not apply to HNSW32"):
        expand("HNSW32:nprobe=4/8")


def test_ef_construction_is_a_build_parameter_of_the_family_not_a_search_one():
    family = expand("HNSW32,SQ8:efConstruction=200,efSearch=64/128")
    assert [layout.spec for layout in family] == [
        "HNSW32,SQ8:efConstruction=200,efSearch=64",
        "HNSW32,SQ8:efConstruction=200,efSearch=128",
    ]
    assert [(layout.params, layout.ef_construction) for layout in family] == [
        ("efSearch=64", 200),
        ("efSearch=128", 200),
    ]
    assert {layout.built_as for layout in family} == {"HNSW32,SQ8:efConstruction=200"}
    assert expand("HNSW16:efSearch=8")[0].built_as == "HNSW16"
    with pytest.raises(ValueError, match="efConstruction does not apply to IVF64,Flat"):
        expand("IVF64,Flat:efConstruction=100,nprobe=4")
    with pytest.raises(ValueError, match="one parameter may list several values"):
        expand("HNSW32:efConstruction=40/80,efSearch=64/128")


def test_a_family_built_with_ef_construction_carries_it_and_its_search_parameters(small_wiki):
    from local_dense_retriever.building.layouts import build_layout
    from local_dense_retriever.retrieval.index_files import FlatVectors
    from local_dense_retriever.retrieval.layouts import parse_layout

    built = build_layout(FlatVectors(str(small_wiki.index_path)), parse_layout("HNSW8:efConstruction=64,efSearch=16"),
                         progress=False)  # fmt: skip
    hnsw = faiss.downcast_index(built.index).hnsw
    assert (hnsw.efConstruction, hnsw.efSearch, built.index.ntotal) == (64, 16, 300)
    default = build_layout(FlatVectors(str(small_wiki.index_path)), parse_layout("HNSW8"), progress=False)
    assert faiss.downcast_index(default.index).hnsw.efConstruction == 40  # FAISS's own default, left alone


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2", "nan", "high"])
def test_a_threshold_outside_0_1_is_refused_in_one_line(small_wiki, capsys, value):
    with pytest.raises(SystemExit):
        tuner_cli.parse_config(["--index_path", str(small_wiki.index_path), "--corpus_path",
                                str(small_wiki.corpus_path), "--retriever_model", str(small_wiki.model_dir),
                                "--threshold", value])  # fmt: skip
    assert f"--threshold: {value}: accepted is a recall in (0, 1]" in capsys.readouterr().err


def test_an_index_that_is_not_flat_is_refused(small_wiki, tmp_path, capsys):
    hnsw = tmp_path / "x.index"
    faiss.write_index(faiss.IndexHNSWFlat(8, 4), str(hnsw))
    with pytest.raises(SystemExit):
        tuner_cli.parse_config(["--index_path", str(hnsw), "--corpus_path", str(small_wiki.corpus_path),
                                "--retriever_model", str(small_wiki.model_dir)])  # fmt: skip
    assert "accepted is a Flat FAISS index or a .npy of embeddings" in capsys.readouterr().err


def test_an_index_of_another_dimension_than_the_encoder_is_refused(small_wiki, tmp_path):
    other = tmp_path / "other_Flat.index"
    index = faiss.IndexFlatIP(16)
    index.add(np.random.default_rng(0).normal(size=(300, 16)).astype(np.float32))
    faiss.write_index(index, str(other))
    with pytest.raises(ValueError, match=r"holds 16-d vectors but --retriever_model produces 384-d ones"):
        tune(config_for(small_wiki, tmp_path, index_path=str(other), candidates=["HNSW8"]))


def test_a_candidate_that_does_not_fit_in_ram_is_refused_before_building(small_wiki, tmp_path, monkeypatch):
    monkeypatch.setattr(tuner_candidates, "available_ram", lambda: 100_000)  # bytes: the 300 x 384 HNSW needs ~500 kB
    with pytest.raises(
        ValueError, match=r"--candidates: layout HNSW8 needs 0\.5 MiB of RAM to build and 0\.1 MiB is available"
    ):
        tune(config_for(small_wiki, tmp_path, candidates=["HNSW8"]))


def test_tuning_measures_recall_against_flat_and_keeps_the_recommended_index(small_wiki, tmp_path, monkeypatch):
    """IVF with every list probed is exact (recall 1); one list of four cannot be; the kept file carries nprobe.
    Flat is made slow here, so an approximate layout is the choice on this small corpus."""
    from local_dense_retriever.building import tuner

    monkeypatch.setattr(tuner, "flat_search_qps", lambda index_path, queries: 1e-3)
    config = config_for(small_wiki, tmp_path, candidates=["IVF4,Flat:nprobe=1/4", "HNSW8,SQ8:efSearch=4"])
    report = tune(config)
    rows = {r.layout: r for r in report.rows}
    assert list(rows) == ["Flat", "IVF4,Flat:nprobe=1", "IVF4,Flat:nprobe=4", "HNSW8,SQ8:efSearch=4"]
    assert rows["IVF4,Flat:nprobe=4"].recall == {"1": 1.0, "3": 1.0, "10": 1.0}
    assert rows["IVF4,Flat:nprobe=1"].recall_at_3 < 0.99
    assert all(r.index_bytes > 0 and r.search_qps > 0 for r in report.rows)
    assert report.recommended in ("IVF4,Flat:nprobe=4", "HNSW8,SQ8:efSearch=4")
    assert rows[report.recommended].recall_at_3 >= 0.99
    assert "the first 12 words of 60 passages" in report.queries
    kept = faiss.read_index(report.index_file)
    assert kept.ntotal == 300 and sorted(p.name for p in (tmp_path / "tuning").glob("*.index")) == [
        f"minilm_{report.recommended.split(':')[0].replace(',', '_')}.index"
    ]  # the other candidates' files are gone
    if report.recommended.startswith("IVF"):
        assert faiss.extract_index_ivf(kept).nprobe == 4
    markdown, data = write_report(report, tmp_path / "tuning", "cmd")
    assert f"| {report.recommended} **(recommended)** |" in markdown.read_text()
    assert json.loads(data.read_text())["recommended"] == report.recommended


def test_the_builder_builds_the_recommended_layout_from_the_flat_index(small_wiki, tmp_path):
    out = tmp_path / "ivf.index"
    assert build_main(["--corpus_path", str(small_wiki.corpus_path), "--from_index", str(small_wiki.index_path),
                       "--faiss_type", "IVF4,Flat", "--faiss_search_params", "nprobe=4", "--index_path", str(out),
                       "--no_progress"]) == 0  # fmt: skip
    built, flat = faiss.read_index(str(out)), faiss.read_index(str(small_wiki.index_path))
    assert faiss.extract_index_ivf(built).nprobe == 4
    vectors = flat.reconstruct_n(0, flat.ntotal)
    assert (built.search(vectors[:40], 3)[1] == flat.search(vectors[:40], 3)[1]).all()  # every list probed: exact


def test_the_builder_writes_an_hnsw_graph_built_with_the_given_breadth(small_wiki, tmp_path, capsys):
    out = tmp_path / "hnsw.index"
    common = [
        "--corpus_path",
        str(small_wiki.corpus_path),
        "--from_index",
        str(small_wiki.index_path),
        "--no_progress",
    ]
    assert build_main([*common, "--faiss_type", "HNSW8", "--hnsw_ef_construction", "80",
                       "--faiss_search_params", "efSearch=32", "--index_path", str(out)]) == 0  # fmt: skip
    hnsw = faiss.downcast_index(faiss.read_index(str(out))).hnsw
    assert (hnsw.efConstruction, hnsw.efSearch) == (80, 32)
    flat = faiss.read_index(str(small_wiki.index_path))
    np.save(tmp_path / "emb.npy", flat.reconstruct_n(0, flat.ntotal))  # the other path: saved embeddings
    assert build_main([*common[:2], "--embeddings_path", str(tmp_path / "emb.npy"), "--faiss_type", "HNSW8",
                       "--hnsw_ef_construction", "72", "--index_path", str(out), "--overwrite",
                       "--no_progress"]) == 0  # fmt: skip
    assert faiss.downcast_index(faiss.read_index(str(out))).hnsw.efConstruction == 72
    for bad in (["--faiss_type", "IVF4,Flat", "--hnsw_ef_construction", "80"], ["--faiss_type", "HNSW8",
                "--hnsw_ef_construction", "0"]):  # fmt: skip
        with pytest.raises(SystemExit):
            build_main([*common, *bad, "--index_path", str(tmp_path / "bad.index")])
        err = capsys.readouterr().err
        assert "--hnsw_ef_construction" in err and "accepted is an integer >= 1 with an HNSW --faiss_type" in err
        assert not (tmp_path / "bad.index").exists()


@pytest.mark.slow
def test_layouts_are_measured_through_the_real_server_with_questions_from_a_file(small_wiki, tmp_path):
    questions = tmp_path / "train.jsonl"
    questions.write_text("".join(json.dumps({"question": q.question}) + "\n" for q in small_wiki.questions))
    config = config_for(small_wiki, tmp_path, candidates=["HNSW8:efSearch=32"], serve="all",
                        queries_path=str(questions), clients=8, seconds=1.0, warmup=0.5)  # fmt: skip
    report = tune(config)
    flat, hnsw = report.rows
    assert report.queries == f"{len(small_wiki.questions)} questions of {questions}"
    for measured in (flat, hnsw):
        assert measured.qps > 0 and measured.single_ms > 0 and measured.errors == 0 and measured.server_rss_mb > 0
    assert report.server_precision in ("fp32", "bf16", "int8")


def test_gpu_candidates_are_refused_where_no_gpu_is_visible(small_wiki, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="--candidates torch-\\* all: no GPU is visible here"):
        tune(config_for(small_wiki, tmp_path, candidates=["torch-fp16"]))
    with pytest.raises(ValueError, match="accepted GPU candidates are torch-fp16, torch-bf16, torch-fp32"):
        tune(config_for(small_wiki, tmp_path, candidates=["faiss-gpu-fp16"]))


def test_gpu_rows_report_recall_and_shard_bytes_and_are_not_recommended(small_wiki, tmp_path, monkeypatch):
    """The GPU path on CPU torch (the devices are the only difference): exact rows, the shard's bytes, and the
    recommendation stays a CPU layout."""
    import torch

    from local_dense_retriever.retrieval import torch_search

    from local_dense_retriever.building import tuner

    monkeypatch.setattr(torch_search, "parse_devices", lambda value, flag="": [torch.device("cpu")] * 2)
    monkeypatch.setattr(tuner, "flat_search_qps", lambda index_path, queries: 1e-3)  # Flat slow: a CPU layout wins
    report = tune(config_for(small_wiki, tmp_path, candidates=["torch-fp32", "IVF4,Flat:nprobe=4"]))
    rows = {r.layout: r for r in report.rows}
    assert rows["torch-fp32"].recall == {"1": 1.0, "3": 1.0, "10": 1.0}
    assert rows["torch-fp32"].gpu_bytes == 150 * 384 * 4 and rows["torch-fp32"].index_bytes == 0
    assert report.recommended == "IVF4,Flat:nprobe=4"
