"""One retry policy for the judge, search and engine clients (http_client.retrying): a server's Retry-After (seconds
or an HTTP date) is obeyed up to RETRY_AFTER_MAX_S, else each client's own backoff; an abort ends a long wait.

The waits are recorded instead of slept (the `waits` fixture), so nothing here waits on the clock."""

import asyncio
import email.utils
import time

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from slime_search_r1 import http_client
from slime_search_r1.http_client import RETRY_AFTER_MAX_S, RequestFailed, close_loop_sessions, retry_after_seconds
from slime_search_r1.scoring.judge import JudgeClient, JudgeConfig
from slime_search_r1.search.google import google_search
from slime_search_r1.tokens import engine
from slime_search_r1.tools.search import LocalRetrieverClient
from support.fake_serper import FakeSerper
from support.loopback import serve_in_thread


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The waits between attempts, in seconds, recorded instead of slept."""
    recorded = []

    async def pause(seconds, give_up=None):
        recorded.append(seconds)

    monkeypatch.setattr(http_client, "pause", pause)
    return recorded


def http_date(unix_time: float) -> str:
    return email.utils.formatdate(unix_time, usegmt=True)


@pytest.fixture
def local_time_not_gmt(monkeypatch):
    """A local time zone 8 hours off GMT, so that a date read as local time would be off."""
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_retry_after_is_read_as_seconds_or_an_http_date(local_time_not_gmt):
    now = 1_700_000_000
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(" 2.5 ") == 2.5
    assert retry_after_seconds(http_date(now + 7), now=now) == 7.0
    assert retry_after_seconds(http_date(now - 7), now=now) == 0.0  # a date gone by: at once
    assert retry_after_seconds(http_date(now + 7).replace("GMT", "-0000"), now=now) == 7.0  # GMT under any name
    assert retry_after_seconds("-4") == 0.0
    for unreadable in (None, "", "soon", "nan", "inf", "Mon, 99 Foo 2024"):
        assert retry_after_seconds(unreadable) is None, unreadable


async def test_a_rate_limited_judge_is_asked_again_after_its_retry_after(judge_server, waits):
    judge_server.failures = {1: "http429", 2: "http429", 3: "http429"}
    judge_server.retry_after = "3"
    judge = JudgeClient(JudgeConfig(url=judge_server.url, model="m", attempts=4))
    verdict = await judge.judge("Capital of France?", ["Paris"], "Paris")
    await close_loop_sessions()
    assert (verdict.status, verdict.attempts) == ("correct", 4)
    assert waits == [3.0, 3.0, 3.0]


async def test_a_retry_after_date_is_waited_for_and_a_long_one_is_bounded(judge_server, waits):
    judge = JudgeClient(JudgeConfig(url=judge_server.url, model="m", attempts=2))
    judge_server.failures = {1: "http429"}
    judge_server.retry_after = http_date(time.time() + 30)
    assert (await judge.judge("q", ["Paris"], "Paris")).status == "correct"
    judge_server.failures = {3: "http429"}
    judge_server.retry_after = "3600"
    assert (await judge.judge("q", ["Paris"], "Paris")).status == "correct"
    await close_loop_sessions()
    assert 20 < waits[0] <= 30  # the date has a 1 s resolution; the request took a moment
    assert waits[1] == RETRY_AFTER_MAX_S


async def test_without_retry_after_the_judge_backs_off_as_configured(judge_server, waits):
    judge_server.failures = {1: "http429", 2: "http500"}
    judge = JudgeClient(JudgeConfig(url=judge_server.url, model="m", attempts=3, backoff=0.5))
    assert (await judge.judge("q", ["Paris"], "Paris")).status == "correct"
    await close_loop_sessions()
    assert len(waits) == 2 and 0 <= waits[0] <= 0.5 and 0 <= waits[1] <= 1.0


async def test_the_local_retriever_client_obeys_retry_after(retriever, waits):
    retriever.fail_next(2, 503, retry_after="2")
    client = LocalRetrieverClient((retriever.url + "/retrieve",), timeout=5.0, max_attempts=3)
    assert await client.search("Everest", 1)
    assert waits == [2.0, 2.0]


async def test_the_google_backend_obeys_retry_after(waits):
    serper = FakeSerper("key", [{"title": "Everest", "link": "", "snippet": "Mount Everest is the highest peak."}])
    serper.failures_left, serper.retry_after = 1, "5"
    with serve_in_thread(serper.app) as url:
        assert await google_search("key", "Everest", 1, search_url=url + "/search")
        await close_loop_sessions()
    assert waits == [5.0]


def busy_engine(answers: list[tuple[int, str | None]]) -> FastAPI:
    """A /generate endpoint that answers each (status, Retry-After) in turn, then a finished turn."""
    app = FastAPI()

    @app.post("/generate")
    async def generate():
        if answers:
            status, retry_after = answers.pop(0)
            headers = {"Retry-After": retry_after} if retry_after else None
            return JSONResponse({"error": "busy"}, status_code=status, headers=headers)
        return {"output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}}}

    return app


async def test_the_engine_keeps_its_patience_and_obeys_retry_after(waits):
    with serve_in_thread(busy_engine([(503, "4"), (429, None), (429, "3600")])) as url:
        answer = await engine.post_with_retries(url + "/generate", {"input_ids": [1]})
        await close_loop_sessions()
    assert answer["output_ids"] == [5]
    assert waits == [4.0, engine.ENGINE_RETRY_WAIT_S, RETRY_AFTER_MAX_S]


@pytest.mark.timeout(30)  # a wait that ignored the abort would last RETRY_AFTER_MAX_S (60 s)
async def test_an_abort_ends_a_long_retry_after_wait_and_no_attempt_follows(retriever, monkeypatch):
    retriever.fail_next(5, 429, retry_after="3600")
    waiting, real_pause = asyncio.Event(), http_client.pause

    async def pause(seconds, give_up=None):
        waiting.set()
        await real_pause(seconds, give_up)

    monkeypatch.setattr(http_client, "pause", pause)
    aborted = False
    client = LocalRetrieverClient((retriever.url + "/retrieve",), timeout=5.0, max_attempts=3)
    search = asyncio.create_task(client.search("Everest", 1, give_up=lambda: aborted))
    await waiting.wait()  # the client waits out the server's Retry-After (bounded to RETRY_AFTER_MAX_S)
    aborted = True
    with pytest.raises(RequestFailed, match=r"HTTP 429 \(Retry-After 3600 s\)"):
        await search
    assert retriever.requests == 1
