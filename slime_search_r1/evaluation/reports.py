"""A run's report: results.md (every score per data source, and a paper's figures beside them with --reference),
results.json (the same figures for scripts, with the run's settings) and the chart, all written and printed by
report() at the end of a run and of `evaluate.py rescore`.
"""

import json
import sys
from pathlib import Path

from slime_search_r1.evaluation.chart import write_em_chart
from slime_search_r1.evaluation.judging import JUDGEMENTS, identity_of, recorded_judge, with_verdicts
from slime_search_r1.evaluation.references import beside_paper, beside_paper_markdown
from slime_search_r1.evaluation.store import TrajectoryStore
from slime_search_r1.registry import reward_names
from slime_search_r1.evaluation.summary import format_score, score_label, summarize
from slime_search_r1.standin import SCRIPTED_LABEL
from slime_search_r1.scoring.judge import JudgeClient

RESULTS_MD = "results.md"
RESULTS_JSON = "results.json"


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
    print(f"evaluate.py: results in {output_dir}/{RESULTS_MD}, {RESULTS_JSON}{chart}", file=sys.stderr)
    return summary


def write_reports(output_dir: Path, summary: dict, run_config: dict, references: list[dict] | None = None) -> None:
    """results.json and results.md; `references` (evaluation/references.py's beside_paper) adds the papers'
    figures."""
    extra = {"references": references} if references else {}
    (output_dir / RESULTS_JSON).write_text(
        json.dumps({"run_config": run_config, **summary, **extra}, indent=2) + "\n", encoding="utf-8"
    )
    markdown = markdown_report(summary, run_config)
    if references:
        markdown += "\n" + references_markdown(references, summary.get("samples_per_question", 1))
    (output_dir / RESULTS_MD).write_text(markdown, encoding="utf-8")


def markdown_report(summary: dict, run_config: dict) -> str:
    k = summary.get("samples_per_question", 1)
    keys = summary.get("scores", ["em"])
    judged = "judge" in summary
    sampling = "greedy" if not run_config.get("temperature") else f"temperature {run_config.get('temperature')}"
    if run_config.get("temperature"):
        sampling += f", top-p {run_config.get('top_p')}, top-k {run_config.get('top_k')}"
    checkpoint = run_config.get("hf_checkpoint")
    scripted = bool(summary.get("scripted"))
    lines = [
        f"# Search-R1 evaluation of a {SCRIPTED_LABEL}" if scripted else "# Search-R1 evaluation",
        "",
        f"- model: none, a {SCRIPTED_LABEL} wrote every turn (python -m slime_search_r1.standin), with the tokenizer "
        f"`{checkpoint}`: these figures show the plugin's mechanics, not a model's quality"
        if scripted
        else f"- model: `{checkpoint}`",
        f"- data: `{run_config.get('data')}`",
        f"- mode: {run_config.get('llm_api_mode')}, {sampling}, {k} sample{'s' if k > 1 else ''} per question, "
        f"max response {run_config.get('max_response_len')} tokens, max turns {run_config.get('max_turns')}, "
        f"top-{run_config.get('topk')} documents",
        f"- trajectories: {summary['n']} of {summary['selected']}"
        + ("" if summary["complete"] else " (incomplete: rerun the same command to resume)"),
    ]
    if judged:
        judge = summary["judge"]
        lines.append(
            f"- judge: `{judge.get('model')}` at {judge.get('url')}, prompt `{judge.get('prompt_file')}` "
            f"(sha256 {str(judge.get('prompt_sha256'))[:12]}); {summary['unjudged']} trajectories unjudged"
            + (" (rerun, or `evaluate.py rescore`, to ask again)" if summary["unjudged"] else "")
        )
    labels = [score_label(key, k) for key in keys]
    extra = ["unjudged"] if judged else []
    lines += [
        "",
        "| data source | n | "
        + " | ".join(labels)
        + " | searches / sample | turns / sample | not completed | "
        + "".join(f"{e} | " for e in extra),
        "|---|---:|" + "---:|" * (len(labels) + 3 + len(extra)),
    ]
    for source, stats in summary["data_sources"].items():
        not_completed = sum(count for status, count in stats["statuses"].items() if status != "completed")
        cells = [source, str(stats["n"]), *(format_score(stats.get(key)) for key in keys)]
        cells += [format_score(stats["mean_searches"], 2), format_score(stats["mean_turns"], 2), str(not_completed)]
        cells += [str(stats["unjudged"])] if judged else []
        lines.append("| " + " | ".join(cells) + " |")
    averages = [f"**{format_score(summary.get(f'average_{key}'))}**" for key in keys]
    lines.append(
        f"| **average** (mean over data sources) | {summary['n']} | "
        + " | ".join(averages)
        + " | | | |"
        + " |" * len(extra)
    )
    micro = ", ".join(
        f"{label} {format_score(summary.get(f'micro_{key}'))}" for key, label in zip(keys, labels, strict=True)
    )
    lines += ["", f"Mean over all questions: {micro}.", ""]
    lines += [
        "n: trajectories (questions x samples); searches / sample, turns / sample: means over them; not completed: "
        "trajectories whose status is not completed (truncated, failed, aborted: each counted in results.json).",
        "",
    ]
    if k > 1:
        lines += [
            f"avg@{k}: the mean of a question's scores; pass@{k}: the expected best of {k} samples drawn from a "
            f"question's n >= {k} scored ones (Chen et al.'s unbiased pass@k for 0/1 scores; with n = {k} samples the "
            "best of them: 1 when any is right, the best F1 for F1). Both are averaged over the questions of a data "
            "source.",
            "",
        ]
        short = [f"{score_label(key)} {summary[f'{key}_short']}" for key in keys if summary.get(f"{key}_short")]
        if short:
            lines += [
                f"**Left out of pass@{k}:** questions with fewer than {k} scored samples (unjudged, or the run "
                f"incomplete): {', '.join(short)}.",
                "",
            ]
    return "\n".join(lines)


def references_markdown(comparisons: list[dict], samples_per_question: int = 1) -> str:
    """Each reference's comparisons (evaluation/references.py's beside_paper) as one Markdown section."""
    labels = {score: score_label(score) for score in reward_names()}
    run_labels = {score: score_label(score, samples_per_question) for score in reward_names()}
    by_name: dict[str, list[dict]] = {}
    for comparison in comparisons:
        by_name.setdefault(comparison["name"], []).append(comparison)
    return "\n".join(beside_paper_markdown(group, labels, run_labels) for group in by_name.values())
