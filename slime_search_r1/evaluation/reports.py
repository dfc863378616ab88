"""Evaluation output: trajectories as JSONL (append-only, resumable), every score per data source as Markdown, JSON
and a bar chart, and the comparison of several evaluations (one per checkpoint) as Markdown tables and line charts.

Scores: em (the plugin's reward_func, pure exact match), f1 and cover_em (scoring/answers.py), judge (an LLM judge's
verdicts, scoring/judge.py). With k samples per question each is avg@k (the mean of a question's scored samples) and
gets a pass@k beside it: the expected best score of k samples drawn from a question's n >= k scored ones (pass_at_k;
for 0/1 scores Chen et al.'s unbiased estimator, 1 - C(n-c, k) / C(n, k) with c right). A question with fewer than k
scored samples (unjudged, or the run incomplete) has no pass@k: it is left out of it and counted (`{key}_short`).
Both are means over the questions of a data source, and the average is the mean over data sources (Search-R1's "Avg").

Charts are drawn with matplotlib's Agg canvas (no display needed); matplotlib is imported only to draw them.
"""

import json
import math
from pathlib import Path
from statistics import fmean

from slime_search_r1.data import SEARCH_R1_DATA_SOURCES
from slime_search_r1.evaluation.references import beside_paper_markdown

TRAJECTORIES = "trajectories.jsonl"
RUN_CONFIG = "run_config.json"
RESULTS_MD = "results.md"
RESULTS_JSON = "results.json"
RESULTS_PNG = "em_by_source.png"  # every score, EM first (the name predates the other scores)
COMPARISON_MD = "comparison.md"
COMPARISON_PNG = "comparison.png"
# Settings that may differ between the evaluations being compared (the checkpoint is the point of comparing).
COMPARED_FREELY = ("hf_checkpoint",)

# A trajectory that ended like this is evaluated again on resume (a search outage is not the model's fault).
RETRIED_STATUSES = ("failed", "aborted")

BASE_SCORES = ("em", "f1", "cover_em", "judge")
_NAMES = {"em": "EM", "f1": "F1", "cover_em": "cover EM", "judge": "judge"}


def pass_key(score: str, k: int) -> str:
    return f"{score}_pass@{k}"


def score_label(key: str, samples_per_question: int = 1) -> str:
    """EM, F1, cover EM, judge; "EM avg@4" with 4 samples per question; "EM pass@4" for em_pass@4."""
    base, _, k = key.partition("_pass@")
    name = _NAMES.get(base, base)
    if k:
        return f"{name} pass@{k}"
    return f"{name} avg@{samples_per_question}" if samples_per_question > 1 else name


class ResumeMismatch(RuntimeError):
    """The output folder holds a run made with other settings."""


class TrajectoryStore:
    """A JSONL file of one object per finished sample (trajectories.jsonl, judgements.jsonl), flushed per line."""

    def __init__(self, output_dir: Path, name: str = TRAJECTORIES):
        self.path = output_dir / name
        self._file = None

    def load(self) -> dict[str, dict]:
        """The latest record of every key; a line cut short by an interrupt is skipped."""
        records: dict[str, dict] = {}
        if not self.path.exists():
            return records
        with self.path.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and "key" in record:
                    records[str(record["key"])] = record
        return records

    def open(self) -> None:
        needs_newline = self.path.exists() and self.path.stat().st_size > 0 and not self._ends_with_newline()
        self._file = self.path.open("a", encoding="utf-8")
        if needs_newline:
            self._file.write("\n")  # after a line cut short by an interrupt

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as raw:
            raw.seek(-1, 2)
            return raw.read(1) == b"\n"

    def append(self, record: dict) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def check_run_config(output_dir: Path, config: dict) -> None:
    """Write run_config.json, or check that an earlier run in this folder used the same settings."""
    path = output_dir / RUN_CONFIG
    if path.exists():
        earlier = json.loads(path.read_text(encoding="utf-8"))
        changed = sorted(key for key in set(earlier) | set(config) if earlier.get(key) != config.get(key))
        if changed:
            details = "; ".join(f"{key}: {earlier.get(key)!r} -> {config.get(key)!r}" for key in changed)
            raise ResumeMismatch(
                f"{output_dir} holds a run with other settings ({details}); "
                "pass --overwrite to start over or choose another --output-dir"
            )
        return
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _mean_or_none(values: list[float]) -> float | None:
    return fmean(values) if values else None


def source_order(sources) -> list[str]:
    known = [source for source in SEARCH_R1_DATA_SOURCES if source in sources]
    return known + sorted(set(sources) - set(known))


