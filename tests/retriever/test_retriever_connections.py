"""Connections that never finish a request, a process out of file descriptors, SIGTERM: the real CLI server."""

import signal
import socket
import time

import httpx
import pytest

from local_dense_retriever.serving.launcher import ServerProcess
from support.retriever_fixtures import RETRIEVER_NAME, small_wiki_fixture  # noqa: F401
from support.sockets import HALF_BODY, HALF_HEADERS, open_connection, still_open


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


def test_connections_that_send_no_complete_request_are_closed_after_the_request_timeout(small_wiki, tmp_path):
    flags = [*server_flags(small_wiki), "--timeout_request", "1", "--timeout_keep_alive", "1"]
    with ServerProcess(flags, log_path=tmp_path / "server.log", startup_timeout=120) as server:
        kinds = {"idle": b"", "half headers": HALF_HEADERS, "half body": HALF_BODY, "kept alive": GET_HEALTH}
        connections = {kind: [open_connection(server.port, data) for _ in range(10)] for kind, data in kinds.items()}
        time.sleep(0.3)  # the kept-alive ones were answered; now they start another request and stall
        for sock in connections["kept alive"][5:]:
            sock.sendall(HALF_HEADERS)
        started = time.monotonic()
        answers = {
            kind: [read_until_closed(sock, timeout=10) for sock in socks] for kind, socks in connections.items()
        }
        seconds = time.monotonic() - started
        for socks in connections.values():
            for sock in socks:
                sock.close()
        still_serving = httpx.post(f"{server.url}/retrieve", json={"queries": ["Eiffel Tower"]})
    for kind in ("idle", "half headers"):
        assert answers[kind] == [b""] * 10, kind  # closed without an answer: there is nothing to answer
    for answer in answers["half body"]:
        assert answer is not None and answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"did not arrive within 1 s" in answer
    for answer in answers["kept alive"]:  # answered, then closed after 1 s idle or 1 s of half-sent headers
        assert answer is not None and answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1") == 1
    assert seconds < 5, f"the last of 40 stalled connections was closed after {seconds:.1f} s"
    assert still_serving.status_code == 200
    assert "sent no complete request headers within 1 s" in server.log_tail(200)


def test_sigterm_stops_the_server_promptly_while_a_client_holds_a_half_sent_body(small_wiki, tmp_path):
    flags = [*server_flags(small_wiki), "--timeout_request", "120", "--timeout_graceful_shutdown", "1"]
    server = ServerProcess(flags, log_path=tmp_path / "server.log", startup_timeout=120)
    server.start()
    stalled = open_connection(server.port, HALF_BODY)
    try:
        time.sleep(0.2)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=30)
        seconds = time.monotonic() - started
    finally:
        stalled.close()
        server.stop()
    print(server.log_tail(15))
    assert server.process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
    assert "Application shutdown complete" in server.log_tail(15)
    assert seconds < 5, f"SIGTERM took {seconds:.1f} s with --timeout_graceful_shutdown 1"


def test_connections_past_the_file_descriptor_limit_are_refused_with_a_503_and_logged(small_wiki, tmp_path):
    """With `ulimit -n 160` the server keeps 60 connections; ones past that are refused at once, with a log line,
    instead of being reset unlogged; once the idle ones time out, requests are served again."""
    flags = [*server_flags(small_wiki), "--timeout_request", "3"]
    with ServerProcess(flags, log_path=tmp_path / "server.log", startup_timeout=120, open_file_limit=160) as server:
        idle = [open_connection(server.port) for _ in range(100)]
        refused = httpx.post(f"{server.url}/retrieve", json={"queries": ["q"]}, timeout=10)
        time.sleep(0.5)
        kept = [sock for sock in idle if still_open(sock)]  # the others got a 503 and were closed
        started = time.monotonic()
        for sock in kept:  # the client never closes them: the server does, after --timeout_request
            read_until_closed(sock, timeout=20)
        kept_seconds = time.monotonic() - started
        served = httpx.post(f"{server.url}/retrieve", json={"queries": ["q"]}, timeout=10)
        for sock in idle:
            sock.close()
        log = server.log_tail(10_000)
    assert "accepting up to 60 connections (open-file limit 160)" in log
    assert refused.status_code == 503 and "too many open connections" in refused.json()["detail"]
    assert "refusing connections: 60 are open and --max_connections is 60 (the open-file limit is 160)" in log
    assert len(kept) == 60
    assert 1.5 < kept_seconds < 10  # closed by --timeout_request 3 (counted from when each one connected)
    assert served.status_code == 200


@pytest.mark.parametrize("flag", ["--timeout_request", "--timeout_keep_alive", "--timeout_graceful_shutdown"])
def test_connection_timeouts_must_be_positive(small_wiki, flag, capsys):
    from local_dense_retriever.serving.config import parse_config

    with pytest.raises(SystemExit):
        parse_config([*server_flags(small_wiki), flag, "0"])
    assert f"{flag} must be a positive number of seconds, got 0.0" in capsys.readouterr().err
