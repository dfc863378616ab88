"""ASearcher's page access: the pages file read by URL without loading it, POST /access in ASearcher's exact shape,
and the download of ASearcher's files (RLinf's guide command line and ASearcher's clients: test_retriever_peers.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from local_dense_retriever.building import downloads
from local_dense_retriever.retrieval import pages as pages_module
from local_dense_retriever.retrieval.corpus import CorpusFormatError
from local_dense_retriever.retrieval.pages import Pages, url_index_path_for
from local_dense_retriever.serving.app import create_app
from local_dense_retriever.serving.loading import load_resources
from support.loopback import serve_in_thread
from support.retriever_fixtures import dense_config, serve_ready, small_wiki_fixture, wait_ready  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
BIG = "x" * (2 * 1024 * 1024)  # a 2 MB page
PAGES = [
    {"url": "https://en.wikipedia.org/wiki/Paris", "title": "Paris", "contents": "Paris is the capital of France."},
    {"url": "https://en.wikipedia.org/wiki/Big", "title": "Big", "contents": BIG},
    {"url": "https://en.wikipedia.org/wiki/Zürich", "title": "Zürich", "contents": "Zürich — 苏黎世 😀", "rank": 3},
    {"url": "https://en.wikipedia.org/w/index.php?title=Lyon", "contents": "Lyon is a city."},
    {"url": "https://en.wikipedia.org/wiki/Paris", "title": "Paris", "contents": "Paris, the later line."},
]


def write_pages(path: Path, pages=PAGES) -> Path:
    path.write_text("".join(json.dumps(page, ensure_ascii=False) + "\n" for page in pages), encoding="utf-8")
    return path


@pytest.fixture(name="pages_file")
def pages_file_fixture(tmp_path) -> Path:
    return write_pages(tmp_path / "wiki_webpages.jsonl")


# ---- the pages file, by URL ---------------------------------------------------------------------------------------


def test_a_page_is_found_by_its_exact_url_with_every_field(pages_file):
    pages = Pages(pages_file, progress=False)
    assert pages.find("https://en.wikipedia.org/wiki/Zürich") == PAGES[2]
    assert pages.find("https://en.wikipedia.org/wiki/zürich") is None  # exactly: no case folding
    assert pages.find("https://en.wikipedia.org/wiki/Nowhere") is None


def test_index_php_slash_is_rewritten_as_asearcher_does(pages_file):
    pages = Pages(pages_file, progress=False)
    assert pages.find("https://en.wikipedia.org/w/index.php/Lyon") == PAGES[3]


def test_a_url_on_several_lines_is_its_last_line_as_in_asearchers_dict(pages_file):
    assert Pages(pages_file, progress=False).find("https://en.wikipedia.org/wiki/Paris") == PAGES[4]


def test_a_hash_collision_never_returns_another_page(pages_file, monkeypatch):
    monkeypatch.setattr(pages_module, "url_hash", lambda url: 7)  # every URL collides
    url_index_path_for(pages_file).unlink(missing_ok=True)
    pages = Pages(pages_file, progress=False)
    assert pages.find("https://en.wikipedia.org/wiki/Big")["contents"] == BIG
    assert pages.find("https://en.wikipedia.org/wiki/Nowhere") is None


def test_the_url_index_is_on_disk_memory_mapped_and_built_once(pages_file):
    pages = Pages(pages_file, progress=False)
    assert isinstance(pages._index, np.memmap)  # not a dict of the pages: the file can be tens of GB
    sidecar = url_index_path_for(pages_file)
    built = sidecar.stat().st_mtime_ns
    Pages(pages_file, progress=False)
    assert sidecar.stat().st_mtime_ns == built  # reused
    write_pages(pages_file, [*PAGES, {"url": "https://en.wikipedia.org/wiki/Nice", "contents": "Nice."}])
    assert Pages(pages_file, progress=False).find("https://en.wikipedia.org/wiki/Nice") is not None  # rebuilt


def test_a_line_without_a_url_is_named_with_its_file_and_line(tmp_path):
    path = write_pages(tmp_path / "pages.jsonl", [PAGES[0], {"contents": "no url"}])
    with pytest.raises(
        CorpusFormatError, match=r"pages.jsonl:2: expected a page: a JSON object with a string \"url\""
    ):
        Pages(path, progress=False)


# ---- POST /access -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", name="access_server")
def access_server_fixture(small_wiki, tmp_path_factory):
    """The real server over the small wiki, with the test's pages file as --pages_path."""
    pages_path = write_pages(tmp_path_factory.mktemp("pages") / "wiki_webpages.jsonl")
    with serve_ready(dense_config(small_wiki, pages_path=str(pages_path), max_queries_in_flight=4)) as url:
        yield url


