"""The search clients against loopback servers: retries, load spreading, result shapes, concurrency, Google."""

import asyncio
import copy
import gc
import json
import threading

import aiohttp
import pytest

from slime_search_r1 import http_client
from slime_search_r1.http_client import RequestFailed, close_loop_sessions, loop_session, post_json
from google_search_server import PAGE_MAX_BYTES, google_search
from slime_search_r1.registry import SEARCH_BACKENDS
from slime_search_r1.search import google
from slime_search_r1.tools import search as search_tool
from slime_search_r1.tools.search import LocalRetrieverClient, SearchError, hit_document, search
from slime_search_r1.settings.sources import resolve_config, search_r1_configs
from support.fake_retriever import FakeRetriever
from support.fake_serper import FakeSerper
from support.loopback import free_port, serve_in_thread


@pytest.fixture
def two_retrievers():
    first, second = FakeRetriever(), FakeRetriever()
    with serve_in_thread(first.app) as url1, serve_in_thread(second.app) as url2:
        first.url, second.url = url1, url2
        yield first, second


def client_for(*urls, attempts=3, timeout=2.0):
    return LocalRetrieverClient(tuple(u + "/retrieve" for u in urls), timeout=timeout, max_attempts=attempts)


def contents(hits) -> list[str]:
    """The passage texts of hits in any server shape (or of documents from search())."""
    return [hit_document(hit)["contents"] for hit in hits]


@pytest.mark.parametrize("scores_shape", [True, False])
async def test_both_result_shapes(retriever, scores_shape):
    retriever.scores_shape = scores_shape
    found = contents(await client_for(retriever.url).search("capital of France", 2))
    assert found[0].startswith('"Paris"\nParis is the capital')
    assert len(found) == 2
    assert retriever.bodies[-1] == {"queries": ["capital of France"], "topk": 2, "return_scores": False}


async def test_load_is_spread_over_servers(two_retrievers):
    first, second = two_retrievers
    client = client_for(first.url, second.url)
    await asyncio.gather(*(client.search(f"query {i}", 3) for i in range(40)))
    assert first.requests == 20
    assert second.requests == 20


async def test_a_retry_moves_to_the_next_server(two_retrievers):
    first, second = two_retrievers
    first.down = True
    client = client_for(first.url, second.url)
    for i in range(6):
        assert await client.search(f"river {i}", 1)
    assert second.requests == 6


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_429_and_5xx_are_retried(retriever, status):
    retriever.fail_next(2, status)
    assert await client_for(retriever.url).search("Everest", 1)
    assert retriever.requests == 3


async def test_retries_are_bounded(retriever):
    retriever.down = True
    with pytest.raises(RequestFailed, match="HTTP 503"):
        await client_for(retriever.url, attempts=3).search("Everest", 1)
    assert retriever.requests == 3


async def test_4xx_is_not_retried(retriever):
    retriever.fail_next(5, 400)
    with pytest.raises(RequestFailed, match="rejected the request with HTTP 400"):
        await client_for(retriever.url).search("Everest", 1)
    assert retriever.requests == 1


async def test_connection_refused_fails_after_retries():
    with pytest.raises(RequestFailed, match="ClientConnectorError"):
        await client_for(f"http://127.0.0.1:{free_port()}", attempts=2).search("x", 1)


async def test_timeouts_are_retried_then_fail(retriever):
    retriever.latency_s = 1.0
    with pytest.raises(RequestFailed, match="TimeoutError"):
        await client_for(retriever.url, attempts=2, timeout=0.2).search("x", 1)
    assert retriever.requests == 2


async def test_malformed_answer_is_a_clear_error(retriever):
    retriever.docs = [{"id": "0", "text_only": "no contents"}]
    with pytest.raises(SearchError, match=r"a retrieval hit has no 'contents' \(keys: \['id', 'text_only'\]\)"):
        await search(local_config(retriever.url, SEARCH_R1_TOPK="1"), "x")


async def test_one_session_per_event_loop():
    made = []
    first = loop_session("probe", lambda: made.append(1) or __import__("aiohttp").ClientSession())
    second = loop_session("probe", lambda: made.append(1) or __import__("aiohttp").ClientSession())
    assert first is second
    assert len(made) == 1
    await close_loop_sessions()