def pass_at_k(values: list[float], k: int) -> float | None:
    """The expected best of k samples drawn without replacement from a question's n scored samples `values`: the
    i-th smallest of n is the best of k with probability C(i-1, k-1) / C(n, k). For 0/1 scores with c right this is
    Chen et al.'s (2021) unbiased pass@k, 1 - C(n-c, k) / C(n, k); at n = k it is the best of the n. None when n < k:
    fewer samples than k say nothing about the best of k."""
    n = len(values)
    if n < k:
        return None
    draws = math.comb(n, k)
    return sum(value * math.comb(i, k - 1) for i, value in enumerate(sorted(values))) / draws


def _questions(records: list[dict]) -> list[list[dict]]:
    """The records grouped by question (their row in the data file), in first-seen order."""
    groups: dict[object, list[dict]] = {}
    for position, record in enumerate(records):
        groups.setdefault(record.get("index", ("line", position)), []).append(record)
    return list(groups.values())


def _question_scores(questions: list[list[dict]], score: str, k: int) -> tuple[list[float], list[float], int]:
    """avg@k of each question that has this score on at least one sample, pass@k of each that has it on k or more,
    and how many questions have it on fewer than k (left out of pass@k)."""
    averages, best, short = [], [], 0
    for samples in questions:
        values = [float(r[score]) for r in samples if r.get(score) is not None]
        if values:
            averages.append(fmean(values))
        passed = pass_at_k(values, k)
        if passed is None:
            short += 1
        else:
            best.append(passed)
    return averages, best, short


def present_scores(records: list[dict], judged: bool) -> list[str]:
    scores = ["em"] + [s for s in ("f1", "cover_em") if any(r.get(s) is not None for r in records)]
    return scores + (["judge"] if judged else [])


