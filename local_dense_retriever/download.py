"""Download the files a retriever serves from the Hugging Face hub, resumable:

    python -m local_dense_retriever.download --save_path /data/wiki18

The downloads are building/downloads.py.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository, not this folder, goes first on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from local_dense_retriever.building.downloads import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