async def test_search_concurrency_bounds_requests_in_flight(retriever, monkeypatch):
    retriever.together = 4  # the first four wait for each other: the bound is reached however slow the machine
    monkeypatch.setattr(search_tool, "SEARCH_CONCURRENCY", 4)
    env = {"RETRIEVAL_SERVER_URL": retriever.url}
    config = resolve_config(search_r1_configs({}, env))
    results = await asyncio.gather(*(search(config, f"Paris {i}") for i in range(40)))
    assert len(results) == 40
    assert retriever.max_in_flight == 4


# ---- Google (serper.dev) -----------------------------------------------------------------------------------

LATIN1_PAGE = (
    "<html><head><title>Café</title><script>var x = 'not text';</script></head><body>"
    "<p>Intro paragraph that is not relevant at all.</p>"
    "<p>Le café de Flore est un café parisien situé au coin du boulevard Saint-Germain.</p>"
    "</body></html>"
).encode("latin-1")
RESULTS = [
    {
        "title": "Café de Flore",
        "link": "PAGE/pages/flore",
        "snippet": "Le café de Flore est un café parisien situé au coin du boulevard Saint-Germain ... short",
    },
    {"title": "Missing page", "link": "PAGE/pages/none", "snippet": "This snippet has more than five words in it."},
    {"title": "", "snippet": ""},
]


@pytest.fixture
def serper(monkeypatch):
    """A stand-in serper.dev, where the google backend sends its searches."""
    # a copy: the links below are rewritten to this test's server, which stops with the test
    fake = FakeSerper("test-key-123", copy.deepcopy(RESULTS), {"flore": (LATIN1_PAGE, "text/html")})
    with serve_in_thread(fake.app) as url:
        fake.url = url
        monkeypatch.setattr(google, "SERPER_URL", url + "/search")
        for item in fake.results:
            if "link" in item:
                item["link"] = item["link"].replace("PAGE", url)
        yield fake


async def test_google_snippets(serper):
    hits = await google_search("test-key-123", "cafe de flore", 3, search_url=serper.url + "/search")
    assert serper.requests[-1] == {"q": "cafe de flore", "num": 3, "gl": "us", "hl": "en"}
    assert hits[0] == {
        "document": {
            "contents": '"Café de Flore"\nLe café de Flore est un café parisien situé au coin du boulevard '
            "Saint-Germain",
            "url": serper.url + "/pages/flore",  # shown to the model only when the access tool is enabled
        }
    }
    assert len(hits) == 2  # the item with neither title nor snippet is dropped


async def test_google_fetched_pages_are_decoded_and_cut_to_the_snippet_paragraph(serper):
    hits = await google_search(
        "test-key-123", "cafe", 3, snippet_only=False, search_url=serper.url + "/search", fetch_concurrency=2
    )
    assert "flore" in serper.pages_served  # decoded from the fetched page, not the snippet fallback
    flore = hits[0]["document"]["contents"]
    assert flore.startswith('"Café de Flore"\nLe café de Flore est un café parisien')
    assert "Intro paragraph" not in flore
    assert "not text" not in flore
    assert hits[1]["document"]["contents"] == '"Missing page"\nThis snippet has more than five words in it.'


async def test_google_errors_never_show_the_key(serper):
    with pytest.raises(RequestFailed) as info:
        await google_search("wrong-key-999", "x", 3, search_url=serper.url + "/search")
    assert "403" in str(info.value)
    assert "wrong-key-999" not in str(info.value)
    serper.failures_left = 2
    assert await google_search("test-key-123", "x", 3, search_url=serper.url + "/search")


async def test_google_backend_through_the_config(serper):
    env = {"SEARCH_BACKEND": "google", "GOOGLE_API_KEY": "test-key-123"}
    config = resolve_config(search_r1_configs({}, env))
    found = contents(await search(config, "cafe"))
    assert found[0].startswith('"Café de Flore"')
    assert serper.seen_keys[-1] == "test-key-123"


# ---- Whatever a backend answers, a search ends in contents or SearchError ---------------------------------

NESTED_JSON = b'{"result": [' + b"[" * 5000 + b"]" * 5000 + b"]}"


