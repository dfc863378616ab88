"""RAM and per-GPU memory of a retriever layout, checked against what training leaves free:

    python -m local_dense_retriever.memory_plan --corpus_size 21015324 --dim 768 --layout torch-fp16 --gpus 8 \
        --gpu_gib 80 --sglang_mem_fraction_static 0.7 --trainer_gib 6

The plan is retrieval/memory_plan.py.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository, not this folder, goes first on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from local_dense_retriever.retrieval.memory_plan import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