def access(url: str, body) -> httpx.Response:
    return httpx.post(f"{url}/access", json=body, timeout=60)


def test_access_answers_one_entry_per_url_in_order_null_for_unknown(access_server):
    urls = ["https://en.wikipedia.org/wiki/Zürich", "https://nowhere.example/", "https://en.wikipedia.org/wiki/Paris"]
    response = access(access_server, {"urls": urls})
    assert response.status_code == 200
    assert response.json() == {"result": [PAGES[2], None, PAGES[4]]}


def test_access_serves_a_2_mb_page_whole_and_rewrites_index_php(access_server):
    result = access(access_server, {"urls": ["https://en.wikipedia.org/wiki/Big"]}).json()["result"]
    assert result[0]["contents"] == BIG
    assert access(access_server, {"urls": ["https://en.wikipedia.org/w/index.php/Lyon"]}).json() == {
        "result": [PAGES[3]]
    }


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"urls": [f"https://a/{i}" for i in range(5)]}, "urls: List should have at most 4 items"),
        ({"urls": "https://a/"}, "urls: Input should be a valid array"),
        ({"urls": [7]}, "urls.0: Input should be a valid string"),
        ({"urls": ["https://a/"], "topk": 3}, "topk: unknown field (accepted fields: urls)"),
    ],
    ids=["too-many", "not-a-list", "not-a-string", "unknown-field"],
)
def test_bad_access_requests_get_a_422_saying_what_is_accepted(access_server, body, problem):
    response = access(access_server, body)
    assert response.status_code == 422
    assert problem in response.json()["detail"]


def test_an_access_answer_over_the_response_cap_is_refused_before_a_page_is_read(small_wiki, tmp_path):
    pages_path = write_pages(tmp_path / "pages.jsonl")
    with serve_ready(dense_config(small_wiki, pages_path=str(pages_path), max_response_mb=1.0)) as url:
        response = access(url, {"urls": ["https://en.wikipedia.org/wiki/Big"]})
        assert response.status_code == 422
        assert "would hold 1 pages" in response.json()["detail"]
        assert "ask for fewer URLs per request" in response.json()["detail"]
        assert access(url, {"urls": ["https://en.wikipedia.org/wiki/Paris"]}).status_code == 200


def test_without_pages_access_is_a_clear_404_and_health_says_so(small_wiki):
    with serve_ready(dense_config(small_wiki, pages_path=None)) as url:
        response = access(url, {"urls": ["https://en.wikipedia.org/wiki/Paris"]})
        assert response.status_code == 404
        assert "start it with --pages_path" in response.json()["detail"]
        assert httpx.get(f"{url}/health").json()["pages"] == {"loaded": False}


def test_health_says_the_pages_are_loaded(access_server):
    pages = httpx.get(f"{access_server}/health").json()["pages"]
    assert pages["loaded"] is True
    assert pages["pages"] == len(PAGES)


def test_the_openapi_document_describes_access(access_server):
    operation = httpx.get(f"{access_server}/openapi.json").json()["paths"]["/access"]["post"]
    assert {"200", "404", "413", "415", "422", "503"} <= set(operation["responses"])
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["urls"]
    assert schema["properties"]["urls"]["maxItems"] == 4