def local_config(url: str, **env):
    env = {"RETRIEVAL_SERVER_URL": url, "SEARCH_R1_SEARCH_ATTEMPTS": "1", **env}
    return resolve_config(search_r1_configs({}, env))


def google_config(**env):
    """The google backend's settings; its searches go to the `serper` fixture's server."""
    env = {"SEARCH_BACKEND": "google", "GOOGLE_API_KEY": "test-key-123", **env}
    return resolve_config(search_r1_configs({}, env))


async def test_a_retriever_answering_deeply_nested_json_is_a_search_error(retriever):
    retriever.raw_answer = (NESTED_JSON, 200)
    with pytest.raises(SearchError, match="nested too deeply"):
        await search(local_config(retriever.url), "Paris")


async def test_serper_answering_deeply_nested_json_is_a_search_error(serper):
    serper.raw_answer = (b'{"organic": ' + b"[" * 5000 + b"]" * 5000 + b"}", 200)
    with pytest.raises(SearchError, match="nested too deeply"):
        await search(google_config(), "cafe")


async def test_serper_items_whose_fields_are_not_text_are_read_as_missing(serper):
    serper.results[:] = [
        {"title": "Only a title", "snippet": {"a": 1}, "link": 7},
        {"title": ["not", "text"], "snippet": "This snippet has more than five words in it.", "link": None},
    ]
    expected = ['"Only a title"\nNo snippet available.', '"No title."\nThis snippet has more than five words in it.']
    for snippet_only in ("true", "false"):
        config = google_config(GOOGLE_SNIPPET_ONLY=snippet_only)
        assert contents(await search(config, "x")) == expected


async def test_any_unexpected_exception_from_a_backend_becomes_a_search_error(retriever, monkeypatch):
    async def broken(*_args):
        raise KeyError("a parser bug")

    monkeypatch.setitem(SEARCH_BACKENDS._entries, "local", broken)
    with pytest.raises(SearchError, match="KeyError: 'a parser bug'"):
        await search(local_config(retriever.url), "Paris")


async def test_cancellation_still_propagates_through_search(retriever, monkeypatch):
    async def cancelled(*_args):
        raise asyncio.CancelledError

    monkeypatch.setitem(SEARCH_BACKENDS._entries, "local", cancelled)
    with pytest.raises(asyncio.CancelledError):
        await search(local_config(retriever.url), "Paris")


async def test_a_page_the_html_parser_cannot_parse_falls_back_to_the_snippet(serper):
    serper.pages["flore"] = (b"<html><body><p>Le caf\xc3\xa9 de Flore</p><![ x", "text/html; charset=utf-8")
    hits = await google_search("test-key-123", "cafe", 3, snippet_only=False, search_url=serper.url + "/search")
    assert "flore" in serper.pages_served
    assert hits[0]["document"]["contents"] == (
        '"Café de Flore"\nLe café de Flore est un café parisien situé au coin du boulevard Saint-Germain'
    )


