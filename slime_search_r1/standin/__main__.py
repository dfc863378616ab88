"""python -m slime_search_r1.standin --tokenizer DIR [--port N] [--extensions my_tool]: serve the scripted stand-in.

    python -m slime_search_r1.standin --tokenizer .cache/qwen2.5-tokenizer --port 30000
    PYTHONPATH=examples python -m slime_search_r1.standin --tokenizer DIR --extensions calculator
    python evaluate.py --data q.parquet --hf-checkpoint DIR --sglang-url http://127.0.0.1:30000 --output-dir out

It serves SGLang's /generate on 127.0.0.1 (slime_search_r1/standin/server.py), every turn written from a script
(policy.py): a search, one call to every other tool the prompt offers (the registered ones, those of --extensions
included), then an answer. Nothing it writes is a model's: it shows the plugin's mechanics, not a model's quality,
and every answer says so (meta_info.weight_version "scripted-stand-in"). The tokenizer folder is a checkpoint's of
a model family the plugin knows (Qwen2.5, Qwen3, Qwen3.5, Llama 3.2: slime_search_r1/families), whose format the
chat-mode calls are written in (--model-family); `make rollout-demo` builds Qwen2.5's offline in
.cache/qwen2.5-tokenizer.
Ctrl-C or SIGTERM stops it (exit code 130 or 143).
"""

import argparse
import os
import sys
from pathlib import Path

from slime_search_r1.launch.signals import Stopped, stop_on_signals
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import import_extensions
from slime_search_r1.standin import SCRIPTED_LABEL, SCRIPTED_WEIGHT_VERSION
from slime_search_r1.standin.sglang_rules import VERSIONS

DEFAULT_PORT = 30000  # SGLang's own default


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m slime_search_r1.standin",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer folder (the checkpoint's)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default: {DEFAULT_PORT}, as SGLang's")
    parser.add_argument(
        "--extensions",
        default=os.environ.get("SEARCH_R1_EXTENSIONS", ""),
        help="modules that register tools of their own, comma-separated, found on PYTHONPATH, as "
        "SEARCH_R1_EXTENSIONS names them (default: that variable)",
    )
    parser.add_argument(
        "--sglang-version", choices=VERSIONS, default=VERSIONS[0], help="whose answers to give (default: %(default)s)"
    )
    parser.add_argument(
        "--model-family",
        default=os.environ.get("SEARCH_R1_MODEL_FAMILY", "auto"),
        help="how chat-mode calls and thoughts are written, as SEARCH_R1_MODEL_FAMILY names it (default: that "
        "variable, else auto: the family the tokenizer's chat template is placed in)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_signals()
    try:
        return serve(args)
    except Stopped as stopped:
        print(f"stand-in: stopped (exit code {stopped.code})", file=sys.stderr)
        return stopped.code


def serve(args: argparse.Namespace) -> int:
    try:
        import_extensions([name.strip() for name in args.extensions.split(",") if name.strip()], "--extensions")
    except ConfigError as exc:
        print(f"stand-in: error: {exc}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    from slime_search_r1.families.detection import tokenizer_family
    from slime_search_r1.standin.policy import StandInPolicy, registered_tools
    from slime_search_r1.standin.server import StandInEngine, serving

    if not Path(args.tokenizer).is_dir():
        print(
            f"stand-in: error: --tokenizer {args.tokenizer}: no such folder; accepted: a Hugging Face tokenizer's "
            "folder (make rollout-demo builds Qwen2.5's in .cache/qwen2.5-tokenizer)",
            file=sys.stderr,
        )
        return 2
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"stand-in: error: --tokenizer {args.tokenizer}: not a tokenizer folder ({first_line})", file=sys.stderr)
        return 2
    try:
        family = tokenizer_family(args.model_family, tokenizer)
    except (ConfigError, KeyError) as exc:
        print(f"stand-in: error: --model-family: {str(exc).strip(chr(34))}", file=sys.stderr)
        return 2
    tools = registered_tools()
    engine = StandInEngine(
        tokenizer, StandInPolicy(tools, family), tokenizer_path=str(args.tokenizer), version=args.sglang_version
    )
    try:
        with serving(engine.app, args.host, args.port) as thread:
            print(
                f"{SCRIPTED_LABEL} for SGLang {args.sglang_version} at http://{args.host}:{args.port}: every turn is "
                f"scripted, not a model's (meta_info.weight_version {SCRIPTED_WEIGHT_VERSION!r}); it searches, "
                f"calls each other tool the prompt offers ({', '.join(tools)} are registered), then answers, in "
                f"{family.name}'s format. Ctrl-C stops it.",
                flush=True,
            )
            thread.join()  # until a signal (Stopped), or the server ends on its own
    except RuntimeError as exc:
        print(f"stand-in: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
