#!/usr/bin/env bash
# Search-R1 training with a local retrieval server, side by side in one tmux session and stopped together.
#
#   bash run_qwen2.5_3B_with_retrieval.sh [--help]
#
# Checks everything first, starts the retrieval server (when RETRIEVAL_SERVER_URL, resolved as training resolves
# it, is one local URL) and waits for its /health, then starts training (TRAIN_CMD, run_qwen2.5_3B.sh by default)
# in the same tmux session. Ctrl-C stops both; the exit code is training's (1 if the server dies first). A non-local
# URL (or START_RETRIEVER=0) uses that server and starts none. Watch it with: tmux attach -t slime-search-r1
# Everything is Python's (python -m slime_search_r1.launch.with_retrieval; python -m slime_search_r1.launch --list
# prints its variables: RETRIEVER_ARGS holds the server's flags).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"

PYTHONPATH="${SCRIPT_DIR}${PYTHONPATH:+:${PYTHONPATH}}" exec "${PYTHON_BIN:-python3}" \
   -m slime_search_r1.launch.with_retrieval "${SCRIPT_DIR}/generate_with_search.py" "$@"
