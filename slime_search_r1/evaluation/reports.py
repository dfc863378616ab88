"""Evaluation output: trajectories as JSONL (append-only, resumable), EM per data source as Markdown, JSON and a
bar chart, and the comparison of several evaluations (one per checkpoint) as a Markdown table and a line chart.

Charts are drawn with matplotlib's Agg canvas (no display needed); matplotlib is imported only to draw them.
"""

import json
import math
from statistics import fmean
from pathlib import Path

from slime_search_r1.data import SEARCH_R1_DATA_SOURCES
from slime_search_r1.evaluation.paper import beside_paper_markdown

TRAJECTORIES = "trajectories.jsonl"
RUN_CONFIG = "run_config.json"
RESULTS_MD = "results.md"
RESULTS_JSON = "results.json"
RESULTS_PNG = "em_by_source.png"
COMPARISON_MD = "comparison.md"
COMPARISON_PNG = "comparison.png"
# Settings that may differ between the evaluations being compared (the checkpoint is the point of comparing).
COMPARED_FREELY = ("hf_checkpoint",)

# A trajectory that ended like this is evaluated again on resume (a search outage is not the model's fault).
RETRIED_STATUSES = ("failed", "aborted")


class ResumeMismatch(RuntimeError):
    """The output folder holds a run made with other settings."""


class TrajectoryStore:
    """trajectories.jsonl: one JSON object per finished sample, written and flushed as soon as it finishes."""

    def __init__(self, output_dir: Path):
        self.path = output_dir / TRAJECTORIES
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


