"""evaluate.py's command lines: run an evaluation, `compare` several, `rescore` one without generating again.

    python evaluate.py --data test.parquet --hf-checkpoint MODEL --sglang-url URL --output-dir DIR [options]
    python evaluate.py compare DIR DIR ... --output OUT [--labels a,b,...]
    python evaluate.py rescore DIR [--judge-url URL --judge-model NAME] [--reference NAME|FILE]

Every setting is checked before any engine or judge call; a bad one is one line naming it and what it accepts.
"""

import argparse
import asyncio
import json
import logging
import sys
from argparse import Namespace
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from slime_search_r1.evaluation.dataset import (
    ColumnNames,
    DatasetError,
    read_rows,
    select_rows,
    source_names,
    with_samples,
)
from slime_search_r1.evaluation.judging import (
    JUDGE_JSON,
    JUDGEMENTS,
    identity_of,
    judge_run,
    pending,
    recorded_judge,
    with_verdicts,
)
from slime_search_r1.evaluation.references import ReferenceError, beside_paper, is_reference, load_reference, shipped
from slime_search_r1.evaluation.reports import (
    COMPARISON_MD,
    COMPARISON_PNG,
    RESULTS_JSON,
    RETRIED_STATUSES,
    RUN_CONFIG,
    ComparisonError,
    ResumeMismatch,
    TrajectoryStore,
    check_run_config,
    load_results,
    markdown_report,
    references_markdown,
    summarize,
    write_comparison,
    write_em_chart,
    write_reports,
)
from slime_search_r1.evaluation.runner import (
    Evaluation,
    PreflightError,
    apply_cli_overrides,
    preflight,
    run_config,
    write_viewer,
)
from slime_search_r1.http_client import RETRY_AFTER_MAX_S
from slime_search_r1.scoring.answers import rule_scores
from slime_search_r1.scoring.judge import DEFAULT_PROMPT, JudgeClient, JudgeConfig, JudgePrompt, JudgeSetupError
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config


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
        "or your own .json file (README: Evaluation)",
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
    for name in (RUN_CONFIG, "trajectories.jsonl"):
        if not (args.output_dir / name).is_file():
            parser.error(f"{args.output_dir / name} not found: is {args.output_dir} an evaluate.py --output-dir?")
    check_reference(parser, args.reference)
    args.judge = judge_from_args(parser, args)
    return args


def _error(message: str, command: str = "evaluate.py") -> int:
    print(f"{command}: error: {message}", file=sys.stderr)
    return 2


def compare_main(argv: list[str]) -> int:
    cli = parse_compare_args(argv)
    try:
        runs = [load_results(run) for run in cli.runs]
    except ComparisonError as exc:
        return _error(str(exc), "evaluate.py compare")
    try:
        write_comparison(cli.output, cli.labels, runs)
    except ImportError as exc:
        print(
            f"evaluate.py compare: wrote {cli.output / COMPARISON_MD}; no chart: {exc} (pip install matplotlib)",
            file=sys.stderr,
        )
        return 0
    print(f"evaluate.py compare: {cli.output / COMPARISON_MD} and {cli.output / COMPARISON_PNG}", file=sys.stderr)
    return 0


def judge_pending(judge: JudgeClient | None, records: list[dict], output_dir: Path) -> None:
    """Ask the judge about the records without a usable verdict from it (none when no judge is given)."""
    if judge is None:
        return
    verdicts = TrajectoryStore(output_dir, JUDGEMENTS).load()
    todo = pending(records, verdicts, judge.identity)
    unanswerable = sum("answer" not in record for record in records)
    if unanswerable:
        print(
            f"evaluate.py: warning: {unanswerable} trajectories were written before evaluate.py recorded answers; "
            "they stay unjudged (rerun them with --overwrite)",
            file=sys.stderr,
        )
    print(f"evaluate.py: judge {judge.config.model}: {len(todo)} answers to judge", file=sys.stderr)
    if todo:
        judge_run(judge, todo, output_dir)


def report(
    output_dir: Path,
    records: list[dict],
    selected_per_source: dict[str, int],
    settings: dict,
    samples_per_question: int,
    judge: JudgeClient | None,
    reference,
) -> dict:
    """results.md, results.json and the chart from the records (and the verdicts of the judge given, or of the judge
    that last ran here), printed as well; returns the summary."""
    described = judge.describe() if judge is not None else recorded_judge(output_dir)
    if described is not None:
        verdicts = TrajectoryStore(output_dir, JUDGEMENTS).load()
        records = with_verdicts(records, verdicts, identity_of(described))
    summary = summarize(records, selected_per_source, samples_per_question, described)
    comparisons = beside_paper(summary, reference) if reference is not None else None
    write_reports(output_dir, summary, settings, comparisons)
    print(markdown_report(summary, settings))  # stdout is results.md; results.json is the file for scripts
    if comparisons:
        print(references_markdown(comparisons, samples_per_question))
    try:
        chart = f", {write_em_chart(output_dir, summary, settings, comparisons).name}"
    except ImportError as exc:  # the results are written; only the picture is missing
        chart = ""
        print(f"evaluate.py: warning: no chart ({exc}); pip install matplotlib", file=sys.stderr)
    print(f"evaluate.py: results in {output_dir}/results.md, results.json{chart}", file=sys.stderr)
    return summary


