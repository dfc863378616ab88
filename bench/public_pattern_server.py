"""Reference for the load benchmark: the public servers' request path, rebuilt on this project's parts.

Search-R1's server (and the copies in slime and elsewhere) declares a plain `def` endpoint, so FastAPI runs each
request in its thread pool (40 threads), and each request tokenizes, encodes and searches on its own. This file
reproduces that pattern, and nothing else, so the benchmark can measure it in the same run as our server: same
encoder, index, corpus access and JSON output; corpus loading and `return_scores: false` crashes are not copied.
Known defect kept on purpose: one fast tokenizer is shared by all threads (it can return wrong ids under load).

    python bench/public_pattern_server.py --index_path ... --corpus_path ... --retriever_model ... --port 8001
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import Response  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from local_dense_retriever.retrieval.backends import DenseSearcher, FaissIndex  # noqa: E402
from local_dense_retriever.retrieval.corpus import Corpus  # noqa: E402
from local_dense_retriever.retrieval import cpu_threads  # noqa: E402
from local_dense_retriever.retrieval.encoders import TextEncoder  # noqa: E402


class QueryRequest(BaseModel):
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def create_app(searcher: DenseSearcher, corpus: Corpus, default_topk: int) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        # The benchmark reads batch counts from /health; this server never batches across requests.
        return {"status": "ok", "batches": {"batches": 0, "queries": 0}, "load_seconds": {}}

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> Response:  # sync: runs in the thread pool, one request per thread
        scores, rows = searcher.search(request.queries, request.topk or default_topk)
        result = []
        for query_scores, query_rows in zip(scores.tolist(), rows.tolist(), strict=True):
            documents = corpus.get_many(query_rows)
            if request.return_scores:
                result.append([{"document": d, "score": s} for d, s in zip(documents, query_scores, strict=True)])
            else:
                result.append(documents)
        return Response(orjson.dumps({"result": result}), media_type="application/json")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index_path", required=True)
    parser.add_argument("--corpus_path", required=True)
    parser.add_argument("--retriever_name", default="e5")
    parser.add_argument("--retriever_model", required=True)
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    encoder = TextEncoder(args.retriever_model, retriever_name=args.retriever_name, max_length=args.max_length)
    cpu_threads.configure_pools(cpu_threads.thread_count())  # every CPU, libgomp's default wait, as torch would
    searcher = DenseSearcher(encoder, FaissIndex(args.index_path))
    app = create_app(searcher, Corpus(args.corpus_path), args.topk)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
