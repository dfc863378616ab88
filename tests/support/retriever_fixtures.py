"""Shared, cached fixtures for the retriever tests: a few hundred real Wikipedia summaries, MiniLM and FAISS.

The small corpus holds the evidence pages of the first FanOutQA sub-questions plus a deterministic spread of
other summaries, so relevance can be checked against real questions. Its MiniLM Flat index and embeddings
are built once with the real index builder and cached in .cache/test-retriever (rebuilt when their content changes).
"""

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from local_dense_retriever.demo import embedded_default, mini_wiki
from local_dense_retriever.serving.app import create_app
from local_dense_retriever.serving.config import ServerConfig
from support.loopback import serve_in_thread

CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "test-retriever"
EVIDENCE_QUESTIONS = 60
CORPUS_SIZE = 300
RETRIEVER_NAME = "minilm"


@dataclass(frozen=True)
class SmallWiki:
    corpus_path: Path
    pages_path: Path  # the same articles by URL (POST /access)
    index_path: Path
    embeddings_path: Path
    model_dir: Path
    questions: list  # mini_wiki.EvalQuestion whose evidence page is in this corpus
    titles: list[str]  # row order


def _select_summaries() -> tuple[list[dict], list]:
    summaries = mini_wiki.load_summaries()
    by_title = {summary["title"]: summary for summary in summaries}
    questions = mini_wiki.fanoutqa_questions(set(by_title))[:EVIDENCE_QUESTIONS]
    chosen = list(dict.fromkeys(q.evidence_title for q in questions))
    stride = len(summaries) // CORPUS_SIZE
    for summary in summaries[::stride]:
        if len(chosen) == CORPUS_SIZE:
            break
        if summary["title"] not in chosen:
            chosen.append(summary["title"])
    return [by_title[title] for title in chosen], questions


def build_small_wiki(cache_dir: Path = CACHE_DIR) -> SmallWiki:
    summaries, questions = _select_summaries()
    assets = embedded_default.prepare(cache_dir, progress=False, summaries=summaries)
    titles = [summary["title"] for summary in summaries]
    return SmallWiki(assets.corpus_path, assets.pages_path, assets.index_path, assets.embeddings_path,
                     assets.model_dir, questions, titles)  # fmt: skip


# Fixtures carry a `name=` so test modules can import them without their parameters shadowing the import.
@pytest.fixture(scope="session", name="small_wiki")
def small_wiki_fixture() -> SmallWiki:
    return build_small_wiki()


def dense_config(wiki: SmallWiki, **overrides) -> ServerConfig:
    settings = dict(
        index_path=str(wiki.index_path),
        corpus_path=str(wiki.corpus_path),
        pages_path=str(wiki.pages_path),
        retriever_name=RETRIEVER_NAME,
        retriever_model=str(wiki.model_dir),
        topk=3,
    )
    settings.update(overrides)
    return ServerConfig(**settings)


def wait_ready(url: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = httpx.get(f"{url}/health", timeout=5)
        if response.status_code == 200:
            return response.json()
        if response.json().get("status") == "failed":
            raise RuntimeError(f"the server failed to load: {response.json()}")
        time.sleep(0.05)
    raise TimeoutError(f"{url} was not ready within {timeout} s")


@contextlib.contextmanager
def serve_ready(config: ServerConfig) -> Iterator[str]:
    """The real app under uvicorn on loopback; yields its URL once /health says ok."""
    with serve_in_thread(create_app(config)) as url:
        wait_ready(url)
        yield url


@pytest.fixture(scope="session", name="dense_server")
def dense_server_fixture(small_wiki: SmallWiki):
    with serve_ready(dense_config(small_wiki)) as url:
        yield url
