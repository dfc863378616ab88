"""Connections that never finish a request, a process out of file descriptors, SIGTERM: the real CLI server."""

import signal
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from local_dense_retriever.serving.launcher import ServerProcess
from support.retriever_fixtures import RETRIEVER_NAME, small_wiki_fixture  # noqa: F401
from support.retriever_gate import health, wait_for
from support.sockets import HALF_BODY, HALF_HEADERS, open_connection


def server_flags(wiki) -> list[str]:
    return ["--index_path", str(wiki.index_path), "--corpus_path", str(wiki.corpus_path),
            "--retriever_name", RETRIEVER_NAME, "--retriever_model", str(wiki.model_dir)]  # fmt: skip


def read_until_closed(sock: socket.socket, timeout: float) -> bytes | None:
    """Everything the server sent before closing, or None if it kept the connection open for `timeout` s."""
    sock.settimeout(timeout)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return received


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response (headers and Content-Length body) from `sock`, which stays open."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    headers, _, body = received.partition(b"\r\n\r\n")
    lengths = [line.split(b":")[1] for line in headers.split(b"\r\n") if line.lower().startswith(b"content-length")]
    length = int(lengths[0])
    while len(body) < length:
        body += sock.recv(65536)
    return headers + b"\r\n\r\n" + body


def test_connections_that_send_no_complete_request_are_closed_after_the_request_timeout(small_wiki, tmp_path):
    flags = [*server_flags(small_wiki), "--timeout_request", "1", "--timeout_keep_alive", "1"]
    with ServerProcess(flags, log_path=tmp_path / "server.log", startup_timeout=120) as server:
        kinds = {"idle": b"", "half headers": HALF_HEADERS, "half body": HALF_BODY, "kept alive": GET_HEALTH}
        connections = {kind: [open_connection(server.port, data) for _ in range(10)] for kind, data in kinds.items()}
        first_answers = [read_response(sock) for sock in connections["kept alive"]]
        for sock in connections["kept alive"][5:]:  # answered; now they start another request and stall
            sock.sendall(HALF_HEADERS)
        # each is closed by the server (--timeout_request 1); None: still open 10 s later
        answers = {kind: [read_until_closed(sock, 10) for sock in socks] for kind, socks in connections.items()}
        for socks in connections.values():
            for sock in socks:
                sock.close()
        still_serving = httpx.post(f"{server.url}/retrieve", json={"queries": ["Eiffel Tower"]})
    for kind in ("idle", "half headers"):
        assert answers[kind] == [b""] * 10, kind  # closed without an answer: there is nothing to answer
    for answer in answers["half body"]:
        assert answer is not None and answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"did not arrive within 1 s" in answer
    assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in first_answers)
    assert answers["kept alive"] == [b""] * 10  # then closed: after 1 s idle, or 1 s of half-sent headers
    assert still_serving.status_code == 200
    assert "sent no complete request headers within 1 s" in server.log_tail(200)


def test_sigterm_stops_the_server_promptly_while_a_client_holds_a_half_sent_body(small_wiki, tmp_path):
    flags = [*server_flags(small_wiki), "--timeout_request", "120", "--timeout_graceful_shutdown", "1"]
    server = ServerProcess(flags, log_path=tmp_path / "server.log", startup_timeout=120)
    server.start()
    stalled = open_connection(server.port, HALF_BODY)
    try:
        wait_for(lambda: health(server.url)["in_flight"]["bodies_being_read"] == 1, "the server reads the body")
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=30)  # the body's own deadline is 120 s away
    finally:
        stalled.close()
        server.stop()
    print(server.log_tail(15))
    assert server.process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
    assert "Application shutdown complete" in server.log_tail(15)


def test_a_request_still_running_when_the_graceful_shutdown_ends_gets_a_503_saying_so(small_wiki, tmp_path):
    """SIGTERM during a request far longer than --timeout_graceful_shutdown (512 queries each encoded at the full 256
    tokens, one at a time): uvicorn cancels it when the grace ends; its client gets a JSON 503 naming the shutdown,
    with Retry-After, not uvicorn's bare 500 text/plain "Internal Server Error"."""
    flags = [*server_flags(small_wiki), "--timeout_graceful_shutdown", "1"]
    long_queries = [(f"query {i} " + "about the history of the tower " * 200)[:4096] for i in range(512)]
    server = ServerProcess(flags, log_path=tmp_path / "server.log", startup_timeout=120)
    server.start()
    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, f"{server.url}/retrieve", json={"queries": long_queries}, timeout=120)
            wait_for(lambda: health(server.url)["batches"]["queries"] >= 1, "the request's first batch has run")
            server.process.send_signal(signal.SIGTERM)
            response = answer.result()
        server.process.wait(timeout=60)
    finally:
        server.stop()
    assert response.status_code == 503, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json"
    assert response.headers["retry-after"] == "1"
    assert "the retriever is shutting down" in response.json()["detail"]
    assert "--timeout_graceful_shutdown" in response.json()["detail"]


def test_connections_past_the_file_descriptor_limit_are_refused_with_a_503_and_logged(small_wiki, tmp_path):
    """With `ulimit -n 160` the server keeps 60 connections; ones past that are refused at once, with a log line,
    instead of being reset unlogged; once the idle ones time out, requests are served again."""
    flags = [*server_flags(small_wiki), "--timeout_request", "3"]
    with ServerProcess(flags, log_path=tmp_path / "server.log", startup_timeout=120, open_file_limit=160) as server:
        idle = [open_connection(server.port) for _ in range(100)]
        refused = httpx.post(f"{server.url}/retrieve", json={"queries": ["q"]}, timeout=10)
        # Each idle connection is either refused at once (a 503, then closed) or kept until --timeout_request
        # closes it with nothing sent (b""); None: still open 20 s later.
        ends = [read_until_closed(sock, timeout=20) for sock in idle]
        served = httpx.post(f"{server.url}/retrieve", json={"queries": ["q"]}, timeout=10)
        for sock in idle:
            sock.close()
        log = server.log_tail(10_000)
    assert "accepting up to 60 connections (open-file limit 160)" in log
    assert refused.status_code == 503 and "too many open connections" in refused.json()["detail"]
    assert "refusing connections: 60 are open and --max_connections is 60 (the open-file limit is 160)" in log
    assert ends.count(b"") == 60  # kept, then closed by the server's header deadline
    assert all(end.startswith(b"HTTP/1.1 503 ") for end in ends if end)  # the other 40 refused
    assert served.status_code == 200


@pytest.mark.parametrize("flag", ["--timeout_request", "--timeout_keep_alive", "--timeout_graceful_shutdown"])
def test_connection_timeouts_must_be_positive(small_wiki, flag, capsys):
    from local_dense_retriever.serving.config import parse_config

    with pytest.raises(SystemExit):
        parse_config([*server_flags(small_wiki), flag, "0"])
    assert f"{flag} must be a positive number of seconds, got 0.0" in capsys.readouterr().err
