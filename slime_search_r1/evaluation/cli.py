"""evaluate.py's commands: run an evaluation, `compare` several, `rescore` one without generating again.

    python evaluate.py --data test.parquet --hf-checkpoint MODEL --sglang-url URL --output-dir DIR [options]
    python evaluate.py compare DIR DIR ... --output OUT [--labels a,b,...]
    python evaluate.py rescore DIR [--judge-url URL --judge-model NAME] [--reference NAME|FILE]

Each command parses its line (arguments.py), then does its steps in order: a run selects the rows (dataset.py),
generates and scores the missing ones (runner.py), asks the judge (judging.py), and writes the report (reports.py).
Exit codes: 0 done, 1 samples raised or answers were left unjudged, 2 a bad setting or input, 130 interrupted.
"""

import asyncio
import json
import logging
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from slime_search_r1.evaluation.arguments import parse_args, parse_compare_args, parse_rescore_args
from slime_search_r1.evaluation.comparison import (
    COMPARISON_MD,
    COMPARISON_PNG,
    ComparisonError,
    load_results,
    write_comparison,
)
from slime_search_r1.evaluation.dataset import (
    ColumnNames,
    DatasetError,
    read_rows,
    select_rows,
    source_names,
    with_samples,
)
from slime_search_r1.evaluation.judging import JUDGE_JSON, JUDGEMENTS, judge_pending, unjudged_message
from slime_search_r1.evaluation.references import ReferenceError, load_reference
from slime_search_r1.evaluation.reports import RESULTS_JSON, report
from slime_search_r1.evaluation.runner import Evaluation, PreflightError, apply_cli_overrides, preflight, run_config
from slime_search_r1.evaluation.store import (
    RETRIED_STATUSES,
    RUN_CONFIG,
    ResumeMismatch,
    TrajectoryStore,
    check_run_config,
)
from slime_search_r1.scoring.answers import rule_scores
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config

# write_viewer(output_dir, hf_checkpoint, tokenizer or None, trajectories per data source): the run's viewer page
WriteViewer = Callable[[Path, str, object, int], None]


def main(argv: list[str] | None, load_plugin: Callable[[], tuple], write_viewer: WriteViewer) -> int:
    """evaluate.py, whichever command `argv` names. `load_plugin()` gives the plugin module (generate, reward_func,
    SEARCH_R1_CONFIGS) and slime's Sample class; `write_viewer` writes the run's viewer page (--viewer). evaluate.py
    passes both: the plugin it imports, and its write_viewer, which builds the page with the viewer package."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    if argv[:1] == ["rescore"]:
        return rescore_main(argv[1:])
    return run_main(argv, load_plugin, write_viewer)


def run_main(argv: list[str], load_plugin: Callable[[], tuple], write_viewer: WriteViewer) -> int:
    """One evaluation: the selected rows not yet in trajectories.jsonl through the plugin, the judge, the report."""
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
        tokenizer = evaluation.tokenizer if evaluation is not None else None
        write_viewer(cli.output_dir, cli.hf_checkpoint, tokenizer, cli.viewer_samples)

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
    for record in records:  # the answer scores of the recorded answer, computed again by scoring/answers.py
        if "answer" in record and record.get("golden_answers") is not None:
            scores = rule_scores(record["answer"], record["golden_answers"])
            record.update({name: value for name, value in scores.items() if name != "em"})  # EM stays reward_func's
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


def _error(message: str, command: str = "evaluate.py") -> int:
    print(f"{command}: error: {message}", file=sys.stderr)
    return 2