async def test_a_fetched_page_is_read_only_up_to_the_page_limit(serper):
    paragraph = "<p>Le café de Flore est un café parisien situé au coin du boulevard Saint-Germain, à Paris.</p>"
    filler = "<p>" + "filler words " * (PAGE_MAX_BYTES // 12) + "</p>"
    serper.pages["flore"] = ((filler + paragraph).encode(), "text/html; charset=utf-8")
    hits = await google_search("test-key-123", "cafe", 3, snippet_only=False, search_url=serper.url + "/search")
    assert "flore" in serper.pages_served
    assert "à Paris" not in hits[0]["document"]["contents"]  # past the limit: the snippet is used
    serper.pages["flore"] = ((paragraph + filler).encode(), "text/html; charset=utf-8")
    hits = await google_search("test-key-123", "cafe", 3, snippet_only=False, search_url=serper.url + "/search")
    assert hits[0]["document"]["contents"].endswith("Saint-Germain, à Paris.")


# ---- What a search answer may weigh --------------------------------------------------------------------------


async def test_hits_beyond_topk_are_dropped(retriever):
    retriever.docs = [{"id": str(i), "contents": f'"Doc {i}"\nParis text {i}'} for i in range(50)]
    retriever.answer_topk = 50
    found = contents(await search(local_config(retriever.url, SEARCH_R1_TOPK="3"), "Paris"))
    assert found == [f'"Doc {i}"\nParis text {i}' for i in range(3)]


@pytest.mark.parametrize("streamed", [False, True], ids=["with-content-length", "streamed"])
async def test_an_answer_over_the_size_limit_is_refused(retriever, streamed):
    hit = {"contents": '"Big"\n' + "x" * 1000}
    retriever.raw_answer = (json.dumps({"result": [[hit] * 20_000]}).encode(), 200)  # ~20 MB
    retriever.stream_answer = streamed
    with pytest.raises(RequestFailed, match=r"answered more than \d+ bytes"):
        await client_for(retriever.url).search("Paris", 3)


async def test_a_large_answer_within_the_limit_is_read(retriever):
    hits = [{"contents": f'"Long {i}"\n' + "y" * 40_000} for i in range(3)]
    retriever.raw_answer = (json.dumps({"result": [hits]}).encode(), 200)
    found = contents(await client_for(retriever.url).search("Paris", 3))
    assert [len(c) for c in found] == [len(h["contents"]) for h in hits]


async def test_post_json_without_a_limit_reads_any_size(retriever):
    # the engine client calls post_json without max_body_bytes: a long /generate answer is legitimate
    retriever.raw_answer = (json.dumps({"output_ids": list(range(1_500_000))}).encode(), 200)  # ~11 MB
    async with aiohttp.ClientSession() as session:
        body = await post_json(session, retriever.url + "/retrieve", {"queries": ["x"]}, 30.0)
    assert len(body["output_ids"]) == 1_500_000


@pytest.mark.parametrize("status", [500, 503, 400, 422])
async def test_an_error_answer_keeps_the_server_detail(retriever, status):
    retriever.raw_answer = (json.dumps({"detail": "FAISS index not loaded " + "z" * 5000}).encode(), status)
    with pytest.raises(RequestFailed) as info:
        await client_for(retriever.url, attempts=1).search("Paris", 3)
    message = str(info.value)
    assert f"HTTP {status}" in message
    assert "FAISS index not loaded" in message
    assert len(message) < 500  # the detail is cut (300 characters)


async def test_search_error_names_the_server_detail_of_a_5xx(retriever):
    retriever.down = True
    with pytest.raises(SearchError, match='HTTP 503: {"detail":"down"}'):
        await search(local_config(retriever.url), "Paris")


async def test_a_serper_error_that_echoes_the_key_does_not_show_it(serper):
    serper.raw_answer = (b'{"message": "bad key test-key-123 for this plan"}', 402)
    with pytest.raises(SearchError) as info:
        await search(google_config(), "cafe")
    assert "HTTP 402" in str(info.value)
    assert "bad key" in str(info.value)
    assert "test-key-123" not in str(info.value)


# ---- Pooled sessions end with their loop ------------------------------------------------------------------------


async def _post_twice(url: str) -> aiohttp.ClientSession:
    session = loop_session("closing-probe", lambda: aiohttp.ClientSession())
    for _ in range(2):  # keeps a pooled connection open
        await post_json(session, url + "/retrieve", {"queries": ["Paris"], "topk": 1}, 10.0)
    return session


def test_a_loop_run_by_asyncio_run_closes_its_sessions_when_it_ends(retriever, caplog):
    """asyncio.run() ends its loop; a session it left open logged "Unclosed client session" and every pooled
    connection when it was collected (a script that runs generate() twice printed hundreds of such lines)."""
    first = asyncio.run(_post_twice(retriever.url))
    second = asyncio.run(_post_twice(retriever.url))  # a new loop drops the first loop's state
    gc.collect()
    assert first.closed
    assert second.closed
    assert [r.getMessage() for r in caplog.records if "Unclosed" in r.getMessage()] == []


def test_a_loop_that_never_ends_has_its_sessions_closed_at_exit(retriever):
    """slime runs rollouts on one loop that runs forever on a daemon thread: its sessions close at process exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        session = asyncio.run_coroutine_threadsafe(_post_twice(retriever.url), loop).result(timeout=30)
        assert not session.closed
        http_client._close_at_exit()  # what atexit runs
        assert session.closed
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
