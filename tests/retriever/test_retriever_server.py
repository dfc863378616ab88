"""The retrieval server over real MiniLM + FAISS and real Wikipedia summaries, under uvicorn on loopback."""

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from local_dense_retriever.demo.mini_wiki import title_of
from local_dense_retriever.serving.app import create_app
from local_dense_retriever.serving.config import ServerConfig
from local_dense_retriever.serving.loading import Resources, load_resources
from support.loopback import serve_in_thread
from support.retriever_gate import first_rows, gated_server, health, wait_for
from support.rankings import same_ranking
from support.retriever_fixtures import (  # noqa: F401
    dense_config,
    dense_server_fixture,
    serve_ready,
    small_wiki_fixture,
    wait_ready,
)


def retrieve(url: str, payload: dict) -> httpx.Response:
    return httpx.post(f"{url}/retrieve", json=payload, timeout=60)


def test_evidence_pages_come_back_for_real_questions(dense_server, small_wiki):
    questions = small_wiki.questions
    response = retrieve(dense_server, {"queries": [q.question for q in questions], "topk": 3})
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == len(questions)
    found = [
        q.evidence_title in [title_of(doc["contents"]) for doc in hits]
        for q, hits in zip(questions, result, strict=True)
    ]
    # MiniLM finds ~89% in the top 3 among 10,033 pages; among 300 it should do at least as well.
    assert np.mean(found) >= 0.85, f"recall@3 {np.mean(found):.2f} over {len(questions)} questions"


def test_a_page_title_finds_its_own_page(dense_server, small_wiki):
    titles = small_wiki.titles[::10]
    result = retrieve(dense_server, {"queries": titles, "topk": 1}).json()["result"]
    top1 = [title_of(hits[0]["contents"]) for hits in result]
    assert np.mean([got == want for got, want in zip(top1, titles, strict=True)]) >= 0.9


def test_both_result_shapes(dense_server, small_wiki):
    query = small_wiki.questions[0].question
    plain = retrieve(dense_server, {"queries": [query], "topk": 3, "return_scores": False}).json()
    scored = retrieve(dense_server, {"queries": [query], "topk": 3, "return_scores": True}).json()
    default = retrieve(dense_server, {"queries": [query], "topk": 3}).json()
    assert set(plain) == {"result"} and len(plain["result"]) == 1 and len(plain["result"][0]) == 3
    for doc in plain["result"][0]:
        assert set(doc) == {"id", "contents", "url"}  # every field of the corpus line
        assert isinstance(doc["id"], str) and doc["contents"].startswith('"')
    assert [hit["document"] for hit in scored["result"][0]] == plain["result"][0]
    scores = [hit["score"] for hit in scored["result"][0]]
    assert all(isinstance(score, float) for score in scores) and scores == sorted(scores, reverse=True)
    assert default == plain  # return_scores defaults to false, as in Search-R1's request model


def test_topk_defaults_to_the_server_setting_and_is_honoured(dense_server, small_wiki):
    query = small_wiki.questions[1].question
    assert len(retrieve(dense_server, {"queries": [query]}).json()["result"][0]) == 3
    assert len(retrieve(dense_server, {"queries": [query], "topk": 7}).json()["result"][0]) == 7
    assert len(retrieve(dense_server, {"queries": [query], "topk": None}).json()["result"][0]) == 3


def test_documents_are_the_corpus_lines(dense_server, small_wiki):
    hits = retrieve(dense_server, {"queries": ["Eiffel Tower"], "topk": 5}).json()["result"][0]
    lines = small_wiki.corpus_path.read_text().splitlines()
    assert len(hits) == 5
    for doc in hits:  # the corpus writer makes "id" the row number, so each hit must be exactly that line
        assert doc == json.loads(lines[int(doc["id"])])


BAD_REQUESTS = [
    ({}, "queries"),
    ({"queries": "a single string"}, "queries"),
    ({"queries": [3]}, "queries.0"),
    ({"queries": ["fine", None]}, "queries.1"),
    ({"queries": ["q"] * 32769}, "queries"),  # more than --max_queries_in_flight: it could never be answered
    ({"queries": ["q"], "topk": 0}, "topk"),
    ({"queries": ["q"], "topk": 101}, "topk"),
    ({"queries": ["q"], "topk": "many"}, "topk"),
    ({"queries": ["q"], "return_scores": "perhaps"}, "return_scores"),
    ([1, 2], "request body"),
]


