"""Search-R1's published EM per data source (Qwen2.5-3B), printed beside a run by `evaluate.py --reference NAME`.

The figures are third-party transcriptions of the paper's tables (arXiv 2503.09516 v5, Tables 2 and 3; EM, top-3
E5 retrieval on wiki-18), not checked against the PDF (shared/reference/search-r1-facts.md). Every output that
prints them names the table each number comes from and says so.
"""

from dataclasses import dataclass

from slime_search_r1.data import SEARCH_R1_DATA_SOURCES

PAPER = "Search-R1 (Jin et al., arXiv 2503.09516 v5)"
CAVEAT = "third-party transcriptions of the paper's tables, not checked against the PDF"


@dataclass(frozen=True)
class Reference:
    name: str  # what --reference takes
    method: str  # the paper's row
    table: str  # where the row is in the paper
    em: dict[str, float]  # per data_source, in Search-R1's order
    average: float  # the paper's Avg column (over all seven sources)

    @property
    def source(self) -> str:
        return f"{PAPER}, {self.table}, Qwen2.5-3B, {self.method}; {CAVEAT}"


def _row(name: str, method: str, table: str, figures: tuple[float, ...]) -> Reference:
    *per_source, average = figures
    return Reference(name, method, table, dict(zip(SEARCH_R1_DATA_SOURCES, per_source, strict=True)), average)


TABLE_2 = "Table 2 (PPO)"
TABLE_3 = "Table 3 (GRPO)"
REFERENCES = {
    ref.name: ref
    for ref in (
        _row("rag", "RAG", TABLE_2, (0.348, 0.544, 0.387, 0.255, 0.226, 0.047, 0.080, 0.270)),
        _row("search-r1-base", "Search-R1-base", TABLE_2, (0.406, 0.587, 0.435, 0.284, 0.273, 0.049, 0.088, 0.303)),
        _row(
            "search-r1-instruct",
            "Search-R1-instruct",
            TABLE_2,
            (0.341, 0.545, 0.378, 0.324, 0.319, 0.103, 0.264, 0.325),
        ),
        _row(
            "search-r1-base-grpo",
            "Search-R1-base, GRPO",
            TABLE_3,
            (0.421, 0.583, 0.413, 0.297, 0.274, 0.066, 0.128, 0.312),
        ),
        _row(
            "search-r1-instruct-grpo",
            "Search-R1-instruct, GRPO",
            TABLE_3,
            (0.397, 0.565, 0.391, 0.331, 0.310, 0.124, 0.232, 0.336),
        ),
    )
}


def beside_paper(summary: dict, reference: Reference) -> dict:
    """This run's EM per data source beside the paper's figure for the same source, and the difference (run - paper).

    The paper's Avg is over its seven sources; when this run evaluated fewer, the average compared is the paper's
    figures averaged over the same sources (said in `average["paper_over"]`)."""
    rows = {}
    for source, stats in summary["data_sources"].items():
        paper = reference.em.get(source)
        em = stats["em"]
        rows[source] = {
            "n": stats["n"],
            "em": em,
            "paper": paper,
            "difference": None if em is None or paper is None else em - paper,
        }
    compared = [source for source, row in rows.items() if row["em"] is not None and row["paper"] is not None]
    complete = set(compared) == set(SEARCH_R1_DATA_SOURCES)
    run_average = sum(rows[s]["em"] for s in compared) / len(compared) if compared else None
    paper_average = (
        reference.average
        if complete
        else (sum(reference.em[s] for s in compared) / len(compared) if compared else None)
    )
    return {
        "name": reference.name,
        "method": reference.method,
        "table": reference.table,
        "source": reference.source,
        "rows": rows,
        "average": {
            "sources": compared,
            "em": run_average,
            "paper": paper_average,
            "paper_over": "the paper's Avg column" if complete else "the paper's figures for the same sources",
            "difference": None if run_average is None or paper_average is None else run_average - paper_average,
        },
    }


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def beside_paper_markdown(comparison: dict) -> str:
    """The comparison as a Markdown section, each column naming where its numbers come from."""
    paper = f"paper: {comparison['method']}"
    lines = [
        f"## Beside the paper: {comparison['method']}",
        "",
        f"| data source | n | EM (this run) | {paper} | difference |",
        "|---|---:|---:|---:|---:|",
    ]
    for source, row in comparison["rows"].items():
        lines.append(
            f"| {source} | {row['n']} | {_fmt(row['em'])} | {_fmt(row['paper'])} | {_fmt(row['difference'], True)} |"
        )
    average = comparison["average"]
    lines.append(
        f"| **average** over {len(average['sources'])} sources | | {_fmt(average['em'])} | {_fmt(average['paper'])} "
        f"| {_fmt(average['difference'], True)} |"
    )
    lines += [
        "",
        "- EM (this run): this folder's trajectories.jsonl, scored by the plugin's reward_func (pure exact match).",
        f"- {paper}: {comparison['source']}. Average: {average['paper_over']}.",
        "- difference: this run minus the paper.",
        "",
    ]
    return "\n".join(lines)
