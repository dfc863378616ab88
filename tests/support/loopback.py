"""Run real ASGI apps under uvicorn on 127.0.0.1 for the duration of a test."""

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn

from local_dense_retriever.serving.launcher import free_port  # tests import it from here too


@contextlib.contextmanager
def serve_in_thread(
    app, port: int | None = None, startup_timeout: float = 30.0, host: str = "127.0.0.1"
) -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread named uvicorn-<port>; yields its base URL, stops it on exit."""
    port = port or free_port()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"uvicorn on port {port} exited during startup")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"uvicorn on port {port} did not start within {startup_timeout} s")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