@pytest.mark.parametrize(("payload", "field"), BAD_REQUESTS, ids=[str(i) for i in range(len(BAD_REQUESTS))])
def test_bad_requests_get_a_clear_422_and_the_server_keeps_serving(dense_server, payload, field):
    response = retrieve(dense_server, payload)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert isinstance(detail, str) and detail.startswith(field) and "accepted:" in detail
    ok = retrieve(dense_server, {"queries": ["Who painted the Mona Lisa?"]})
    assert ok.status_code == 200 and len(ok.json()["result"][0]) == 3


SMALL_LIMITS = {"max_queries_in_flight": 6, "max_topk": 5, "max_request_mb": 0.05}


@pytest.fixture(scope="module", name="small_limits_server")
def small_limits_server_fixture(small_wiki):
    # Small limits keep each generated request cheap; the document the fuzzer reads states these limits.
    with serve_ready(dense_config(small_wiki, **SMALL_LIMITS)) as url:
        yield url


LOOSE_REQUESTS = [
    ({"queries": ["q"], "topk": "3"}, "topk"),
    ({"queries": ["q"], "topk": " 3 "}, "topk"),
    ({"queries": ["q"], "topk": 3.0}, "topk"),
    ({"queries": ["q"], "topk": True}, "topk"),
    ({"queries": ["q"], "return_scores": "yes"}, "return_scores"),
    ({"queries": ["q"], "return_scores": 1}, "return_scores"),
]


@pytest.mark.parametrize(("payload", "field"), LOOSE_REQUESTS, ids=[repr(p) for p, _ in LOOSE_REQUESTS])
def test_values_of_the_wrong_json_type_are_refused_not_coerced(dense_server, payload, field):
    response = retrieve(dense_server, payload)
    assert response.status_code == 422
    assert response.json()["detail"].startswith(f"{field}: ")
    assert response.json()["errors"][0]["loc"] == ["body", field]


def test_an_unknown_field_is_refused_with_a_message_naming_it(dense_server):
    response = retrieve(dense_server, {"queries": ["q"], "top_k": 7})
    assert response.status_code == 422
    assert response.json()["detail"] == "top_k: unknown field (accepted fields: queries, topk, return_scores)"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_json_sent_without_the_json_content_type_gets_a_415_that_says_so(dense_server, content_type):
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(f"{dense_server}/retrieve", content=b'{"queries": ["q"]}', headers=headers)
    assert response.status_code == 415
    assert "Content-Type" in response.json()["detail"]


