"""evaluate.py's command lines, parsed and checked: a run, `compare` and `rescore`.

    python evaluate.py --data test.parquet --hf-checkpoint MODEL --sglang-url URL --output-dir DIR [options]
    python evaluate.py compare DIR DIR ... --output OUT [--labels a,b,...]
    python evaluate.py rescore DIR [--judge-url URL --judge-model NAME] [--reference NAME|FILE]

Every setting is checked here, before any engine or judge call; a bad one is argparse's error (exit 2): one line
naming it and what it accepts. The judge flags become a ready JudgeClient (args.judge, None without a judge).
"""

import argparse
import json
from argparse import Namespace
from pathlib import Path
from urllib.parse import urlsplit

from slime_search_r1.evaluation.comparison import COMPARISON_MD, COMPARISON_PNG
from slime_search_r1.evaluation.judging import JUDGEMENTS
from slime_search_r1.evaluation.references import is_reference, shipped
from slime_search_r1.evaluation.store import RUN_CONFIG, TRAJECTORIES
from slime_search_r1.http_client import RETRY_AFTER_MAX_S
from slime_search_r1.scoring.judge import DEFAULT_PROMPT, JudgeClient, JudgeConfig, JudgePrompt, JudgeSetupError


def parse_args(argv: list[str] | None = None) -> Namespace:
    parser = argparse.ArgumentParser(
        prog="evaluate.py",
        description="Search-R1 evaluation: the plugin's generate + reward over a test file; EM, F1, cover EM and an "
        "optional LLM judge's verdicts per data source.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Compare several output folders (one per checkpoint): python evaluate.py compare --help. Score a run "
        "again (a judge, a reference) without generating: python evaluate.py rescore --help",
    )
    parser.add_argument("--data", required=True, type=Path, help="test file (.parquet or .jsonl)")
    parser.add_argument("--hf-checkpoint", required=True, help="model folder: tokenizer and chat template")
    parser.add_argument("--sglang-url", default="http://127.0.0.1:30000", help="SGLang server or router")
    parser.add_argument("--output-dir", type=Path, default=Path("eval_output"))
    parser.add_argument("--data-sources", default=None, help="comma-separated subset, e.g. nq,hotpotqa")
    parser.add_argument("--limit", type=positive_int, default=None, help="at most this many rows per data source")
    parser.add_argument("--concurrency", type=positive_int, default=64, help="samples in flight")
    parser.add_argument(
        "--max-response-len", type=positive_int, default=2048, help="token budget of the whole multi-turn response"
    )
    parser.add_argument("--max-context-len", type=positive_int, default=None, help="prompt + response cap")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy, as Search-R1's validation")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument(
        "--samples-per-question",
        type=positive_int,
        default=1,
        metavar="K",
        help="sample each question K times (needs --temperature > 0); reports avg@K and pass@K of every score",
    )
    parser.add_argument("--llm-api-mode", choices=("generate", "chat"), default=None, help="default: $LLM_API_MODE")
    parser.add_argument("--retrieval-url", default=None, help="retrieval server(s); default: $RETRIEVAL_SERVER_URL")
    parser.add_argument("--input-key", default="prompt")
    parser.add_argument("--label-key", default="reward_model")
    parser.add_argument("--tool-key", default="tools")
    parser.add_argument("--data-source-key", default="data_source")
    parser.add_argument(
        "--apply-chat-template-kwargs",
        type=json_object,
        default={},
        help="extra chat-template arguments as JSON, as slime's flag (e.g. '{\"enable_thinking\": false}')",
    )
    parser.add_argument("--max-errors", type=int, default=20, help="stop after this many samples raise")
    parser.add_argument(
        "--reference",
        default=None,
        metavar="NAME|FILE",
        help=f"put a paper's figures per data source beside this run's: a shipped table ({', '.join(shipped())}) "
        "or your own .json file (docs/evaluation.md)",
    )
    parser.add_argument(
        "--viewer",
        action="store_true",
        help="record each trajectory's prompt, token ids, loss mask and log probs in trajectories.jsonl and write "
        "viewer/index.html, an offline page of the run (python -m slime_search_r1.viewer)",
    )
    parser.add_argument(
        "--viewer-samples",
        type=positive_int,
        default=200,
        help="trajectories per data source on the viewer page (its figures count all)",
    )
    parser.add_argument("--overwrite", action="store_true", help="discard an earlier run in --output-dir")
    add_judge_arguments(parser)
    args = parser.parse_args(argv)

    split = urlsplit(args.sglang_url)
    if split.scheme != "http" or not split.hostname:
        parser.error(f"--sglang-url must look like http://host:port, got {args.sglang_url!r}")
    if not 0.0 < args.top_p <= 1.0:
        parser.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.temperature < 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    if args.samples_per_question > 1 and args.temperature == 0:
        parser.error(
            f"--samples-per-question {args.samples_per_question} needs --temperature > 0 (greedy decoding gives the "
            "same answer every time); e.g. --temperature 0.6 --top-p 0.95"
        )
    check_reference(parser, args.reference)
    args.judge = judge_from_args(parser, args)
    args.data_sources = [s.strip() for s in args.data_sources.split(",") if s.strip()] if args.data_sources else None
    return args


