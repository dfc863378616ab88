"""`evaluate.py compare`: several evaluations (one per checkpoint) side by side, from each folder's results.json:
comparison.md (a table per score, a row per checkpoint) and comparison.png (a panel per score, a line per data
source), with a warning when the runs were evaluated with different settings.
"""

import json
import math
from pathlib import Path

from slime_search_r1.evaluation.chart import save_png
from slime_search_r1.evaluation.reports import RESULTS_JSON
from slime_search_r1.registry import reward_names
from slime_search_r1.evaluation.summary import format_score, score_label, source_order

COMPARISON_MD = "comparison.md"
COMPARISON_PNG = "comparison.png"
# Settings that may differ between the evaluations being compared (the checkpoint is the point of comparing).
COMPARED_FREELY = ("hf_checkpoint",)


def write_comparison(output_dir: Path, labels: list[str], runs: list[dict]) -> None:
    """comparison.md, then comparison.png (ImportError without matplotlib, once the table is written)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / COMPARISON_MD).write_text(comparison_markdown(labels, runs), encoding="utf-8")
    save_png(comparison_figure(labels, runs), output_dir / COMPARISON_PNG)


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
    """Every score any of the runs has, EM first, each base score followed by its pass@k (a results.json without
    "scores" holds EM only)."""
    found = {key for results in runs for key in results.get("scores", ["em"])}
    return [key for base in reward_names() for key in sorted(found) if key.partition("_pass@")[0] == base]


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
            values = [format_score((results["data_sources"].get(source) or {}).get(key)) for source in sources]
            done = f"{results.get('n', '-')} of {results.get('selected', '-')}"
            if results.get("complete") is False:
                done += " (incomplete)"
            average = format_score(results.get(f"average_{key}"))
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
