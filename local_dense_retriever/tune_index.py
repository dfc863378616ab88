"""Measure candidate index layouts against a built Flat index and name the cheapest that keeps recall@3:

    python -m local_dense_retriever.tune_index --index_path e5_Flat.index --corpus_path wiki-18.jsonl \
        --retriever_name e5 --retriever_model intfloat/e5-base-v2 --queries train.parquet

The tuner is building/tuner.py; its command line building/tuner_cli.py.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository, not this folder, goes first on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from local_dense_retriever.building.tuner_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
