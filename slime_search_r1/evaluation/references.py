"""Published figures per data source, put beside a run by `evaluate.py --reference NAME` or `--reference FILE.json`.

A reference is one JSON file, a paper's row (or your own baseline):

    {
      "method": "Search-R1-base, GRPO",                         the row: what was evaluated
      "source": "Search-R1 (Jin et al., arXiv 2503.09516 v5), Table 3 (GRPO), Qwen2.5-3B",  where the figures are
      "table": "Table 3 (GRPO)",                                optional: the table's name, for the reports
      "notes": "...",                                           optional: how its setting differs, what is uncertain
      "scores": {"em": {"nq": 0.421, "hotpotqa": 0.297}},       per score, per data source, a fraction in [0, 1]
      "averages": {"em": 0.312}                                 optional: the paper's own mean over its sources
    }

Scores: em, f1, cover_em, judge (what evaluate.py reports; see scoring/answers.py). Data sources: Search-R1's seven
and those of the file being evaluated. A figure the paper does not give, or one that could not be read with
certainty, is left out (or null) and said so in "notes". The files shipped are tables/NAME.json; each names the
paper, its arXiv version and the table.
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from slime_search_r1.data import SEARCH_R1_DATA_SOURCES
from slime_search_r1.registry import reward_names

TABLES = Path(__file__).with_name("tables")
# A source evaluated on fewer questions than this is flagged beside the paper: a score over n questions is uncertain
# by up to +-0.98/sqrt(n) (a 95% interval of a proportion), +-0.10 at 100, where a paper's test set has hundreds to
# thousands of questions per source.
FEW_QUESTIONS = 100
_KEYS = {"method", "source", "table", "notes", "scores", "averages"}


class ReferenceError(ValueError):
    """A reference that cannot be used; the message names the file, the setting and what is accepted."""


@dataclass(frozen=True)
class Reference:
    name: str  # the shipped table's name, or the file's path
    method: str
    source: str
    scores: dict[str, dict[str, float | None]]  # score -> data source -> figure (None: not certain)
    averages: dict[str, float] = field(default_factory=dict)
    table: str | None = None
    notes: str | None = None


def shipped() -> list[str]:
    return sorted(path.stem for path in TABLES.glob("*.json"))


def is_reference(value: str) -> bool:
    """A shipped table's name or an existing .json file (what --reference accepts; its content is checked later)."""
    return value in shipped() or (value.endswith(".json") and Path(value).is_file())