def test_retrieve_returns_every_field_of_a_corpus_line(small_wiki, tmp_path):
    """ASearcher's clients read `url` (and may read anything else) from /retrieve's hits."""
    lines = small_wiki.corpus_path.read_text().splitlines()
    enriched = tmp_path / "corpus.jsonl"
    enriched.write_text(
        "".join(
            json.dumps({**json.loads(line), "title": f"T{i}", "rank": i, "tags": ["a", {"b": None}]}) + "\n"
            for i, line in enumerate(lines)
        )
    )
    config = dense_config(small_wiki, corpus_path=str(enriched), pages_path=None)
    with serve_in_thread(create_app(config, load=lambda report: load_resources(config, report))) as url:
        wait_ready(url)
        question = small_wiki.questions[0].question
        hits = httpx.post(f"{url}/retrieve", json={"queries": [question], "topk": 2}, timeout=60).json()["result"][0]
    for hit in hits:
        assert set(hit) == {"id", "contents", "url", "title", "rank", "tags"}
        assert hit["tags"] == ["a", {"b": None}]


# ---- ASearcher's files from the hub -------------------------------------------------------------------------------


class FakeHub:
    """Serves local bytes the way hf_hub_download and snapshot_download do, and counts what they fetched."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.fetched: list[str] = []

    def fetch(self, repo_id: str, filename: str, save_dir: Path) -> Path:
        assert repo_id == "inclusionAI/ASearcher-Local-Knowledge"
        self.fetched.append(filename)
        (save_dir / filename).write_bytes(self.files[filename])
        return save_dir / filename

    def sizes(self, repo_id: str, filenames: list[str]) -> dict[str, int]:
        return {name: len(self.files[name]) for name in filenames}

    def model(self, repo_id: str, save_dir: Path) -> Path:
        assert repo_id == "intfloat/e5-base-v2"
        self.fetched.append(repo_id)
        (save_dir / "e5-base-v2").mkdir(exist_ok=True)
        return save_dir / "e5-base-v2"


@pytest.fixture(name="asearcher_hub")
def asearcher_hub_fixture() -> FakeHub:
    corpus = "".join(
        json.dumps({"id": str(i), "contents": f'"P{i}"\nText {i}', "url": f"u{i}"}) + "\n" for i in range(9)
    )
    pages = "".join(json.dumps({"url": f"u{i}", "contents": f"Page {i}"}) + "\n" for i in range(9))
    return FakeHub({"wiki_corpus.jsonl": corpus.encode(), "wiki_webpages.jsonl": pages.encode()})


def download(hub: FakeHub, save_dir: Path) -> dict:
    return downloads.download_asearcher(
        save_dir, fetch_fn=hub.fetch, sizes_fn=hub.sizes, model_fn=hub.model, progress=False
    )


def test_asearchers_files_land_in_rlinfs_layout_ready_to_serve(asearcher_hub, tmp_path):
    outputs = download(asearcher_hub, tmp_path)
    assert outputs == {
        "corpus_path": tmp_path / "wiki_corpus.jsonl",
        "pages_path": tmp_path / "wiki_webpages.jsonl",
        "retriever_model": tmp_path / "e5-base-v2",
        "index_path": tmp_path / "e5.index" / "e5_Flat.index",
    }
    assert url_index_path_for(outputs["pages_path"]).exists()  # the server need not index 26 GB at start
    steps = downloads.asearcher_next_steps(outputs)
    assert f"--save_dir {tmp_path / 'e5.index'} --faiss_type Flat" in steps  # builds e5.index/e5_Flat.index
    assert f"--pages_path {outputs['pages_path']} --topk 3 --retriever_name e5" in steps


def test_a_second_download_fetches_only_what_is_missing(asearcher_hub, tmp_path):
    download(asearcher_hub, tmp_path)
    (tmp_path / "wiki_webpages.jsonl").write_bytes(b"cut short")  # an interrupted download
    asearcher_hub.fetched.clear()
    download(asearcher_hub, tmp_path)
    assert asearcher_hub.fetched == ["wiki_webpages.jsonl", "intfloat/e5-base-v2"]


def test_a_file_whose_size_differs_from_the_hubs_is_an_error(asearcher_hub, tmp_path):
    asearcher_hub.sizes = lambda repo_id, names: {name: 1 for name in names}
    with pytest.raises(downloads.DownloadError, match="bytes but the hub says 1"):
        download(asearcher_hub, tmp_path)


def test_the_download_command_names_its_file_sets(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "local_dense_retriever.download", "--save_path", str(tmp_path), "--files", "asearcher",
         "--skip_index"],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 2
    assert "--skip_index, --skip_corpus and --keep_parts are for --files wiki18" in result.stderr