def parse_compare_args(argv: list[str]) -> Namespace:
    parser = argparse.ArgumentParser(
        prog="evaluate.py compare",
        description="Every score per data source across several evaluate.py output folders (one per checkpoint): "
        f"{COMPARISON_MD} (a table per score) and {COMPARISON_PNG} (a panel per score, one line per source).",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="evaluate.py --output-dir folders, in checkpoint order")
    parser.add_argument("--output", required=True, type=Path, help="folder for the table and the chart")
    parser.add_argument("--labels", default=None, help="comma-separated names of the runs (default: folder names)")
    args = parser.parse_args(argv)
    if args.labels is None:
        args.labels = [run.resolve().name for run in args.runs]
        if len(set(args.labels)) < len(args.labels):
            parser.error(f"the folders' names repeat ({', '.join(args.labels)}); name the runs with --labels")
    else:
        args.labels = [label.strip() for label in args.labels.split(",")]
        if len(args.labels) != len(args.runs) or not all(args.labels):
            parser.error(f"--labels needs {len(args.runs)} non-empty comma-separated names, got {len(args.labels)}")
    return args


def parse_rescore_args(argv: list[str]) -> Namespace:
    parser = argparse.ArgumentParser(
        prog="evaluate.py rescore",
        description="Score an evaluate.py output folder again without generating: F1 and cover EM from the recorded "
        f"answers, an LLM judge for the answers without a usable verdict ({JUDGEMENTS}), a reference beside it; "
        "rewrites results.md, results.json and the chart.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("output_dir", type=Path, help="an evaluate.py --output-dir")
    parser.add_argument("--reference", default=None, metavar="NAME|FILE", help="as evaluate.py --reference")
    add_judge_arguments(parser)
    args = parser.parse_args(argv)
    for name in (RUN_CONFIG, TRAJECTORIES):
        if not (args.output_dir / name).is_file():
            parser.error(f"{args.output_dir / name} not found: is {args.output_dir} an evaluate.py --output-dir?")
    check_reference(parser, args.reference)
    args.judge = judge_from_args(parser, args)
    return args


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "LLM judge (any OpenAI-compatible chat endpoint; verdicts kept in judgements.jsonl)"
    )
    group.add_argument("--judge-url", default=None, help="e.g. http://127.0.0.1:8000/v1 (POSTs to /chat/completions)")
    group.add_argument("--judge-model", default=None, help="the model name the endpoint serves")
    group.add_argument(
        "--judge-api-key-env",
        default="JUDGE_API_KEY",
        help="environment variable holding the endpoint's API key, sent as a bearer token (none sent when unset)",
    )
    group.add_argument(
        "--judge-prompt",
        type=Path,
        default=DEFAULT_PROMPT,
        help="prompt file with {question} {gold_answers} {prediction}",
    )
    group.add_argument("--judge-concurrency", type=positive_int, default=32, help="judge requests in flight")
    group.add_argument(
        "--judge-attempts",
        type=positive_int,
        default=4,
        help=f"tries per answer (retries included; a server's Retry-After is obeyed, up to {RETRY_AFTER_MAX_S:g} s)",
    )
    group.add_argument("--judge-timeout", type=positive_float, default=60.0, help="seconds per judge request")
    group.add_argument(
        "--judge-max-tokens",
        type=positive_int,
        default=1024,
        help="max_tokens of the judge's reply; a reply cut off there is marked invalid (give a reasoning judge room)",
    )


def judge_from_args(parser: argparse.ArgumentParser, args: Namespace) -> JudgeClient | None:
    """The judge the flags describe, or None; a flag that cannot work is a parser error (exit 2, nothing run)."""
    if args.judge_url is None and args.judge_model is None:
        return None
    if args.judge_model is None:
        parser.error("--judge-url needs --judge-model (the model name the endpoint serves, e.g. Qwen2.5-72B-Instruct)")
    if args.judge_url is None:
        parser.error("--judge-model needs --judge-url (the endpoint, e.g. http://127.0.0.1:8000/v1)")
    try:
        prompt = JudgePrompt.load(args.judge_prompt)
    except JudgeSetupError as exc:
        parser.error(f"--judge-prompt: {exc}")
    try:
        config = JudgeConfig(
            url=args.judge_url,
            model=args.judge_model,
            api_key_env=args.judge_api_key_env,
            concurrency=args.judge_concurrency,
            attempts=args.judge_attempts,
            timeout=args.judge_timeout,
            max_tokens=args.judge_max_tokens,
        )
    except JudgeSetupError as exc:
        parser.error(f"--judge-url: {exc}" if "URL" in str(exc) else f"judge: {exc}")
    return JudgeClient(config, prompt)


def check_reference(parser: argparse.ArgumentParser, value: str | None) -> None:
    if value is not None and not is_reference(value):
        parser.error(
            f"argument --reference: invalid choice: {value!r} (choose from {', '.join(map(repr, shipped()))}, "
            "or the path of a .json reference file)"
        )
