"""The command lines: builder -> server round trip in real subprocesses, and argument validation."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from uvicorn import server as uvicorn_server

from local_dense_retriever.building import index as index_builder
from local_dense_retriever.building import index_cli
from local_dense_retriever.serving import config as retrieval_server
from local_dense_retriever.retrieval.encoders import TextEncoder
from local_dense_retriever.serving.launcher import PACKAGE_ROOT, SERVER_SCRIPT, ServerProcess, free_port
from local_dense_retriever.demo.mini_wiki import load_summaries, title_of, write_corpus
from support.retriever_fixtures import small_wiki_fixture  # noqa: F401


def test_builder_cli_then_server_script_round_trip(small_wiki, tmp_path):
    summaries = [s for s in load_summaries() if s["title"] in set(small_wiki.titles[:40])]
    corpus = write_corpus(summaries, tmp_path / "corpus.jsonl")
    built = subprocess.run(
        [sys.executable, "local_dense_retriever/index_builder.py", "--corpus_path", str(corpus),
         "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir),
         "--faiss_type", "HNSW16", "--save_dir", str(tmp_path), "--no_progress"],
        cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    index_path = tmp_path / "minilm_HNSW16.index"
    assert f"indexed {len(summaries)} documents into {index_path}" in built.stdout
    flags = ["--index_path", str(index_path), "--corpus_path", str(corpus), "--topk", "2",
             "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir)]  # fmt: skip
    with ServerProcess(flags, log_path=tmp_path / "server.log", program=SERVER_SCRIPT, startup_timeout=120) as server:
        titles = [s["title"] for s in summaries[::4]]
        response = httpx.post(f"{server.url}/retrieve", json={"queries": titles}, timeout=60)
        health = httpx.get(f"{server.url}/health").json()
    assert response.status_code == 200
    result = response.json()["result"]
    assert all(len(hits) == 2 for hits in result)
    assert sum(
        title_of(hits[0]["contents"]) == title for hits, title in zip(result, titles, strict=True)
    ) >= 0.9 * len(titles)
    assert health["config"]["topk"] == 2 and "IndexHNSW" in health["retriever"]
    assert server.process.returncode is not None  # stopped by the context manager


def run_server_cli(flags: list[str], cwd: Path = PACKAGE_ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "local_dense_retriever.retrieval_server", *flags, "--port", str(free_port())],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def _five_documents(wiki, tmp_path: Path) -> list[str]:
    corpus = write_corpus(load_summaries()[:5], tmp_path / "five.jsonl")
    return ["--index_path", str(wiki.index_path), "--corpus_path", str(corpus)]


def _garbage_index(wiki, tmp_path: Path) -> list[str]:
    garbage = tmp_path / "garbage.index"
    garbage.write_bytes(bytes(range(256)) * 4)
    return ["--index_path", str(garbage), "--corpus_path", str(wiki.corpus_path)]


def _eight_dimensional_index(wiki, tmp_path: Path) -> list[str]:
    import faiss

    index = faiss.IndexFlatIP(8)
    index.add(np.random.default_rng(0).normal(size=(len(wiki.titles), 8)).astype(np.float32))
    faiss.write_index(index, str(tmp_path / "eight.index"))
    return ["--index_path", str(tmp_path / "eight.index"), "--corpus_path", str(wiki.corpus_path)]


STARTUP_FAILURES = {
    "corpus and index sizes differ": (_five_documents, "five.jsonl has 5 documents but the index has 300"),
    "unreadable index": (_garbage_index, "garbage.index: cannot read it as a FAISS index: Index type"),
    "index of another dimension": (_eight_dimensional_index, "the index holds 8-d vectors but the encoder"),
}


@pytest.mark.parametrize("case", STARTUP_FAILURES)
def test_a_startup_failure_is_one_clear_line_and_exit_status_1_without_a_traceback(small_wiki, tmp_path, case):
    make_flags, expected = STARTUP_FAILURES[case]
    flags = [
        *make_flags(small_wiki, tmp_path),
        "--retriever_name",
        "minilm",
        "--retriever_model",
        str(small_wiki.model_dir),
    ]
    run = run_server_cli(flags)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "Traceback" not in output
    failures = [line for line in output.splitlines() if "failed to load" in line]
    assert len(failures) == 1, output
    assert expected in failures[0]


def test_a_missing_model_directory_that_looks_like_a_hub_id_is_an_error_at_once_naming_the_path(small_wiki, tmp_path):
    flags = ["--index_path", str(small_wiki.index_path), "--corpus_path", str(small_wiki.corpus_path),
             "--retriever_name", "minilm", "--retriever_model", "models/minilm"]  # fmt: skip
    run = run_server_cli(flags, cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"--retriever_model models/minilm: no such directory ({tmp_path / 'models' / 'minilm'})" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_relative_model_directory_is_found_from_the_working_directory(small_wiki, tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "minilm").symlink_to(small_wiki.model_dir)
    corpus, index = str(small_wiki.corpus_path), str(small_wiki.index_path)
    monkeypatch.chdir(tmp_path)
    argv = ["--index_path", index, "--corpus_path", corpus, "--retriever_model", "models/minilm"]
    config, _ = retrieval_server.parse_config(argv)
    assert config.retriever_model == str((tmp_path / "models" / "minilm").resolve())


def cli_error(parse, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_server_flags_are_checked_before_anything_loads(small_wiki, tmp_path, capsys):
    corpus, index = str(small_wiki.corpus_path), str(small_wiki.index_path)
    parse = retrieval_server.parse_config
    assert "--index_path /nowhere/e5_Flat.index: no such file" in cli_error(
        parse, ["--index_path", "/nowhere/e5_Flat.index", "--corpus_path", corpus], capsys
    )
    assert "--corpus_path /nowhere.jsonl: no such file" in cli_error(
        parse, ["--index_path", index, "--corpus_path", "/nowhere.jsonl"], capsys
    )
    assert "--index_path is required" in cli_error(parse, ["--corpus_path", corpus], capsys)
    assert "--topk must be from 1 to --max_topk (100), got 0" in cli_error(
        parse, ["--index_path", index, "--corpus_path", corpus, "--topk", "0"], capsys
    )
    assert "--retriever_model ./no/such/model: no such directory" in cli_error(
        parse, ["--index_path", index, "--corpus_path", corpus, "--retriever_model", "./no/such/model"], capsys
    )
    assert "exactly one of --qdrant_url and --qdrant_path" in cli_error(
        parse, ["--backend", "qdrant", "--corpus_path", corpus], capsys
    )
    assert "--max_batch_size must be at least 1" in cli_error(
        parse, ["--index_path", index, "--corpus_path", corpus, "--max_batch_size", "0"], capsys
    )


def test_a_hub_id_the_hub_knows_is_passed_on_unchanged(small_wiki, monkeypatch):
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "model_info", lambda repo_id, **kwargs: asked.append(repo_id))
    corpus, index = str(small_wiki.corpus_path), str(small_wiki.index_path)
    argv = ["--index_path", index, "--corpus_path", corpus, "--retriever_model", "intfloat/e5-base-v2"]
    config, args = retrieval_server.parse_config(argv)
    assert args.host == "127.0.0.1" and config.topk == 3 and config.retriever_model == "intfloat/e5-base-v2"
    assert asked == ["intfloat/e5-base-v2"]


def test_builder_flags_are_checked_before_encoding(small_wiki, tmp_path, capsys):
    corpus = str(small_wiki.corpus_path)
    parse = index_cli.parse_config
    assert "is not a valid faiss.index_factory string" in cli_error(
        parse, ["--corpus_path", corpus, "--save_dir", str(tmp_path), "--faiss_type", "Flatt"], capsys
    )
    assert "give --index_path or --save_dir" in cli_error(parse, ["--corpus_path", corpus], capsys)
    assert "--corpus_path /nowhere.jsonl: no such file" in cli_error(
        parse, ["--corpus_path", "/nowhere.jsonl", "--save_dir", str(tmp_path)], capsys
    )
    config = parse(
        ["--corpus_path", corpus, "--save_dir", str(tmp_path), "--retrieval_method", "e5", "--use_fp16",
         "--model_path", str(small_wiki.model_dir)]
    )  # fmt: skip
    assert config.index_path == str(tmp_path / "e5_Flat.index") and config.dtype == "fp16"


def test_builder_reports_a_malformed_corpus_line(small_wiki, tmp_path, capsys):
    corpus = tmp_path / "broken.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"A\\"\\nfine"}\n{"id": "1", "contents": 5}\n')
    argv = ["--corpus_path", str(corpus), "--index_path", str(tmp_path / "x.index"), "--no_progress",
            "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir)]  # fmt: skip
    assert index_cli.main(argv) == 1
    assert "broken.jsonl:2: expected a JSON object with a string" in capsys.readouterr().err
    assert not (tmp_path / "x.index").exists()


def _corpus_with_a_bad_line(tmp_path: Path, bad_line: int, lines: int = 40) -> Path:
    summaries = load_summaries()[:lines]
    corpus = write_corpus(summaries, tmp_path / "broken.jsonl")
    rows = corpus.read_text().splitlines()
    rows[bad_line - 1] = '{"id": "x", "contents": 5}'
    corpus.write_text("\n".join(rows) + "\n")
    return corpus


@pytest.fixture(name="encoded_batches")
def encoded_batches_fixture(monkeypatch) -> list[int]:
    """Sizes of the chunks the builder encodes (the real encoder runs)."""
    sizes: list[int] = []
    real = TextEncoder.encode_passages

    def counting(self, texts, on_batch=None):
        sizes.append(len(texts))
        return real(self, texts, on_batch)

    monkeypatch.setattr(TextEncoder, "encode_passages", counting)
    return sizes


def builder_argv(wiki, corpus: Path, *extra: str) -> list[str]:
    return ["--corpus_path", str(corpus), "--retriever_name", "minilm", "--retriever_model", str(wiki.model_dir),
            "--no_progress", "--chunk_size", "8", *extra]  # fmt: skip


def test_a_bad_corpus_line_is_found_before_anything_is_encoded_and_no_embeddings_file_is_left(
    small_wiki, tmp_path, capsys, encoded_batches
):
    corpus = _corpus_with_a_bad_line(tmp_path, bad_line=35)
    saved = tmp_path / "embeddings.npy"
    argv = builder_argv(small_wiki, corpus, "--index_path", str(tmp_path / "x.index"), "--save_embeddings", str(saved))
    assert index_cli.main(argv) == 1
    assert "broken.jsonl:35: expected a JSON object with a string" in capsys.readouterr().err
    assert encoded_batches == []  # the corpus is checked whole before its first chunk of 8 is encoded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.jsonl", "broken.jsonl.offsets.npy"]


def test_a_build_that_fails_while_encoding_leaves_no_embeddings_file(small_wiki, tmp_path, monkeypatch, capsys):
    corpus = write_corpus(load_summaries()[:40], tmp_path / "corpus.jsonl")
    saved = tmp_path / "embeddings.npy"
    real, calls = TextEncoder.encode_passages, []

    def failing_on_the_third_chunk(self, texts, **options):
        calls.append(len(texts))
        if len(calls) == 3:
            raise ValueError("the GPU fell off the bus")
        return real(self, texts, **options)

    monkeypatch.setattr(TextEncoder, "encode_passages", failing_on_the_third_chunk)
    argv = builder_argv(small_wiki, corpus, "--index_path", str(tmp_path / "x.index"), "--save_embeddings", str(saved))
    assert index_cli.main(argv) == 1
    assert "the GPU fell off the bus" in capsys.readouterr().err
    assert not saved.exists() and not (tmp_path / "embeddings.npy.partial").exists()
    assert not (tmp_path / "x.index").exists()


def test_saved_embeddings_with_rows_never_written_are_refused_and_no_index_is_written(small_wiki, tmp_path, capsys):
    embeddings = np.load(small_wiki.embeddings_path)
    embeddings[200:] = 0.0  # rows a writer that preallocated the file and stopped early never wrote
    incomplete = tmp_path / "incomplete.npy"
    np.save(incomplete, embeddings)
    index = tmp_path / "x.index"
    argv = ["--corpus_path", str(small_wiki.corpus_path), "--index_path", str(index), "--no_progress",
            "--embeddings_path", str(incomplete)]  # fmt: skip
    assert index_cli.main(argv) == 1
    error = capsys.readouterr().err
    assert f"--embeddings_path {incomplete}: row 200 (and 99 more" in error and "all zeros" in error
    assert not index.exists()


@pytest.mark.parametrize("flag", ["--save_dir", "--save_embeddings"])
def test_an_output_location_that_cannot_be_written_is_found_before_the_encoder_loads(
    small_wiki, tmp_path, capsys, monkeypatch, flag
):
    loaded = []
    monkeypatch.setattr(index_builder, "load_encoder", lambda config: loaded.append(config) or 1 / 0)
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    corpus = write_corpus(load_summaries()[:10], tmp_path / "corpus.jsonl")
    outputs = {"--save_dir": str(tmp_path / "indexes"), "--save_embeddings": str(tmp_path / "embeddings.npy")}
    outputs[flag] = str(a_file / "out" / ("x.npy" if flag == "--save_embeddings" else ""))
    argv = builder_argv(small_wiki, corpus, *[part for item in outputs.items() for part in item])
    assert index_cli.main(argv) == 1
    error = capsys.readouterr().err
    assert f"cannot write {a_file / 'out'}" in error and "Not a directory" in error
    assert loaded == []


@pytest.mark.parametrize("sig", uvicorn_server.HANDLED_SIGNALS, ids=lambda sig: signal.Signals(sig).name)
def test_the_address_file_is_removed_on_every_signal_uvicorn_handles(small_wiki, tmp_path, sig):
    """ASearcher's clients pick any Host*_IP*.txt they find: one left by a stopped server sends them to a dead port.
    uvicorn shuts down on each of its signals, then raises it again (SIGTERM's default action ends the process
    there and then), so the file must be gone by then, whichever signal it was."""
    address_dir = tmp_path / "address"
    flags = ["--index_path", str(small_wiki.index_path), "--corpus_path", str(small_wiki.corpus_path),
             "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir),
             "--port", "0", "--save-address-to", str(address_dir)]  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "local_dense_retriever.retrieval_server", *flags],
        cwd=PACKAGE_ROOT,
        env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    log = []
    try:
        for line in server.stderr:  # until it says it wrote the file; the end of its output if it never does
            log.append(line)
            if "address written to" in line:
                break
        written = sorted(address_dir.iterdir())
        assert len(written) == 1 and written[0].read_text().startswith("127.0.0.1:"), "".join(log)
        server.send_signal(sig)
        log.append(server.communicate(timeout=120)[1])  # reads the rest of its output until it exits
    finally:
        if server.poll() is None:  # only when the test failed above
            server.kill()
            server.wait()
    assert not written[0].exists(), f"{written[0].name} left behind after {signal.Signals(sig).name}:\n{''.join(log)}"
