"""Read a Search-R1 test file and turn its rows into slime Samples the way slime's data loader does.

Search-R1's test parquet has the columns id, question, golden_answers, data_source, prompt, ability,
reward_model and extra_info (prompt = [{"role": "user", "content": ...}], reward_model = {"style": "rule",
"ground_truth": {"target": [...]}}). slime reads parquet rows with pyarrow as plain Python objects, applies
the chat template when --apply-chat-template is set (XML mode) and otherwise keeps the messages (chat mode).
"""

import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from slime_search_r1.data import golden_answers

UNKNOWN_SOURCE = "unknown"


class DatasetError(ValueError):
    """The data file cannot be evaluated; the message says what is wrong and what is expected."""


@dataclass(frozen=True)
class ColumnNames:
    input_key: str = "prompt"
    label_key: str = "reward_model"
    tool_key: str = "tools"
    metadata_key: str = "metadata"
    data_source_key: str = "data_source"


@dataclass
class EvalRow:
    index: int  # position in the data file: the key that makes a run resumable
    data_source: str
    row: dict
    sample: int | None = None  # which of the question's samples (--samples-per-question > 1), else None

    @property
    def key(self) -> str:
        return str(self.index) if self.sample is None else f"{self.index}#{self.sample}"


def with_samples(rows: list[EvalRow], samples_per_question: int) -> list[EvalRow]:
    """Each row once (k = 1, keyed by its index), or k times, keyed index#0 .. index#k-1."""
    if samples_per_question == 1:
        return rows
    return [replace(row, sample=j) for row in rows for j in range(samples_per_question)]


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise DatasetError(f"data file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise DatasetError(f"cannot read {path} as parquet: {exc}") from exc
    if path.suffix == ".jsonl":
        rows = []
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DatasetError(f"{path}:{number} is not valid JSON: {exc}") from exc
        return rows
    raise DatasetError(f"unsupported data file {path}: expected .parquet or .jsonl (slime reads both)")


def source_names(rows: list[dict], columns: ColumnNames) -> set[str]:
    """Every data source the file names (a row without one is UNKNOWN_SOURCE)."""
    return {str(row.get(columns.data_source_key) or UNKNOWN_SOURCE) for row in rows}


def select_rows(
    rows: list[dict], columns: ColumnNames, data_sources: list[str] | None, limit: int | None
) -> list[EvalRow]:
    """Rows of the requested data sources, at most `limit` per source, in file order; columns are checked."""
    if not rows:
        raise DatasetError("the data file has no rows")
    present = set(rows[0])
    missing = [key for key in (columns.input_key, columns.label_key) if key not in present]
    if missing:
        raise DatasetError(
            f"the data file lacks column(s) {', '.join(missing)}; it has {', '.join(sorted(present))}. "
            "Search-R1's test parquet has prompt and reward_model (or pass --input-key / --label-key)"
        )
    if data_sources and columns.data_source_key not in present:
        raise DatasetError(f"--data-sources needs a '{columns.data_source_key}' column; the file has none")

    sources = [str(row.get(columns.data_source_key) or UNKNOWN_SOURCE) for row in rows]
    available = Counter(sources)
    if data_sources:
        unknown = [source for source in data_sources if source not in available]
        if unknown:
            raise DatasetError(
                f"data source(s) {', '.join(unknown)} not in the file; it has {', '.join(sorted(available))}"
            )

    wanted = set(data_sources or available)
    taken: Counter = Counter()
    selected = []
    for index, (row, source) in enumerate(zip(rows, sources, strict=True)):
        if source not in wanted or (limit is not None and taken[source] >= limit):
            continue
        taken[source] += 1
        _check_row(row, index, columns)
        selected.append(EvalRow(index=index, data_source=source, row=row))
    return selected


def _check_row(row: dict, index: int, columns: ColumnNames) -> None:
    prompt = row.get(columns.input_key)
    if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt))):
        raise DatasetError(
            f"row {index}: column '{columns.input_key}' must be a string or a list of chat messages, "
            f"got {type(prompt).__name__}"
        )
    try:
        golden_answers(row.get(columns.label_key))
    except ValueError as exc:
        raise DatasetError(f"row {index}: column '{columns.label_key}': {exc}") from None


def tools_of(row: dict, columns: ColumnNames) -> list | None:
    tools = row.get(columns.tool_key)
    if isinstance(tools, str):
        tools = json.loads(tools)
    return tools or None


def build_sample(
    sample_cls, eval_row: EvalRow, columns: ColumnNames, tokenizer, apply_chat_template: bool, template_kwargs: dict
):
    """A Sample as slime's Dataset builds it (prompt, label, metadata with tools), indexed by file position."""
    row = eval_row.row
    prompt = row[columns.input_key]
    tools = tools_of(row, columns)
    metadata = dict(row.get(columns.metadata_key) or {})
    if tools is not None:
        metadata["tools"] = tools
    if apply_chat_template:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        prompt = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **template_kwargs
        )
    return sample_cls(index=eval_row.index, prompt=prompt, label=row[columns.label_key], metadata=metadata)
