"""Corpus access through the memory-mapped byte-offset sidecar."""

import gzip
import json
import os

import numpy as np
import pytest

from local_dense_retriever.retrieval.corpus import (
    Corpus,
    CorpusFormatError,
    count_documents,
    ensure_decompressed,
    iter_documents,
    offsets_path_for,
)


def write_lines(path, documents, trailer=b"\n"):
    path.write_bytes(b"\n".join(json.dumps(doc).encode() for doc in documents) + trailer)
    return path


def documents(n):
    return [{"id": str(i), "contents": f'"Title {i}"\ntext with ünïcode {i} ' + "x" * (i % 7)} for i in range(n)]


def test_lookup_by_row_returns_each_line(tmp_path):
    docs = documents(50)
    corpus = Corpus(write_lines(tmp_path / "c.jsonl", docs), progress=False)
    assert len(corpus) == 50
    assert [corpus[i] for i in range(50)] == docs
    assert corpus.get_many([49, 0, 7]) == [docs[49], docs[0], docs[7]]
    with pytest.raises(IndexError):
        corpus[50]


def test_lookups_read_the_mapped_offsets_as_a_plain_array_not_through_numpy_memmap(tmp_path):
    corpus = Corpus(write_lines(tmp_path / "c.jsonl", documents(5)), progress=False)
    assert type(corpus._bounds) is np.ndarray  # memmap's per-lookup hooks cost more than the lookup
    assert isinstance(corpus._bounds.base, np.memmap)  # still the mapped file, not a copy in memory
    assert corpus.lines_bytes([0, 4]) == len(corpus.line(0)) + len(corpus.line(4))


def test_sidecar_is_built_once_and_reused(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", documents(10))
    Corpus(path, progress=False)
    sidecar = offsets_path_for(path)
    stamp = sidecar.stat().st_mtime_ns
    assert len(Corpus(path, progress=False)) == 10
    assert sidecar.stat().st_mtime_ns == stamp  # not rewritten
    stored = np.load(sidecar)
    assert int(stored[-1]) == path.stat().st_size and len(stored) == 12  # 10 starts, end, size stamp


def test_sidecar_is_rebuilt_when_the_corpus_changes(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", documents(10))
    assert len(Corpus(path, progress=False)) == 10
    write_lines(path, documents(12))
    os.utime(path, ns=(offsets_path_for(path).stat().st_mtime_ns + 10**9,) * 2)
    corpus = Corpus(path, progress=False)
    assert len(corpus) == 12 and corpus[11] == documents(12)[11]


def test_no_final_newline_and_trailing_blank_lines(tmp_path):
    docs = documents(3)
    assert [Corpus(write_lines(tmp_path / "a.jsonl", docs, b""), progress=False)[i] for i in range(3)] == docs
    assert len(Corpus(write_lines(tmp_path / "b.jsonl", docs, b"\n\n  \n"), progress=False)) == 3


def test_gzip_corpus_is_decompressed_once(tmp_path):
    docs = documents(20)
    raw = write_lines(tmp_path / "tmp.jsonl", docs).read_bytes()
    archive = tmp_path / "wiki.jsonl.gz"
    archive.write_bytes(gzip.compress(raw))
    corpus = Corpus(archive, progress=False)
    assert corpus.path == tmp_path / "wiki.jsonl" and corpus.path.read_bytes() == raw
    assert corpus[19] == docs[19]
    stamp = corpus.path.stat().st_mtime_ns
    assert ensure_decompressed(archive, progress=False) == corpus.path
    assert corpus.path.stat().st_mtime_ns == stamp
    assert not (tmp_path / "wiki.jsonl.partial").exists()


def test_malformed_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "0", "contents": "fine"}\n{"id": "1", "contents": \n["not", "an", "object"]\n')
    corpus = Corpus(path, progress=False)
    with pytest.raises(CorpusFormatError, match=r"bad\.jsonl:2: not valid JSON"):
        corpus[1]
    with pytest.raises(CorpusFormatError, match=r'bad\.jsonl:3: expected a JSON object with a string "contents"'):
        corpus[2]
    with pytest.raises(CorpusFormatError, match=r"bad\.jsonl:2"):
        list(iter_documents(path))


def test_a_bad_first_line_fails_at_open(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "0", "text": "no contents field"}\n')
    with pytest.raises(CorpusFormatError, match=r"bad\.jsonl:1"):
        Corpus(path, progress=False)


def test_blank_line_inside_the_corpus_is_reported(tmp_path):
    path = tmp_path / "gap.jsonl"
    path.write_text('{"id": "0", "contents": "a"}\n\n{"id": "1", "contents": "b"}\n')
    with pytest.raises(CorpusFormatError, match=r"gap\.jsonl:2: blank line before line 3"):
        list(iter_documents(path))


def test_empty_corpus_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    assert count_documents(path, progress=False) == 0
    with pytest.raises(CorpusFormatError, match="no documents"):
        Corpus(path, progress=False)


def test_offsets_cross_read_blocks(tmp_path, monkeypatch):
    import local_dense_retriever.retrieval.corpus as corpus_module

    monkeypatch.setattr(corpus_module, "_BLOCK_BYTES", 64)  # lines straddle many block boundaries
    docs = documents(200)
    corpus = Corpus(write_lines(tmp_path / "c.jsonl", docs), progress=False)
    assert [corpus[i] for i in range(0, 200, 13)] == docs[::13]
