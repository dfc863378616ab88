"""Search-R1's retrieval server, batched: `POST /retrieve`, `GET /health`, `/docs`. Run it as Search-R1's and slime's
command lines do (the flags and the API are the same), as a file or as a module:

    python local_dense_retriever/retrieval_server.py --index_path e5_Flat.index --corpus_path wiki-18.jsonl \
        --topk 3 --retriever_name e5 --retriever_model intfloat/e5-base-v2 --faiss_gpu --port 8000

The server is serving/ (config.py: its flags; app.py: its routes; loading.py: what it loads).
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository, not this folder, goes first on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from local_dense_retriever.serving.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
