"""A run's chart, em_by_source.png: every score per data source as grouped bars (EM first), their mean as the last
group, and with --reference the paper's figures as hatched bars beside them.

Drawn with matplotlib's Agg canvas (no display needed); matplotlib is imported only to draw, so a run without it
still writes its results and warns that the picture is missing.
"""

from pathlib import Path

from slime_search_r1.evaluation.summary import format_score, model_name, score_label

RESULTS_PNG = "em_by_source.png"  # every score, EM first


def write_em_chart(output_dir: Path, summary: dict, run_config: dict, references: list[dict] | None = None) -> Path:
    """em_by_source.png next to results.md (with the paper's bars when `references` are given); raises ImportError
    when matplotlib is not installed."""
    model = model_name(run_config.get("hf_checkpoint"), bool(summary.get("scripted")))
    what = "EM" if summary.get("scores", ["em"]) == ["em"] else "scores"
    title = f"{model}: {what} per data source ({summary['n']} of {summary['selected']} trajectories)"
    if references:
        title += f"\nbeside {references[0]['method']}"
    path = output_dir / RESULTS_PNG
    save_png(em_bar_figure(summary, title, references), path)
    return path


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
        axes.bar_label(bars, labels=[format_score(value) for value in values], padding=2, fontsize=fontsize)
    axes.set_xticks(range(len(names)), names)
    axes.set_ylim(0, 1.1)
    axes.set_ylabel("exact match" if keys == ["em"] else "score")
    axes.set_title(title)
    axes.tick_params(axis="x", labelrotation=30)
    if len(series) > 1:
        axes.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure


def save_png(figure, path: Path) -> None:
    """Write `figure` (a matplotlib Figure) to `path` as a PNG, through the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=120, bbox_inches="tight")