def summarize(records: list[dict], selected_per_source: dict[str, int]) -> dict:
    """EM per data source and their mean (Search-R1's "Avg" column), over the records of this selection."""
    by_source: dict[str, list[dict]] = {source: [] for source in selected_per_source}
    for record in records:
        by_source.setdefault(record["data_source"], []).append(record)
    sources = {}
    for source in source_order(by_source):
        done = by_source[source]
        sources[source] = {
            "n": len(done),
            "selected": selected_per_source.get(source, len(done)),
            "em": _mean_or_none([float(r["em"]) for r in done]),
            "mean_searches": _mean_or_none([float(r.get("searches", 0)) for r in done]),
            "mean_turns": _mean_or_none([float(r.get("turns", 0)) for r in done]),
            "statuses": {s: sum(r["status"] == s for r in done) for s in sorted({r["status"] for r in done})},
        }
    scored = [s["em"] for s in sources.values() if s["em"] is not None]
    all_em = [float(r["em"]) for r in records]
    return {
        "data_sources": sources,
        "average_em": _mean_or_none(scored),  # mean over data sources, as in Search-R1's tables
        "micro_em": _mean_or_none(all_em),  # mean over all trajectories
        "n": len(records),
        "selected": sum(selected_per_source.values()),
        "complete": len(records) == sum(selected_per_source.values()),
    }


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown_report(summary: dict, run_config: dict) -> str:
    lines = [
        "# Search-R1 evaluation",
        "",
        f"- model: `{run_config.get('hf_checkpoint')}`",
        f"- data: `{run_config.get('data')}`",
        f"- mode: {run_config.get('llm_api_mode')}, temperature {run_config.get('temperature')}, "
        f"max response {run_config.get('max_response_len')} tokens, max turns {run_config.get('max_turns')}, "
        f"top-{run_config.get('topk')} documents",
        f"- trajectories: {summary['n']} of {summary['selected']}"
        + ("" if summary["complete"] else " (incomplete: rerun the same command to resume)"),
        "",
        "| data source | n | EM | searches / sample | turns / sample | not completed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for source, stats in summary["data_sources"].items():
        not_completed = sum(count for status, count in stats["statuses"].items() if status != "completed")
        lines.append(
            f"| {source} | {stats['n']} | {_fmt(stats['em'])} | {_fmt(stats['mean_searches'], 2)} "
            f"| {_fmt(stats['mean_turns'], 2)} | {not_completed} |"
        )
    average = _fmt(summary["average_em"])
    lines.append(f"| **average** (mean over data sources) | {summary['n']} | **{average}** | | | |")
    lines += ["", f"Mean over all trajectories: {_fmt(summary['micro_em'])}.", ""]
    return "\n".join(lines)


def write_reports(output_dir: Path, summary: dict, run_config: dict, reference: dict | None = None) -> None:
    """results.json and results.md; `reference` (evaluation/paper.py's beside_paper) adds the paper's figures."""
    extra = {"reference": reference} if reference is not None else {}
    (output_dir / RESULTS_JSON).write_text(
        json.dumps({"run_config": run_config, **summary, **extra}, indent=2) + "\n", encoding="utf-8"
    )
    markdown = markdown_report(summary, run_config)
    if reference is not None:
        markdown += "\n" + beside_paper_markdown(reference)
    (output_dir / RESULTS_MD).write_text(markdown, encoding="utf-8")


def _save_png(figure, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=120, bbox_inches="tight")


def em_bar_figure(summary: dict, title: str):
    """EM per data source, and their mean (Search-R1's "Avg") as the last bar; a source not run yet shows "-"."""
    from matplotlib.figure import Figure

    names = [*summary["data_sources"], "average"]
    ems = [stats["em"] for stats in summary["data_sources"].values()] + [summary["average_em"]]
    heights = [0.0 if em is None else em for em in ems]  # with "-" above it (bar_label skips NaN bars)
    figure = Figure(figsize=(max(4.0, 1.0 + 0.9 * len(names)), 4.0))
    axes = figure.subplots()
    bars = axes.bar(names, heights, color=["tab:blue"] * (len(names) - 1) + ["tab:gray"])
    axes.bar_label(bars, labels=[_fmt(em) for em in ems], padding=2)
    axes.set_ylim(0, 1.05)
    axes.set_ylabel("exact match")
    axes.set_title(title)
    axes.tick_params(axis="x", labelrotation=30)
    return figure


def write_em_chart(output_dir: Path, summary: dict, run_config: dict) -> Path:
    """em_by_source.png next to results.md; raises ImportError when matplotlib is not installed."""
    model = Path(str(run_config.get("hf_checkpoint") or "")).name or "model"
    title = f"{model}: EM per data source ({summary['n']} of {summary['selected']} trajectories)"
    path = output_dir / RESULTS_PNG
    _save_png(em_bar_figure(summary, title), path)
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


def differing_settings(runs: list[dict]) -> list[str]:
    """Evaluation settings (other than the checkpoint) whose values differ between the runs."""
    configs = [results.get("run_config") or {} for results in runs]
    keys = sorted({key for config in configs for key in config} - set(COMPARED_FREELY))
    return [
        f"{key} ({', '.join(str(config.get(key)) for config in configs)})"
        for key in keys
        if len({json.dumps(config.get(key), sort_keys=True) for config in configs}) > 1
    ]


def comparison_markdown(labels: list[str], runs: list[dict]) -> str:
    sources = compared_sources(runs)
    lines = ["# Search-R1 evaluation: EM per data source across checkpoints", ""]
    lines += ["| checkpoint | " + " | ".join(sources) + " | **average** | trajectories |"]
    lines += ["|---|" + "---:|" * (len(sources) + 2)]
    for label, results in zip(labels, runs, strict=True):
        ems = [_fmt((results["data_sources"].get(source) or {}).get("em")) for source in sources]
        done = f"{results.get('n', '-')} of {results.get('selected', '-')}"
        if results.get("complete") is False:
            done += " (incomplete)"
        lines.append(f"| {label} | " + " | ".join(ems) + f" | **{_fmt(results.get('average_em'))}** | {done} |")
    lines += ["", "Average: the mean over the data sources each run evaluated (Search-R1's Avg column).", ""]
    for label, results in zip(labels, runs, strict=True):
        lines.append(f"- {label}: `{(results.get('run_config') or {}).get('hf_checkpoint')}`")
    differing = differing_settings(runs)
    if differing:
        lines += ["", "**Warning:** these runs were evaluated with different settings: " + "; ".join(differing)]
    return "\n".join(lines) + "\n"


def comparison_figure(labels: list[str], runs: list[dict]):
    """One line per data source (EM at each checkpoint, in the order given), the average as a dashed black line."""
    from matplotlib.figure import Figure

    positions = list(range(len(labels)))
    figure = Figure(figsize=(max(5.0, 1.5 + 1.1 * len(labels)), 4.5))
    axes = figure.subplots()

    def em_of(results: dict, source: str) -> float:
        em = (results["data_sources"].get(source) or {}).get("em")
        return math.nan if em is None else em

    for source in compared_sources(runs):
        axes.plot(positions, [em_of(results, source) for results in runs], marker="o", label=source)
    averages = [math.nan if r.get("average_em") is None else r["average_em"] for r in runs]
    axes.plot(positions, averages, color="black", linestyle="--", linewidth=2, marker="s", label="average")
    axes.set_xticks(positions, labels, rotation=30, ha="right")
    axes.set_ylim(0, 1.05)
    axes.set_ylabel("exact match")
    axes.set_title("EM per data source across checkpoints")
    axes.grid(alpha=0.3)
    axes.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure


def write_comparison(output_dir: Path, labels: list[str], runs: list[dict]) -> None:
    """comparison.md, then comparison.png (ImportError without matplotlib, once the table is written)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / COMPARISON_MD).write_text(comparison_markdown(labels, runs), encoding="utf-8")
    _save_png(comparison_figure(labels, runs), output_dir / COMPARISON_PNG)
