"""The command lines: builder -> server round trip in real subprocesses, and argument validation."""

import subprocess
import sys

import httpx
import pytest

from local_dense_retriever import index_builder, retrieval_server
from local_dense_retriever.launcher import PACKAGE_ROOT, SERVER_SCRIPT, ServerProcess
from local_dense_retriever.mini_wiki import load_summaries, title_of, write_corpus
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


def test_server_exits_1_when_corpus_and_index_disagree(small_wiki, tmp_path):
    corpus = write_corpus(load_summaries()[:5], tmp_path / "five.jsonl")
    flags = ["--index_path", str(small_wiki.index_path), "--corpus_path", str(corpus),
             "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir)]  # fmt: skip
    server = ServerProcess(flags, log_path=tmp_path / "server.log", startup_timeout=120)
    with pytest.raises(RuntimeError, match="exited with code 1"):
        server.start()
    assert f"has 5 documents but the index has {len(small_wiki.titles)}" in server.log_tail()


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
    config, args = parse(["--index_path", index, "--corpus_path", corpus, "--retriever_model", "intfloat/e5-base-v2"])
    assert args.host == "127.0.0.1" and config.topk == 3 and config.retriever_model == "intfloat/e5-base-v2"


def test_builder_flags_are_checked_before_encoding(small_wiki, tmp_path, capsys):
    corpus = str(small_wiki.corpus_path)
    parse = index_builder.parse_config
    assert "is not a valid faiss.index_factory string" in cli_error(
        parse, ["--corpus_path", corpus, "--save_dir", str(tmp_path), "--faiss_type", "Flatt"], capsys
    )
    assert "give --index_path or --save_dir" in cli_error(parse, ["--corpus_path", corpus], capsys)
    assert "--corpus_path /nowhere.jsonl: no such file" in cli_error(
        parse, ["--corpus_path", "/nowhere.jsonl", "--save_dir", str(tmp_path)], capsys
    )
    config = parse(["--corpus_path", corpus, "--save_dir", str(tmp_path), "--retrieval_method", "e5", "--use_fp16"])
    assert config.index_path == str(tmp_path / "e5_Flat.index") and config.dtype == "fp16"


def test_builder_reports_a_malformed_corpus_line(small_wiki, tmp_path, capsys):
    corpus = tmp_path / "broken.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"A\\"\\nfine"}\n{"id": "1", "contents": 5}\n')
    argv = ["--corpus_path", str(corpus), "--index_path", str(tmp_path / "x.index"), "--no_progress",
            "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir)]  # fmt: skip
    assert index_builder.main(argv) == 1
    assert "broken.jsonl:2: expected a JSON object with a string" in capsys.readouterr().err
    assert not (tmp_path / "x.index").exists()
