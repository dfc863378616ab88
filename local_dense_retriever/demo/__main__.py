"""`python -m local_dense_retriever.demo`: the main job on the embedded default (embedded_default.py)."""

import sys

from local_dense_retriever.demo.embedded_default import main

sys.exit(main())