@pytest.mark.parametrize(
    "body", [b'{"queries": [', b'\xff\xfe{"queries": ["q"]}', b""], ids=["truncated", "utf16", "empty"]
)
def test_a_body_that_is_not_utf8_json_gets_a_400(dense_server, body):
    response = httpx.post(f"{dense_server}/retrieve", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["detail"].startswith("the body is not valid UTF-8 JSON")


def test_a_body_over_max_request_mb_gets_a_413_naming_it_before_it_is_read(small_limits_server):
    limit = ServerConfig(index_path=None, corpus_path="", **SMALL_LIMITS).max_request_bytes
    too_big = b'{"queries": ["' + b"x" * limit + b'"]}'
    response = httpx.post(
        f"{small_limits_server}/retrieve", content=too_big, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert f"over the server's --max_request_mb 0.05 ({limit} bytes)" in response.json()["detail"]


def test_the_openapi_document_lists_every_status_the_retrieve_endpoint_sends(dense_server):
    document = httpx.get(f"{dense_server}/openapi.json").json()
    operation = document["paths"]["/retrieve"]["post"]
    assert set(operation["responses"]) == {"200", "400", "408", "413", "415", "422", "500", "503"}
    assert set(document["paths"]["/health"]["get"]["responses"]) == {"200", "503"}
    request_schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert request_schema["additionalProperties"] is False and request_schema["required"] == ["queries"]


def test_a_schema_based_fuzz_finds_no_response_that_differs_from_the_openapi_document(small_limits_server, tmp_path):
    """schemathesis, every check, fixed (derandomized) examples: valid and invalid requests to both endpoints."""
    tests = str(Path(__file__).parents[1])  # support.schema_fuzz_hooks is imported from tests/
    env = {**os.environ, "PYTHONPATH": tests, "SCHEMATHESIS_HOOKS": "support.schema_fuzz_hooks"}
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{small_limits_server}/openapi.json",
        "--checks", "all", "--max-examples", "12", "--generation-deterministic", "--no-color",
    ]  # fmt: skip
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    generated = re.search(r"(\d+) generated", report)
    assert generated and int(generated.group(1)) >= 50, report[-3000:]  # both endpoints, valid and invalid
    assert "No issues found" in report


def test_health_reports_ready_with_the_loaded_sizes(dense_server, small_wiki):
    body = httpx.get(f"{dense_server}/health").json()
    assert body["status"] == "ok"
    assert body["documents"] == len(small_wiki.titles)
    assert "IndexFlat" in body["retriever"]
    assert httpx.get(f"{dense_server}/docs").status_code == 200


def test_health_is_503_until_model_index_and_corpus_are_loaded(small_wiki):
    config = dense_config(small_wiki)
    release = threading.Event()

    def gated_load(report) -> Resources:
        report("waiting for the test")
        release.wait(60)
        return load_resources(config, report)

    with serve_in_thread(create_app(config, load=gated_load)) as url:
        before = httpx.get(f"{url}/health")
        assert before.status_code == 503 and before.json()["status"] == "loading"
        early = retrieve(url, {"queries": ["anything"]})
        assert early.status_code == 503 and "not ready" in early.json()["detail"]
        release.set()
        assert wait_ready(url)["status"] == "ok"
        assert retrieve(url, {"queries": ["anything"]}).status_code == 200


def test_a_failed_load_is_reported_by_health(small_wiki, tmp_path):
    config = dense_config(small_wiki, corpus_path=str(tmp_path / "missing.jsonl"))
    with serve_in_thread(create_app(config)) as url:
        wait_for(lambda: httpx.get(f"{url}/health").json()["status"] != "loading", "loading ends")
        body = httpx.get(f"{url}/health").json()
        assert body["status"] == "failed" and "missing.jsonl" in body["detail"]


def test_hundreds_of_concurrent_single_query_requests_match_the_sequential_answers(small_wiki):
    queries = [q.question for q in small_wiki.questions] + small_wiki.titles
    queries = (queries * 2)[:320]
    with serve_ready(dense_config(small_wiki)) as url:
        with httpx.Client(timeout=60) as client:
            sequential = [
                client.post(f"{url}/retrieve", json={"queries": [q], "return_scores": True}).json()["result"][0]
                for q in dict.fromkeys(queries)
            ]
        expected = dict(zip(dict.fromkeys(queries), sequential, strict=True))
        batches_before = httpx.get(f"{url}/health").json()["batches"]["batches"]

        async def fire_all():
            limits = httpx.Limits(max_connections=len(queries))
            async with httpx.AsyncClient(timeout=120, limits=limits) as client:
                payloads = [{"queries": [q], "return_scores": True} for q in queries]
                return await asyncio.gather(*(client.post(f"{url}/retrieve", json=p) for p in payloads))

        responses = asyncio.run(fire_all())
        stats = httpx.get(f"{url}/health").json()["batches"]
    assert [r.status_code for r in responses] == [200] * len(queries)
    mismatches = [
        q for q, r in zip(queries, responses, strict=True) if not same_ranking(r.json()["result"][0], expected[q])
    ]
    assert mismatches == []
    concurrent_batches = stats["batches"] - batches_before
    # Dynamic batching really merged requests: far fewer forward passes than requests.
    assert concurrent_batches < len(queries) / 4, f"{concurrent_batches} batches for {len(queries)} requests"
    assert stats["largest_batch"] <= 64 and stats["errors"] == 0


@pytest.fixture(scope="module", name="batch_of_4_server")
def batch_of_4_server_fixture(small_wiki):
    with serve_ready(dense_config(small_wiki, max_batch_size=4, max_response_mb=0.3)) as url:  # ~500 passages
        yield url


def batch_report(url: str) -> dict:
    return health(url)["batches"]


def test_a_single_query_is_answered_while_a_large_request_is_still_running(small_wiki):
    """96 queries in batches of 4 take 24 searches; a query sent meanwhile joins the next batch, not the 25th."""
    single_query = "Who painted the Mona Lisa?"
    with gated_server(small_wiki, open_batches=2) as (url, gate):
        finished: list[str] = []

        async def scenario():
            async with httpx.AsyncClient(timeout=120) as client:

                async def send(name: str, queries: list[str]) -> httpx.Response:
                    response = await client.post(f"{url}/retrieve", json={"queries": queries, "topk": 3})
                    finished.append(name)
                    return response

                large = asyncio.ensure_future(send("large", [f"question number {i}" for i in range(96)]))
                await asyncio.to_thread(gate.holding.wait, 60)  # its 3rd batch is running
                single = asyncio.ensure_future(send("single", [single_query]))
                # queued behind the running batch: the large request's 84 unbatched queries and the single one
                await asyncio.to_thread(wait_for, lambda: batch_report(url)["waiting_queries"] == 85, "queued")
                gate.release()
                return await single, await large

        single, large = asyncio.run(scenario())
    assert single.status_code == 200 and large.status_code == 200
    assert finished == ["single", "large"]
    assert len(large.json()["result"]) == 96
    assert single_query in gate.batches[3]  # the batch after the one running when it came
    assert len(gate.batches) == 25 and max(len(batch) for batch in gate.batches) <= 4  # split, not one batch of 96


def test_a_single_query_sent_beside_long_queries_waits_for_one_short_batch_of_them(small_wiki):
    """64 queries of 4,096 characters, each encoded at the full 256 tokens: with the default bounds (64 queries,
    1,024 tokens) a batch of long queries holds a quarter of the tokens, one of them, not 64. A single query sent
    while the second batch runs is the third, alone, and /health counts every token the batches held."""
    text = " ".join(q.question for q in small_wiki.questions)
    long_queries = [(text[i * 7 :] + text)[:4096] for i in range(64)]
    single_query = "Who painted the Mona Lisa?"
    with gated_server(small_wiki, open_batches=1, max_batch_size=64, search=first_rows) as (url, gate):

        async def scenario():
            async with httpx.AsyncClient(timeout=120) as client:
                large = asyncio.ensure_future(client.post(f"{url}/retrieve", json={"queries": long_queries}))
                await asyncio.to_thread(gate.holding.wait, 60)  # its 2nd batch is running
                single = asyncio.ensure_future(client.post(f"{url}/retrieve", json={"queries": [single_query]}))
                queued = 64 - 2 + 1  # behind the running batch: the large request's unbatched queries and the single
                await asyncio.to_thread(wait_for, lambda: batch_report(url)["waiting_queries"] == queued, "queued")
                gate.release()
                return await single, await large

        single, large = asyncio.run(scenario())
        ready = health(url)
    assert single.status_code == 200 and large.status_code == 200 and len(large.json()["result"]) == 64
    assert ready["max_batch_tokens"] == 1024
    assert [len(batch) for batch in gate.batches[:2]] == [1, 1]
    assert gate.batches[2] == [single_query]
    rest = [
        query[:100] for batch in gate.batches[3:] for query in batch
    ]  # the long queries as read: cut at 256 tokens
    assert rest == [query[:100] for query in long_queries[2:]] and {len(batch) for batch in gate.batches[3:]} == {1}
    assert ready["batches"]["tokens"] == 64 * 256 + 8 and ready["batches"]["largest_batch_tokens"] == 256


def test_a_client_that_disconnects_stops_the_rest_of_its_large_request(small_wiki):
    with gated_server(small_wiki, open_batches=2) as (url, gate):
        body = json.dumps({"queries": [f"question number {i}" for i in range(96)]}).encode()  # 24 batches of 4
        request = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as sock:
            sock.sendall(request % len(body) + body)
            assert gate.holding.wait(60)  # its 3rd batch is running
        wait_for(lambda: batch_report(url)["abandoned_requests"] == 1, "the server saw the client leave")
        assert batch_report(url)["waiting_queries"] == 0  # its 84 unbatched queries were dropped
        gate.release()
        after = retrieve(url, {"queries": ["Who painted the Mona Lisa?"], "topk": 3})
        assert after.status_code == 200
        assert len(gate.batches) == 4, f"{len(gate.batches)} batches ran; the client left during the 3rd of 24"
        assert gate.batches[3] == ["Who painted the Mona Lisa?"]


def test_a_response_over_the_size_cap_is_refused_with_a_422_before_any_work(batch_of_4_server):
    url = batch_of_4_server
    batches_before = httpx.get(f"{url}/health").json()["batches"]["batches"]
    refused = retrieve(url, {"queries": [f"question {i}" for i in range(20)], "topk": 50})
    batches_after = httpx.get(f"{url}/health").json()["batches"]["batches"]
    allowed = retrieve(url, {"queries": ["question"], "topk": 50})
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["type"] == "response_too_large"
    assert "--max_response_mb 0.3" in refused.json()["detail"] and "1000 documents" in refused.json()["detail"]
    assert batches_after == batches_before  # refused from the estimate, nothing was encoded
    assert allowed.status_code == 200 and len(allowed.json()["result"][0]) == 50
