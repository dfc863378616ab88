"""Run by Python at start-up when this folder is on PYTHONPATH (real-slime test runs only, see slime_compat)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from slime_compat import install_missing_heavy_modules  # noqa: E402

install_missing_heavy_modules()
