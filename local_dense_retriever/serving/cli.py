"""The server's command line: `python local_dense_retriever/retrieval_server.py` (or `-m
local_dense_retriever.retrieval_server`) with Search-R1's flags. It binds 127.0.0.1 unless told otherwise, listens at
once, and loads in the background; slow, idle and surplus connections are timed out or refused (connections.py).
"""

import argparse
import logging
import os
import socket
from pathlib import Path

from fastapi import FastAPI

from local_dense_retriever.retrieval import cpu_threads
from local_dense_retriever.serving.app import create_app
from local_dense_retriever.serving.config import parse_config

logger = logging.getLogger("local_dense_retriever")


def uvicorn_config(app: FastAPI, args: argparse.Namespace):
    """uvicorn settings for the server: bounded connection times and counts (see connections.py)."""
    import uvicorn

    from local_dense_retriever.serving.connections import (
        default_max_connections,
        guarded_http_protocol,
        raise_open_file_limit,
    )

    open_file_limit = raise_open_file_limit()
    max_connections = args.max_connections or default_max_connections(open_file_limit)
    if max_connections > open_file_limit:
        logger.warning(
            "--max_connections %d is above the open-file limit %d: connections past it will be reset unlogged",
            max_connections,
            open_file_limit,
        )
    logger.info("accepting up to %d connections (open-file limit %d)", max_connections, open_file_limit)
    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,  # access logs cost more CPU than a batched search at hundreds of requests per second
        http=guarded_http_protocol(args.timeout_request, max_connections, open_file_limit),
        timeout_keep_alive=args.timeout_keep_alive,
        timeout_graceful_shutdown=args.timeout_graceful_shutdown,
    )


def write_address(directory: str, host: str, port: int) -> Path:
    """ASearcher's address file: `host:port` in <directory>/Host<ip>_IP<port>.txt, the host as clients reach it."""
    if host in ("0.0.0.0", "::", ""):  # every interface: the host's own address, as ASearcher writes it
        host = socket.gethostbyname(socket.gethostname())
    os.makedirs(directory, exist_ok=True)
    path = Path(directory) / f"Host{host}_IP{port}.txt"
    path.write_text(f"{host}:{port}")
    return path


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, plus ASearcher's address file: written once listening, removed as shutdown begins.

        Removed in shutdown(), not after run(): on every signal uvicorn handles (SIGINT, SIGTERM, ...) it shuts
        down, then raises the signal again with its default action, and SIGTERM's ends the process at once."""

        address_file: Path | None = None

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started and args.save_address_to:  # listening now: the port is the bound one (--port 0 too)
                port = self.servers[0].sockets[0].getsockname()[1]
                self.address_file = write_address(args.save_address_to, args.host, port)
                logger.info("address written to %s", self.address_file)

        async def shutdown(self, sockets=None) -> None:
            self.forget_address()  # first: no new client is sent here while the requests in flight finish
            await super().shutdown(sockets)

        def forget_address(self) -> None:
            if self.address_file is not None:
                self.address_file.unlink(missing_ok=True)
                self.address_file = None

    config, args = parse_config(argv)
    # Before torch and faiss load (in the loader thread): OpenMP reads it only then.
    cpu_threads.set_wait_policy(tuned=config.num_threads is None)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs every SIMD variant it tries
    app = create_app(config)
    server = Server(uvicorn_config(app, args))
    app.state.runtime.on_failure = lambda: setattr(server, "should_exit", True)
    logger.info("listening on http://%s:%d (GET /health says when the retriever is ready)", args.host, args.port)
    try:
        server.run()
    finally:  # ASearcher's clients pick any address file they find: one left by a stopped server sends them nowhere
        server.forget_address()  # when run() ended without a shutdown (an error)
    return 1 if app.state.runtime.status == "failed" else 0
