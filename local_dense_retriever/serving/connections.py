"""Connection limits the retrieval server adds to uvicorn's HTTP protocol.

Measured with uvicorn 0.54 (httptools and h11 alike): `timeout_keep_alive` only starts after a response, so a
connection that never sends a request, or stops halfway through its headers, stays open forever; and when the
process runs out of file descriptors, uvloop accepts and resets new connections without logging anything. So:

- request headers must arrive within `header_timeout` seconds of the connection opening (or of the first byte of a
  request on a kept-alive connection), or the connection is closed; the body has its own deadline in the app;
- at most `max_connections` connections are kept open, below the open-file limit so the server never runs out of
  descriptors itself; one over the limit gets a 503 and is closed, and the refusal is logged.
"""

import asyncio
import logging
import resource
import time

from uvicorn.protocols.http.auto import AutoHTTPProtocol

logger = logging.getLogger("local_dense_retriever")

# Descriptors kept for the server itself: the corpus and its offsets, the index and model files while loading,
# the event loop, logs, and Qdrant's files (a loaded MiniLM server holds 17).
RESERVED_FILE_DESCRIPTORS = 100
_OVER_CAPACITY_BODY = b'{"detail": "too many open connections: the server is at its limit, retry later"}'
OVER_CAPACITY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_OVER_CAPACITY_BODY), _OVER_CAPACITY_BODY)
)


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (a shell's default 1024 is easy to exhaust); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # some containers forbid it: keep the soft limit
            pass
    return soft


def default_max_connections(open_file_limit: int) -> int:
    return max(1, open_file_limit - RESERVED_FILE_DESCRIPTORS)


class ThrottledWarning:
    """Log a warning at most once per `interval` seconds, with how many were held back in between."""

    def __init__(self, interval: float = 10.0):
        self.interval = interval
        self._last = -float("inf")
        self._held_back = 0

    def __call__(self, message: str, *args) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            self._held_back += 1
            return
        if self._held_back:
            message += f" (and {self._held_back} more like it in the last {now - self._last:.0f} s)"
        logger.warning(message, *args)
        self._last, self._held_back = now, 0


def guarded_http_protocol(header_timeout: float, max_connections: int, open_file_limit: int) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with a header deadline and a connection cap (pass it as `Config(http=...)`).

    `open_file_limit` is only named in the refusal message (raise_open_file_limit() set it before serving).
    """
    refused = ThrottledWarning()
    timed_out = ThrottledWarning()

    class GuardedHTTPProtocol(AutoHTTPProtocol):
        _header_deadline: asyncio.TimerHandle | None = None
        _cycle_when_armed = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                refused(
                    "refusing connections: %d are open and --max_connections is %d (the open-file limit is %d); "
                    "a client is holding many connections, or the limit is too low for the load",
                    len(self.connections) - 1,
                    max_connections,
                    open_file_limit,
                )
                transport.write(OVER_CAPACITY_RESPONSE)
                transport.close()
                return
            self._arm_header_deadline()

        def data_received(self, data: bytes) -> None:
            if self._header_deadline is None and (self.cycle is None or self.cycle.response_complete):
                self._arm_header_deadline()  # the first bytes of a new request on a kept-alive connection
            super().data_received(data)
            if self._header_deadline is not None and self.cycle is not self._cycle_when_armed:
                self._disarm_header_deadline()  # the headers are complete: a new request cycle started

        def connection_lost(self, exc) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            self._cycle_when_armed = self.cycle
            self._header_deadline = self.loop.call_later(header_timeout, self._headers_too_late)

        def _disarm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_late(self) -> None:
            self._header_deadline = None
            if not self.transport.is_closing():
                timed_out(
                    "closed a connection from %s that sent no complete request headers within %g s "
                    "(--timeout_request)",
                    "{}:{}".format(*self.client) if self.client else "?",
                    header_timeout,
                )
                self.transport.close()

    return GuardedHTTPProtocol
