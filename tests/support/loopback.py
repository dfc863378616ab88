"""Run real ASGI apps under uvicorn on 127.0.0.1 for the duration of a test."""

import contextlib
from collections.abc import Iterator

from local_dense_retriever.serving.launcher import free_port  # tests import it from here too
from slime_search_r1.standin.server import serving


@contextlib.contextmanager
def serve_in_thread(app, port: int | None = None, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread named uvicorn-<port>; yields its base URL, stops it on exit
    (a server still closing a held connection after 10 s is left to its daemon thread)."""
    port = port or free_port()
    with serving(app, host, port, name="uvicorn", stop_wait=10):
        yield f"http://{host}:{port}"
