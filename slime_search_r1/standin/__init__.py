"""A scripted stand-in for SGLang that anyone can serve: `python -m slime_search_r1.standin --tokenizer DIR`.

It answers SGLang's /generate as SGLang's source says, and writes every turn from a script instead of a model, so
that evaluate.py, the viewer and an extension of one's own run end to end on a laptop. It says so on every answer:
meta_info.weight_version is SCRIPTED_WEIGHT_VERSION (SGLang's answers name the weights that sampled them; a
stand-in's are a script), which the plugin records per engine call, so that evaluate.py's reports and the viewer's
pages made from its answers say "scripted stand-in" in their titles.

  sglang_rules.py  where SGLang ends a request and what its answer holds (the test suite's engine uses them too)
  model.py         how the scripted model ends its turns, its EOS, its log probs, how it reads its context
  policy.py        what it writes: a search, a call to every other tool the prompt offers, then an answer
  server.py        the HTTP app (/generate, /health, /model_info) and serving it on 127.0.0.1
  __main__.py      the command line
"""

import importlib
import sys
from pathlib import Path

from slime_search_r1.episode import version_spans

SCRIPTED_WEIGHT_VERSION = "scripted-stand-in"  # meta_info.weight_version of every answer the stand-in gives
SCRIPTED_LABEL = "scripted stand-in"  # how reports and pages name an engine that answered with it
# slime's stand-in in this checkout: the names the plugin imports (tests/slime_stub/README.md)
SLIME_STUB = Path(__file__).resolve().parents[2] / "tests" / "slime_stub"


def scripted_record(record: dict | None) -> bool:
    """Whether an episode record's turns were written by the scripted stand-in (its weight version)."""
    return any(version == SCRIPTED_WEIGHT_VERSION for _, _, version in version_spans(record or {}))


def use_slime_stub() -> bool:
    """Whether slime's stand-in (SLIME_STUB) is here and imports, put on the path: what evaluate.py and the demo run
    on where slime is not installed."""
    if not (SLIME_STUB / "slime").is_dir():
        return False
    sys.path.append(str(SLIME_STUB))
    try:
        importlib.import_module("slime.utils.types")
    except ImportError:
        sys.path.remove(str(SLIME_STUB))
        return False
    return True
