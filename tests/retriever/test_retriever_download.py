"""Everything download.py does after the network, with local files standing in for the hub."""

import gzip
import json
from pathlib import Path

import pytest

from local_dense_retriever.building import downloads
from local_dense_retriever.retrieval.corpus import Corpus, offsets_path_for


class FakeHub:
    """Serves local bytes the way hf_hub_download does (a file in save_dir) and counts the fetches."""

    def __init__(self, files: dict[str, bytes], reported_sizes: dict[str, int] | None = None):
        self.files = files
        self.reported_sizes = reported_sizes or {name: len(data) for name, data in files.items()}
        self.fetched: list[str] = []

    def fetch(self, repo_id: str, filename: str, save_dir: Path) -> Path:
        self.fetched.append(filename)
        path = save_dir / filename
        path.write_bytes(self.files[filename])
        return path

    def sizes(self, repo_id: str, filenames: list[str]) -> dict[str, int]:
        assert repo_id in (downloads.INDEX_REPO, downloads.CORPUS_REPO)
        return {name: self.reported_sizes[name] for name in filenames}


def corpus_bytes(n: int) -> bytes:
    lines = [json.dumps({"id": str(i), "contents": f'"Page {i}"\nBody {i}'}) for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture(name="hub")
def hub_fixture() -> FakeHub:
    return FakeHub(
        {
            "part_aa": b"FAISS-index-first-half-" * 100,
            "part_ab": b"second-half" * 37,
            "wiki-18.jsonl.gz": gzip.compress(corpus_bytes(25)),
        }
    )


def test_parts_are_merged_checked_and_the_corpus_is_ready_to_serve(tmp_path, hub):
    outputs = downloads.download_wiki18(tmp_path, fetch_fn=hub.fetch, sizes_fn=hub.sizes, progress=False)
    index = outputs["index_path"]
    assert index == tmp_path / "e5_Flat.index"
    assert index.read_bytes() == hub.files["part_aa"] + hub.files["part_ab"]
    corpus_path = outputs["corpus_path"]
    assert corpus_path == tmp_path / "wiki-18.jsonl" and corpus_path.read_bytes() == corpus_bytes(25)
    assert offsets_path_for(corpus_path).exists()
    assert Corpus(corpus_path, progress=False)[24]["contents"] == '"Page 24"\nBody 24'
    # Parts and archive are removed once their output is verified (like `cat` + `gzip -d`).
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "e5_Flat.index",
        "wiki-18.jsonl",
        "wiki-18.jsonl.offsets.npy",
    ]


def test_a_second_run_skips_finished_steps(tmp_path, hub):
    downloads.download_wiki18(tmp_path, fetch_fn=hub.fetch, sizes_fn=hub.sizes, progress=False)
    hub.fetched.clear()
    downloads.download_wiki18(tmp_path, fetch_fn=hub.fetch, sizes_fn=hub.sizes, progress=False)
    assert hub.fetched == []


def test_keep_parts_keeps_the_downloads(tmp_path, hub):
    downloads.download_wiki18(tmp_path, keep_parts=True, fetch_fn=hub.fetch, sizes_fn=hub.sizes, progress=False)
    assert {"part_aa", "part_ab", "wiki-18.jsonl.gz"} <= {p.name for p in tmp_path.iterdir()}


def test_a_part_of_the_wrong_size_stops_before_merging(tmp_path, hub):
    hub.reported_sizes["part_ab"] += 1
    with pytest.raises(downloads.DownloadError, match="part_ab has 407 bytes but the hub says 408"):
        downloads.download_wiki18(tmp_path, corpus=False, fetch_fn=hub.fetch, sizes_fn=hub.sizes, progress=False)
    assert not (tmp_path / "e5_Flat.index").exists()


def test_an_interrupted_merge_is_redone(tmp_path, hub):
    (tmp_path / "e5_Flat.index").write_bytes(b"truncated")
    (tmp_path / "e5_Flat.index.partial").write_bytes(b"junk from a crash")
    outputs = downloads.download_wiki18(tmp_path, corpus=False, fetch_fn=hub.fetch, sizes_fn=hub.sizes, progress=False)
    assert outputs["index_path"].read_bytes() == hub.files["part_aa"] + hub.files["part_ab"]
    assert not (tmp_path / "e5_Flat.index.partial").exists()


def test_merge_parts_concatenates_in_order(tmp_path):
    parts = []
    for i, data in enumerate([b"a" * 10, b"", b"bc" * 1000]):
        parts.append(tmp_path / f"part_{i}")
        parts[-1].write_bytes(data)
    merged = downloads.merge_parts(parts, tmp_path / "out", progress=False)
    assert merged.read_bytes() == b"a" * 10 + b"bc" * 1000


def test_not_enough_disk_space_is_reported(tmp_path, monkeypatch):
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(downloads.shutil, "disk_usage", lambda _: usage._replace(free=5))
    part = tmp_path / "p"
    part.write_bytes(b"x" * 100)
    with pytest.raises(downloads.DownloadError, match="needs 0.0 GB .* only 0.0 GB are free"):
        downloads.merge_parts([part], tmp_path / "out", progress=False)


def test_cli_needs_something_to_do(capsys):
    with pytest.raises(SystemExit) as exit_info:
        downloads.main(["--save_path", "x", "--skip_index", "--skip_corpus"])
    assert exit_info.value.code == 2
    assert "leave nothing to do" in capsys.readouterr().err


def test_an_unwritable_save_path_is_one_error_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert downloads.main(["--save_path", str(blocker / "wiki18")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith(f"error: cannot write to {blocker / 'wiki18'}")


def test_an_unreachable_hub_is_one_error_line(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    from support.loopback import free_port

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert downloads.main(["--save_path", str(tmp_path), "--skip_corpus"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith(f"error: cannot get the file sizes of {downloads.INDEX_REPO} from the Hugging Face hub")


def test_a_hub_error_while_fetching_is_a_download_error(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    def not_found(**_kwargs):
        raise EntryNotFoundError("404 Client Error.\n\nEntry Not Found for url: https://huggingface.co/x")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", not_found)
    with pytest.raises(
        downloads.DownloadError, match=r"cannot get part_aa of .* EntryNotFoundError: 404 Client Error\.$"
    ):
        downloads.fetch(downloads.INDEX_REPO, "part_aa", tmp_path)
