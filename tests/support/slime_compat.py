"""Which slime the tests run against: the stand-in in tests/slime_stub, or a real checkout named by SLIME_SRC.

    make test                              # the stand-in (CI)
    SLIME_SRC=/path/to/slime make test     # slime itself; in slime's docker image: SLIME_SRC=/root/slime

slime's CPU-side modules import a few packages only its GPU image has (ray, sglang_router, wandb); like
slime's own CPU contract tests (tests/plugin_contracts/_shared.py), an empty module stands in for each one
that is not installed. Nothing else of slime is replaced. Importing this module makes the choice, so
conftest imports it first.
"""

import functools
import os
import sys
import types
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
STUB = TESTS / "slime_stub"
# sitecustomize.py there runs install_missing_heavy_modules() in subprocesses (evaluate.py, the wrapper's training)
SITE = Path(__file__).resolve().parent / "slime_site"
HEAVY_MODULES = ("ray", "sglang_router", "wandb")


def slime_src() -> Path | None:
    value = os.environ.get("SLIME_SRC", "").strip()
    if not value:
        return None
    path = Path(value).expanduser().resolve()
    if not (path / "slime" / "utils" / "types.py").is_file():
        raise RuntimeError(f"SLIME_SRC={value} is not a slime checkout (no slime/utils/types.py under it)")
    return path


def slime_root() -> Path:
    """The folder that holds the `slime` package the tests import."""
    return slime_src() or STUB


def using_real_slime() -> bool:
    return slime_src() is not None


def install_missing_heavy_modules() -> None:
    """An empty module for each of HEAVY_MODULES that cannot be imported (real slime mode only)."""
    if not using_real_slime():
        return
    for name in HEAVY_MODULES:
        if name in sys.modules:
            continue
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            if name == "ray":
                module._private = types.SimpleNamespace(
                    services=types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1")
                )
            sys.modules[name] = module


def activate() -> None:
    """Put the chosen slime first on sys.path (pytest's ini puts the stand-in there); runs when this is imported."""
    chosen = str(slime_root())
    if sys.path[:1] == [chosen]:
        return
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (STUB, slime_root())]
    sys.path.insert(0, chosen)
    install_missing_heavy_modules()


activate()


def subprocess_pythonpath(*extra: Path) -> str:
    """PYTHONPATH for a child process that imports the plugin and slime the way the tests do."""
    paths = [ROOT, slime_root(), *extra]
    if using_real_slime():
        paths.append(SITE)
    return os.pathsep.join(str(p) for p in paths)


def slime_src_env() -> dict[str, str]:
    """SLIME_SRC for a child process given an environment of its own (empty when the stand-in is used)."""
    return {"SLIME_SRC": str(slime_src())} if using_real_slime() else {}


def reset_generate_state() -> None:
    """Forget slime's GenerateState singleton so the next GenerateState(args) is built from the test's args."""
    from slime.rollout import sglang_rollout

    if using_real_slime() and not hasattr(sglang_rollout.load_tokenizer, "cache_info"):
        # slime loads them once per process (~3 s here); the tests rebuild the singleton for every test
        sglang_rollout.load_tokenizer = functools.cache(sglang_rollout.load_tokenizer)
        sglang_rollout.load_processor = functools.cache(sglang_rollout.load_processor)
    sglang_rollout.GenerateState.clear_instances()


def reset_http_client() -> None:
    """Drop slime's global httpx client: its pooled connections belong to the test's finished event loop."""
    from slime.utils import http_utils

    http_utils._http_client = None


async def close_http_client() -> None:
    """Close slime's global httpx client inside the loop that used it, then drop it (for tests that run a loop
    of their own per example, as hypothesis does)."""
    from slime.utils import http_utils

    if http_utils._http_client is not None:
        await http_utils._http_client.aclose()
    http_utils._http_client = None


def slime_argument_parser(monkeypatch):
    """slime's own argument parser (slime/utils/arguments.py's flag provider) from the checkout SLIME_SRC names.

    That module imports SGLang's ServerArgs and sglang_router's RouterArgs at the top, for the --sglang-* flags it
    copies from SGLang; neither installs here, so empty stand-ins (for this test only) let it import. slime's own
    flags are then slime's, with slime's types and choices; SGLang's and Megatron's are not in this parser.
    """
    import argparse

    server_args = types.ModuleType("sglang.srt.server_args")
    server_args.ServerArgs = type("ServerArgs", (), {"add_cli_args": staticmethod(lambda parser: None)})
    launch_router = types.ModuleType("sglang_router.launch_router")
    launch_router.RouterArgs = type("RouterArgs", (), {})
    for name, module in [
        ("sglang", types.ModuleType("sglang")),
        ("sglang.srt", types.ModuleType("sglang.srt")),
        ("sglang.srt.server_args", server_args),
        ("sglang_router.launch_router", launch_router),
    ]:
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, module)
    from slime.utils.arguments import get_slime_extra_args_provider

    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    return get_slime_extra_args_provider()(parser)
