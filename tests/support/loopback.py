"""Run real ASGI apps under uvicorn on 127.0.0.1 for the duration of a test."""

import contextlib
import threading
from collections.abc import Iterator

import uvicorn

from local_dense_retriever.serving.launcher import free_port  # tests import it from here too


class _Server(uvicorn.Server):
    """uvicorn's server, with an event set once its startup is over (listening, or failed)."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.startup_over = threading.Event()

    async def startup(self, sockets=None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.startup_over.set()

    def run(self, sockets=None) -> None:
        try:
            super().run(sockets=sockets)
        finally:
            self.startup_over.set()  # it exited before or during startup


@contextlib.contextmanager
def serve_in_thread(
    app, port: int | None = None, startup_timeout: float = 30.0, host: str = "127.0.0.1"
) -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread named uvicorn-<port>; yields its base URL, stops it on exit."""
    port = port or free_port()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = _Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    if not server.startup_over.wait(startup_timeout):  # a bound for a broken start, not a measurement
        server.should_exit = True
        raise TimeoutError(f"uvicorn on port {port} did not start within {startup_timeout} s")
    if not server.started:
        raise RuntimeError(f"uvicorn on port {port} exited during startup")
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