def summarize(
    records: list[dict], selected_per_source: dict[str, int], samples_per_question: int = 1, judge: dict | None = None
) -> dict:
    """Every score per data source and their mean (Search-R1's "Avg" column), over the records of this selection.

    `selected_per_source` counts the trajectories expected (questions x samples); `judge` (the judge's description)
    says the records carry judge verdicts ("judge": score or None, "judge_status")."""
    k = samples_per_question
    base = present_scores(records, judge is not None)
    keys = base + ([pass_key(score, k) for score in base] if k > 1 else [])
    by_source: dict[str, list[dict]] = {source: [] for source in selected_per_source}
    for record in records:
        by_source.setdefault(record["data_source"], []).append(record)
    sources = {}
    everything: dict[str, list[float]] = {key: [] for key in keys}
    for source in source_order(by_source):
        done = by_source[source]
        questions = _questions(done)
        stats = {"n": len(done), "selected": selected_per_source.get(source, len(done)), "questions": len(questions)}
        for score in base:
            averages, best, short = _question_scores(questions, score, k)
            stats[score] = _mean_or_none(averages)
            everything[score] += averages
            if k > 1:
                stats[pass_key(score, k)] = _mean_or_none(best)
                stats[f"{pass_key(score, k)}_short"] = short
                everything[pass_key(score, k)] += best
        if judge is not None:
            stats["unjudged"] = sum(r.get("judge") is None for r in done)
        stats |= {
            "mean_searches": _mean_or_none([float(r.get("searches", 0)) for r in done]),
            "mean_turns": _mean_or_none([float(r.get("turns", 0)) for r in done]),
            "statuses": {s: sum(r["status"] == s for r in done) for s in sorted({r["status"] for r in done})},
        }
        sources[source] = stats
    summary = {"scores": keys, "samples_per_question": k, "data_sources": sources}
    for key in keys:
        # mean over data sources, as in Search-R1's tables; and over all questions
        summary[f"average_{key}"] = _mean_or_none([s[key] for s in sources.values() if s[key] is not None])
        summary[f"micro_{key}"] = _mean_or_none(everything[key])
        if "_pass@" in key:
            summary[f"{key}_short"] = sum(s[f"{key}_short"] for s in sources.values())
    summary |= {
        "n": len(records),
        "selected": sum(selected_per_source.values()),
        "complete": len(records) == sum(selected_per_source.values()),
    }
    if judge is not None:
        summary["judge"] = judge
        summary["unjudged"] = sum(s["unjudged"] for s in sources.values())
    return summary


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown_report(summary: dict, run_config: dict) -> str:
    k = summary.get("samples_per_question", 1)
    keys = summary.get("scores", ["em"])
    judged = "judge" in summary
    sampling = "greedy" if not run_config.get("temperature") else f"temperature {run_config.get('temperature')}"
    if run_config.get("temperature"):
        sampling += f", top-p {run_config.get('top_p')}, top-k {run_config.get('top_k')}"
    lines = [
        "# Search-R1 evaluation",
        "",
        f"- model: `{run_config.get('hf_checkpoint')}`",
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
        cells = [source, str(stats["n"]), *(_fmt(stats.get(key)) for key in keys)]
        cells += [_fmt(stats["mean_searches"], 2), _fmt(stats["mean_turns"], 2), str(not_completed)]
        cells += [str(stats["unjudged"])] if judged else []
        lines.append("| " + " | ".join(cells) + " |")
    averages = [f"**{_fmt(summary.get(f'average_{key}'))}**" for key in keys]
    lines.append(
        f"| **average** (mean over data sources) | {summary['n']} | "
        + " | ".join(averages)
        + " | | | |"
        + " |" * len(extra)
    )
    micro = ", ".join(f"{label} {_fmt(summary.get(f'micro_{key}'))}" for key, label in zip(keys, labels, strict=True))
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
    labels = {score: score_label(score) for score in BASE_SCORES}
    run_labels = {score: score_label(score, samples_per_question) for score in BASE_SCORES}
    by_name: dict[str, list[dict]] = {}
    for comparison in comparisons:
        by_name.setdefault(comparison["name"], []).append(comparison)
    return "\n".join(beside_paper_markdown(group, labels, run_labels) for group in by_name.values())


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


def _save_png(figure, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=120, bbox_inches="tight")


def em_bar_figure(summary: dict, title: str, references: list[dict] | None = None):
    """Every score per data source, grouped (EM first), and their mean (Search-R1's "Avg") as the last group; a
    score not there yet shows "-". `references` (references.py's beside_paper) puts the paper's figure for a score
    beside it, as a hatched bar of the same colour ("-" where the paper gives none)."""
    from matplotlib.figure import Figure

    keys = summary.get("scores", ["em"])
    k = summary.get("samples_per_question", 1)
    names = [*summary["data_sources"], "average"]
    papers = {comparison["score"]: comparison for comparison in references or []}
    series = []  # (label, values, the paper's comparison when the values are the paper's)
    for key in keys:
        values = [stats.get(key) for stats in summary["data_sources"].values()] + [summary.get(f"average_{key}")]
        series.append((score_label(key, k), values, None))
        paper = papers.get(key)
        if paper is not None:
            figures = [paper["rows"].get(source, {}).get("paper") for source in summary["data_sources"]]
            series.append((f"paper: {score_label(key)}", figures + [paper["average"]["paper"]], paper))
    width = 0.8 / len(series)
    figure = Figure(figsize=(max(4.0, 1.0 + (0.5 + 0.4 * len(series)) * len(names)), 4.0))
    axes = figure.subplots()
    color = None
    for position, (label, values, paper) in enumerate(series):
        heights = [0.0 if value is None else value for value in values]  # with "-" above it
        offsets = [i + (position - (len(series) - 1) / 2) * width for i in range(len(names))]
        if paper is None:
            colors = None if len(series) > 1 else ["tab:blue"] * (len(names) - 1) + ["tab:gray"]
            bars = axes.bar(offsets, heights, width=width, color=colors, label=label)
            color = bars.patches[0].get_facecolor()
        else:
            bars = axes.bar(offsets, heights, width=width, color="white", edgecolor=color, hatch="//", label=label)
        fontsize = 8 if len(series) > 1 else 10
        axes.bar_label(bars, labels=[_fmt(value) for value in values], padding=2, fontsize=fontsize)
    axes.set_xticks(range(len(names)), names)
    axes.set_ylim(0, 1.1)
    axes.set_ylabel("exact match" if keys == ["em"] else "score")
    axes.set_title(title)
    axes.tick_params(axis="x", labelrotation=30)
    if len(series) > 1:
        axes.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure


def write_em_chart(output_dir: Path, summary: dict, run_config: dict, references: list[dict] | None = None) -> Path:
    """em_by_source.png next to results.md (with the paper's bars when `references` are given); raises ImportError
    when matplotlib is not installed."""
    model = Path(str(run_config.get("hf_checkpoint") or "")).name or "model"
    what = "EM" if summary.get("scores", ["em"]) == ["em"] else "scores"
    title = f"{model}: {what} per data source ({summary['n']} of {summary['selected']} trajectories)"
    if references:
        title += f"\nbeside {references[0]['method']}"
    path = output_dir / RESULTS_PNG
    _save_png(em_bar_figure(summary, title, references), path)
    return path


class ComparisonError(ValueError):
    """An output folder cannot be compared; the message names it and says what is missing."""


def load_results(output_dir: Path) -> dict:
    """results.json of one evaluate.py run, checked to hold EM per data source."""
    path = output_dir / RESULTS_JSON
    if not path.is_file():
        raise ComparisonError(f"{path} not found: is {output_dir} an evaluate.py --output-dir?")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ComparisonError(f"{path} is not valid JSON: {exc}") from None
    sources = results.get("data_sources") if isinstance(results, dict) else None
    if not isinstance(sources, dict) or not all(isinstance(v, dict) and "em" in v for v in sources.values()):
        raise ComparisonError(f"{path} has no EM per data source ('data_sources'); was it written by evaluate.py?")
    return results


def compared_sources(runs: list[dict]) -> list[str]:
    return source_order({source for results in runs for source in results["data_sources"]})


def compared_scores(runs: list[dict]) -> list[str]:
    """Every score any of the runs has, EM first, each base score followed by its pass@k (older runs: EM only)."""
    found = {key for results in runs for key in results.get("scores", ["em"])}
    return [key for base in BASE_SCORES for key in sorted(found) if key.partition("_pass@")[0] == base]


def differing_settings(runs: list[dict]) -> list[str]:
    """Evaluation settings (other than the checkpoint) whose values differ between the runs."""
    configs = [results.get("run_config") or {} for results in runs]
    keys = sorted({key for config in configs for key in config} - set(COMPARED_FREELY))
    return [
        f"{key} ({', '.join(str(config.get(key)) for config in configs)})"
        for key in keys
        if len({json.dumps(config.get(key), sort_keys=True) for config in configs}) > 1
    ]


def _run_label(key: str, runs: list[dict]) -> str:
    ks = {results.get("samples_per_question", 1) for results in runs}
    return score_label(key, ks.pop() if len(ks) == 1 else 1)


def comparison_markdown(labels: list[str], runs: list[dict]) -> str:
    sources = compared_sources(runs)
    scores = compared_scores(runs)
    names = [_run_label(key, runs) for key in scores]
    lines = [f"# Search-R1 evaluation: {', '.join(names)} per data source across checkpoints", ""]
    for key, name in zip(scores, names, strict=True):
        if len(scores) > 1:
            lines += [f"## {name}", ""]
        lines += ["| checkpoint | " + " | ".join(sources) + " | **average** | trajectories |"]
        lines += ["|---|" + "---:|" * (len(sources) + 2)]
        for label, results in zip(labels, runs, strict=True):
            values = [_fmt((results["data_sources"].get(source) or {}).get(key)) for source in sources]
            done = f"{results.get('n', '-')} of {results.get('selected', '-')}"
            if results.get("complete") is False:
                done += " (incomplete)"
            average = _fmt(results.get(f"average_{key}"))
            lines.append(f"| {label} | " + " | ".join(values) + f" | **{average}** | {done} |")
        lines.append("")
    lines += ["Average: the mean over the data sources each run evaluated (Search-R1's Avg column).", ""]
    for label, results in zip(labels, runs, strict=True):
        lines.append(f"- {label}: `{(results.get('run_config') or {}).get('hf_checkpoint')}`")
    differing = differing_settings(runs)
    if differing:
        lines += ["", "**Warning:** these runs were evaluated with different settings: " + "; ".join(differing)]
    return "\n".join(lines) + "\n"


def comparison_figure(labels: list[str], runs: list[dict]):
    """One panel per score (EM first); in each, one line per data source (its score at each checkpoint, in the
    order given) and the average as a dashed black line."""
    from matplotlib.figure import Figure

    positions = list(range(len(labels)))
    scores = compared_scores(runs)
    figure = Figure(figsize=(max(5.0, 1.5 + 1.1 * len(labels)) * len(scores), 4.5))
    panels = figure.subplots(1, len(scores), squeeze=False)[0]

    def value_of(results: dict, source: str, key: str) -> float:
        value = (results["data_sources"].get(source) or {}).get(key)
        return math.nan if value is None else value

    for axes, key in zip(panels, scores, strict=True):
        for source in compared_sources(runs):
            axes.plot(positions, [value_of(results, source, key) for results in runs], marker="o", label=source)
        averages = [math.nan if r.get(f"average_{key}") is None else r[f"average_{key}"] for r in runs]
        axes.plot(positions, averages, color="black", linestyle="--", linewidth=2, marker="s", label="average")
        axes.set_xticks(positions, labels, rotation=30, ha="right")
        axes.set_ylim(0, 1.05)
        name = _run_label(key, runs)
        axes.set_ylabel("exact match" if key == "em" else name)
        axes.set_title(f"{name} per data source across checkpoints")
        axes.grid(alpha=0.3)
    panels[-1].legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure


def write_comparison(output_dir: Path, labels: list[str], runs: list[dict]) -> None:
    """comparison.md, then comparison.png (ImportError without matplotlib, once the table is written)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / COMPARISON_MD).write_text(comparison_markdown(labels, runs), encoding="utf-8")
    _save_png(comparison_figure(labels, runs), output_dir / COMPARISON_PNG)
