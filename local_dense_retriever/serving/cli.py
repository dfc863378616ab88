"""The server's command line: `python local_dense_retriever/retrieval_server.py` (or `-m
local_dense_retriever.retrieval_server`) with Search-R1's flags. It binds 127.0.0.1 unless told otherwise, listens at
once, and loads in the background; slow, idle and surplus connections are timed out or refused (connections.py).
"""

import argparse
import logging

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


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    config, args = parse_config(argv)
    # Before torch and faiss load (in the loader thread): OpenMP reads it only then.
    cpu_threads.set_wait_policy(tuned=config.num_threads is None)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs every SIMD variant it tries
    app = create_app(config)
    server = uvicorn.Server(uvicorn_config(app, args))
    app.state.runtime.on_failure = lambda: setattr(server, "should_exit", True)
    logger.info("listening on http://%s:%d (GET /health says when the retriever is ready)", args.host, args.port)
    server.run()
    return 1 if app.state.runtime.status == "failed" else 0