def _figure(where: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReferenceError(f"{where} must be a number in [0, 1] or null, got {value!r}")
    if not 0.0 <= value <= 1.0:
        hint = f"; write percentages as fractions ({value} -> {value / 100:g})" if 1.0 < value <= 100.0 else ""
        raise ReferenceError(f"{where} must be a fraction in [0, 1], got {value}{hint}")
    return float(value)


def _score_table(path: str, key: str, value) -> dict:
    if not isinstance(value, dict):
        raise ReferenceError(f"{path}: '{key}' must be an object {{score: ...}}, got {type(value).__name__}")
    unknown = sorted(set(value) - set(reward_names()))
    if unknown:
        accepted = ", ".join(reward_names())
        raise ReferenceError(f"{path}: unknown score {unknown[0]!r} in '{key}'; accepted: {accepted}")
    return value


def parse_reference(name: str, path: str, document, known_sources) -> Reference:
    if not isinstance(document, dict):
        raise ReferenceError(f"{path}: must hold one JSON object with method, source and scores")
    unknown = sorted(set(document) - _KEYS)
    if unknown:
        raise ReferenceError(f"{path}: unknown key {unknown[0]!r}; accepted: {', '.join(sorted(_KEYS))}")
    for key in ("method", "source"):
        if not isinstance(document.get(key), str) or not document[key].strip():
            raise ReferenceError(f"{path}: '{key}' must be a non-empty string (where the figures come from)")
    for key in ("table", "notes"):
        if document.get(key) is not None and not isinstance(document[key], str):
            raise ReferenceError(f"{path}: '{key}' must be a string")
    known = list(dict.fromkeys([*SEARCH_R1_DATA_SOURCES, *sorted(known_sources)]))
    scores = {}
    for score, figures in _score_table(path, "scores", document.get("scores")).items():
        if not isinstance(figures, dict) or not figures:
            raise ReferenceError(f"{path}: scores.{score} must be an object {{data source: figure}}")
        for source in figures:
            if source not in known:
                raise ReferenceError(
                    f"{path}: unknown data source {source!r} in scores.{score}; accepted: {', '.join(known)} "
                    "(Search-R1's seven and those in --data)"
                )
        scores[score] = {source: _figure(f"{path}: scores.{score}.{source}", v) for source, v in figures.items()}
    if not scores:
        raise ReferenceError(f"{path}: 'scores' is empty; give at least one of {', '.join(reward_names())}")
    averages = _score_table(path, "averages", document.get("averages") or {})
    return Reference(
        name=name,
        method=document["method"],
        source=document["source"],
        scores=scores,
        averages={score: _figure(f"{path}: averages.{score}", v) for score, v in averages.items()},
        table=document.get("table"),
        notes=document.get("notes"),
    )


def load_reference(value: str, known_sources=()) -> Reference:
    """A shipped table by name, or a reference file by path, checked (ReferenceError says what is wrong)."""
    path = TABLES / f"{value}.json" if value in shipped() else Path(value)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReferenceError(f"--reference {value}: cannot read it ({exc}); shipped: {', '.join(shipped())}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReferenceError(f"{path}: not valid JSON: {exc}") from None
    return parse_reference(value, str(path), document, known_sources)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _minus(run: float | None, paper: float | None) -> float | None:
    return None if run is None or paper is None else run - paper


def beside_paper(summary: dict, reference: Reference) -> list[dict]:
    """For each score the reference gives: this run's figure per data source beside the paper's, and run - paper.

    The paper's average is its own over its sources; when this run evaluated fewer (or the paper gives none), the
    average compared is the paper's figures averaged over the sources both have (said in `average["paper_over"]`)."""
    comparisons = []
    for score, figures in reference.scores.items():
        rows = {}
        for source, stats in summary["data_sources"].items():
            run, paper = stats.get(score), figures.get(source)
            rows[source] = {
                "n": stats["n"],
                "questions": stats.get("questions", stats["n"]),
                "run": run,
                "paper": paper,
                "difference": _minus(run, paper),
            }
        compared = [source for source, row in rows.items() if row["run"] is not None and row["paper"] is not None]
        reported = {source for source, figure in figures.items() if figure is not None}
        whole = set(compared) == reported and reference.averages.get(score) is not None
        run_average = _mean([rows[s]["run"] for s in compared])
        paper_average = reference.averages[score] if whole else _mean([figures[s] for s in compared])
        comparisons.append(
            {
                "name": reference.name,
                "method": reference.method,
                "table": reference.table,
                "source": reference.source,
                "notes": reference.notes,
                "score": score,
                "run_has_score": score in summary.get("scores", ["em"]),
                "rows": rows,
                "average": {
                    "sources": compared,
                    "run": run_average,
                    "paper": paper_average,
                    "paper_over": "the paper's average" if whole else "the paper's figures for the same sources",
                    "difference": _minus(run_average, paper_average),
                },
            }
        )
    return comparisons


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def beside_paper_markdown(comparisons: list[dict], labels: dict[str, str], run_labels: dict[str, str]) -> str:
    """One reference's comparisons as a Markdown section: a column triple per score, each naming its origin
    (`run_labels` say what this run's figure is, e.g. "F1 avg@4")."""
    first = comparisons[0]
    header = ["data source", "n"]
    for comparison in comparisons:
        score = comparison["score"]
        header += [f"{run_labels.get(score, score)} (this run)", f"paper: {labels.get(score, score)}", "difference"]
    lines = [
        f"## Beside the paper: {first['method']}",
        "",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
    ]
    for source in first["rows"]:
        cells = [source, str(first["rows"][source]["n"])]
        for comparison in comparisons:
            row = comparison["rows"][source]
            cells += [_fmt(row["run"]), _fmt(row["paper"]), _fmt(row["difference"], True)]
        lines.append("| " + " | ".join(cells) + " |")
    average_cells = [f"**average** over {len(first['average']['sources'])} sources", ""]
    for comparison in comparisons:
        average = comparison["average"]
        average_cells += [_fmt(average["run"]), _fmt(average["paper"]), _fmt(average["difference"], True)]
    lines += ["| " + " | ".join(average_cells) + " |", ""]
    missing = [labels.get(c["score"], c["score"]) for c in comparisons if not c["run_has_score"]]
    lines += [
        "- this run: this folder's trajectories.jsonl, scored by the plugin's reward_func (EM) and "
        "slime_search_r1/scoring (F1, cover EM, the judge).",
        f"- paper: {first['source']}. Average: "
        + "; ".join(f"{labels.get(c['score'], c['score'])}: {c['average']['paper_over']}" for c in comparisons)
        + ".",
        "- difference: this run minus the paper.",
    ]
    if first.get("notes"):
        lines.append(f"- notes: {first['notes']}")
    few = [(source, row["questions"]) for source, row in first["rows"].items() if row["questions"] < FEW_QUESTIONS]
    if few:
        lines.append(
            f"- **few questions** (under {FEW_QUESTIONS}): "
            + ", ".join(f"{source} {count} (±{0.98 / math.sqrt(max(count, 1)):.2f})" for source, count in few)
            + ". A score over n questions is uncertain by up to ±0.98/√n (95%), and a paper's test set has "
            "hundreds to thousands of questions per source: these differences say little."
        )
    if missing:
        lines.append(f"- this run has no {', '.join(missing)} scores (a judge needs --judge-url and --judge-model).")
    return "\n".join(lines) + "\n"