def unjudged_message(summary: dict) -> str | None:
    if not summary.get("unjudged"):
        return None
    return (
        f"{summary['unjudged']} trajectories have no usable verdict (marked error or invalid in {JUDGEMENTS}, with "
        "the judge's reply and the error); rerun the same command, or evaluate.py rescore with the judge flags, to "
        "ask again"
    )


def rescore_main(argv: list[str]) -> int:
    cli = parse_rescore_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    output_dir = cli.output_dir
    settings = json.loads((output_dir / RUN_CONFIG).read_text(encoding="utf-8"))
    records = list(TrajectoryStore(output_dir).load().values())
    previous = {}
    if (output_dir / RESULTS_JSON).is_file():
        previous = json.loads((output_dir / RESULTS_JSON).read_text(encoding="utf-8"))
    selected = {source: stats["selected"] for source, stats in (previous.get("data_sources") or {}).items()}
    selected = selected or dict(Counter(record["data_source"] for record in records))
    try:
        reference = load_reference(cli.reference, set(selected)) if cli.reference else None
    except ReferenceError as exc:
        return _error(str(exc), "evaluate.py rescore")
    for record in records:  # F1 and cover EM of the recorded answer, as scoring/answers.py gives them now
        if "answer" in record and record.get("golden_answers") is not None:
            scores = rule_scores(record["answer"], record["golden_answers"])
            record.update(f1=scores["f1"], cover_em=scores["cover_em"])  # EM stays reward_func's
    interrupted = False
    try:
        judge_pending(cli.judge, records, output_dir)
    except KeyboardInterrupt:
        interrupted = True
    summary = report(
        output_dir, records, selected, settings, settings.get("samples_per_question", 1), cli.judge, reference
    )
    if interrupted:
        print("evaluate.py rescore: interrupted; rerun the same command to go on", file=sys.stderr)
        return 130
    message = unjudged_message(summary) if cli.judge is not None else None
    if message:
        print(f"evaluate.py rescore: {message}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None, load_plugin: Callable[[], tuple]) -> int:
    """evaluate.py: `load_plugin()` gives the plugin module (generate, reward_func, SEARCH_R1_CONFIGS) and slime's
    Sample class; evaluate.py passes one that imports generate_with_search."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    if argv[:1] == ["rescore"]:
        return rescore_main(argv[1:])
    cli = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    try:
        rows = read_rows(cli.data)
        columns = ColumnNames(cli.input_key, cli.label_key, cli.tool_key, data_source_key=cli.data_source_key)
        questions = select_rows(rows, columns, cli.data_sources, cli.limit)
        reference = load_reference(cli.reference, source_names(rows, columns)) if cli.reference else None
    except (DatasetError, ReferenceError) as exc:
        return _error(str(exc))
    del rows
    selected = with_samples(questions, cli.samples_per_question)

    plugin, sample_cls = load_plugin()
    try:
        apply_cli_overrides(cli, plugin.SEARCH_R1_CONFIGS)
        config = resolve_config(plugin.SEARCH_R1_CONFIGS)
    except ConfigError as exc:
        return _error(str(exc))

    cli.output_dir.mkdir(parents=True, exist_ok=True)
    store = TrajectoryStore(cli.output_dir)
    settings = run_config(cli, config)
    if cli.overwrite:
        for path in (
            store.path,
            cli.output_dir / RUN_CONFIG,
            cli.output_dir / JUDGEMENTS,
            cli.output_dir / JUDGE_JSON,
        ):
            path.unlink(missing_ok=True)
    try:
        check_run_config(cli.output_dir, settings)
    except ResumeMismatch as exc:
        return _error(str(exc))

    finished = {k: r for k, r in store.load().items() if r.get("status") not in RETRIED_STATUSES}
    todo = [row for row in selected if row.key not in finished]
    print(
        f"evaluate.py: {len(selected)} samples selected ({len(questions)} questions x {cli.samples_per_question}), "
        f"{len(selected) - len(todo)} already in {store.path}, {len(todo)} to run",
        file=sys.stderr,
    )

    interrupted = False
    evaluation = None
    if todo:
        try:
            preflight(cli, config)
        except PreflightError as exc:
            return _error(str(exc))
        evaluation = Evaluation(cli, plugin, sample_cls, config, store, columns)
        store.open()
        try:
            asyncio.run(evaluation.run(todo))
        except KeyboardInterrupt:
            interrupted = True
        except ConfigError as exc:
            return _error(str(exc))
        finally:
            store.close()

    selected_keys = {row.key for row in selected}
    records = [r for k, r in store.load().items() if k in selected_keys]
    if not interrupted:
        try:
            judge_pending(cli.judge, records, cli.output_dir)
        except KeyboardInterrupt:
            interrupted = True
    summary = report(
        cli.output_dir,
        records,
        dict(Counter(row.data_source for row in selected)),
        settings,
        cli.samples_per_question,
        cli.judge,
        reference,
    )
    if cli.viewer:
        write_viewer(cli, evaluation.tokenizer if evaluation is not None else None)

    if interrupted:
        print("evaluate.py: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    status = 0
    if evaluation is not None and evaluation.errors:
        print(
            f"evaluate.py: {len(evaluation.errors)} samples raised and were not written (first: "
            f"{evaluation.errors[0]}); rerun the same command to retry them",
            file=sys.stderr,
        )
        status = 1
    message = unjudged_message(summary) if cli.judge is not None else None
    if message:
        print(f"evaluate.py: {message}", file=sys.stderr)
        status = 1
    return status
