"""Evaluation output: trajectories as JSONL (append-only, resumable) and EM per data source as Markdown and JSON."""

import json
import math
from pathlib import Path

from eval_dataset import SEARCH_R1_DATA_SOURCES

TRAJECTORIES = "trajectories.jsonl"
RUN_CONFIG = "run_config.json"
RESULTS_MD = "results.md"
RESULTS_JSON = "results.json"

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


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


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
            "em": _mean([float(r["em"]) for r in done]),
            "mean_searches": _mean([float(r.get("searches", 0)) for r in done]),
            "mean_turns": _mean([float(r.get("turns", 0)) for r in done]),
            "statuses": {s: sum(r["status"] == s for r in done) for s in sorted({r["status"] for r in done})},
        }
    scored = [s["em"] for s in sources.values() if s["em"] is not None]
    all_em = [float(r["em"]) for r in records]
    return {
        "data_sources": sources,
        "average_em": _mean(scored),  # mean over data sources, as in Search-R1's tables
        "micro_em": _mean(all_em),  # mean over all trajectories
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


def write_reports(output_dir: Path, summary: dict, run_config: dict) -> None:
    (output_dir / RESULTS_JSON).write_text(
        json.dumps({"run_config": run_config, **summary}, indent=2) + "\n", encoding="utf-8"
    )
    (output_dir / RESULTS_MD).write_text(markdown_report(summary, run_config), encoding="utf-8")
