"""Build a search index from a corpus jsonl: FAISS (any index_factory string), a Qdrant collection, or BM25.

    python -m local_dense_retriever.index_builder --corpus_path wiki-18.jsonl --retriever_name e5 \
        --retriever_model intfloat/e5-base-v2 --faiss_type Flat --save_dir indexes/

The builder is building/index.py; its command line building/index_cli.py.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository, not this folder, goes first on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from local_dense_retriever.building.index_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
