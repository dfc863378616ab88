"""Convert Search-R1 parquet data into the chat format LLM_API_MODE=chat trains on.

Input: Search-R1's parquet (a local file, or a Hugging Face dataset id such as PeterJinGo/nq_hotpotqa_train)
with columns question, golden_answers/reward_model, data_source (id, ability, extra_info kept when present).
Output: parquet with
  prompt        [{"role": "system", ...}, {"role": "user", "content": "Question: ...?"}]; the system prompt names
                the tools offered (slime_search_r1/data.py's chat_system_prompt), or is --system-prompt-file's
  tools         the tool list as a JSON string (slime's --tool-key tools puts it in sample.metadata["tools"]);
                --tools search,access offers those tools (enable the same ones with SEARCH_R1_TOOLS); a tool of
                your own is offered once its module is named in --extensions (or SEARCH_R1_EXTENSIONS)
  reward_model  {"style": "rule", "ground_truth": {"target": [...]}}
  metadata      {"data_source": ...} (slime's --metadata-key metadata puts it in sample.metadata, where the eval
                log function reads it for EM per data source)
  data_source, and the other columns of the input.
Train with --input-key prompt --label-key reward_model --tool-key tools and WITHOUT --apply-chat-template.
--keep-prompt keeps every input column as it is (XML mode's Search-R1 prompt) and only adds `metadata`.

A row whose reward_model and golden_answers hold different gold answers (as EM compares them: normalised, in any
order) stops the conversion before anything is written, the message counting such rows: the reward reads
reward_model, and a reader of golden_answers would score other answers. --gold-answers reward_model (or
golden_answers) resolves them: that column's answers go into both, and the count is printed.

    python oai_format_data_preprocess.py --input PeterJinGo/nq_hotpotqa_train --split train --output train.parquet
    python oai_format_data_preprocess.py --input test.parquet --output test_chat.parquet --data-sources nq,hotpotqa
    python oai_format_data_preprocess.py --input test.parquet --output test_xml.parquet --keep-prompt
"""

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable

from slime_search_r1.install_hint import needs_extra

with needs_extra("oai_format_data_preprocess.py", "data"):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tqdm import tqdm

from slime_search_r1.data import chat_question, chat_system_prompt, golden_answers
from slime_search_r1.registry import TOOLS
from slime_search_r1.scoring.answers import normalize_answer
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import import_extensions

REQUIRED_COLUMNS = ("question", "data_source")
PASSED_THROUGH = ("id", "ability", "extra_info", "golden_answers")
GOLD_COLUMNS = ("reward_model", "golden_answers")  # where a row's gold answers may be; the reward reads the first
SHOWN_ROWS = 5  # disagreeing rows a message names


class DataError(ValueError):
    """The input does not have the Search-R1 schema; the message names the row and field."""


def _targets(row: dict, index: int) -> list[str]:
    """Gold answers from reward_model (ground_truth.target), else golden_answers."""
    label = row.get("reward_model") if row.get("reward_model") is not None else row.get("golden_answers")
    try:
        return golden_answers(label)
    except ValueError as exc:
        raise DataError(f"row {index}: no gold answers in reward_model or golden_answers: {exc}") from None


def gold_disagreement(row: dict) -> tuple[list[str], list[str]] | None:
    """(reward_model's, golden_answers') gold answers when the row holds both and they differ as EM compares answers
    (normalised, in any order); None otherwise. An unreadable column is _targets' to report, when it is the one
    read."""
    if any(row.get(column) is None for column in GOLD_COLUMNS):
        return None
    try:
        labelled, listed = (golden_answers(row[column]) for column in GOLD_COLUMNS)
    except ValueError:
        return None
    if {normalize_answer(a) for a in labelled} == {normalize_answer(a) for a in listed}:
        return None
    return labelled, listed


def with_gold_answers(row: dict, answers: list[str]) -> dict:
    """The row with `answers` in both gold columns (reward_model in Search-R1's shape)."""
    model = row["reward_model"] if isinstance(row["reward_model"], dict) else {"style": "rule"}
    return {
        **row,
        "golden_answers": list(answers),
        "reward_model": {**model, "ground_truth": {"target": list(answers)}},
    }


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


def _rows_named(disagreements: list[tuple[int, list[str], list[str]]]) -> str:
    named = "; ".join(f"row {i}: reward_model {a} vs golden_answers {b}" for i, a, b in disagreements[:SHOWN_ROWS])
    return named + ("; ..." if len(disagreements) > SHOWN_ROWS else "")


def source_metadata(row: dict, index: int) -> dict:
    """The row's metadata column with its data_source added (kept as it was otherwise)."""
    if not isinstance(row.get("data_source"), str):
        raise DataError(f"row {index}: 'data_source' must be a string, got {row.get('data_source')!r}")
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise DataError(f"row {index}: 'metadata' must be a dict (slime's --metadata-key column), got {metadata!r}")
    return {**metadata, "data_source": row["data_source"]}


def keep_prompt_row(row: dict, index: int) -> dict:
    """--keep-prompt: the row as it is, plus metadata.data_source."""
    if "prompt" not in row:
        raise DataError(f"row {index}: --keep-prompt needs a 'prompt' column (Search-R1's data has one)")
    return {**row, "metadata": source_metadata(row, index)}


def convert_row(row: dict, index: int, system_prompt: str, tools_json: str) -> dict:
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"row {index}: 'question' must be a non-empty string, got {question!r}")
    metadata = source_metadata(row, index)
    converted = {key: row[key] for key in PASSED_THROUGH if key in row}
    converted.update(
        data_source=row["data_source"],
        metadata=metadata,
        question=question,
        prompt=[{"role": "system", "content": system_prompt}, {"role": "user", "content": chat_question(question)}],
        tools=tools_json,
        reward_model={"style": "rule", "ground_truth": {"target": _targets(row, index)}},
    )
    return converted


# A hub dataset id is owner/name; anything else (or ending like a data file) is a local path.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_DATA_FILE_SUFFIXES = (".parquet", ".pq", ".json", ".jsonl", ".csv", ".tsv", ".arrow", ".txt", ".gz", ".zip")


def _why_local(source: str) -> str | None:
    """Why a missing `source` is taken as a local path, or None when it is shaped like a hub id (owner/name)."""
    if source.lower().endswith(_DATA_FILE_SUFFIXES):
        return "it ends like a data file"
    if not _HUB_ID.fullmatch(source):
        return "a hub dataset id is shaped like owner/name"
    owner = source.split("/")[0]
    if os.path.isdir(owner):
        return f"{owner}/ is a local directory"
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def read_rows(source: str, split: str) -> tuple[Iterable[dict], int]:
    """Rows of a local parquet file, or of a Hugging Face dataset split."""
    if os.path.isdir(source):
        raise DataError(f"{source} is a directory; --input takes one parquet file or a hub dataset id (owner/name)")
    if os.path.exists(source):
        try:
            table = pq.read_table(source)
        except (pa.ArrowException, OSError) as exc:  # not parquet, empty, truncated, unreadable
            raise DataError(f"{source} is not a readable parquet file: {_first_line(exc)}") from None
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise DataError(f"{source} has no column(s) {missing}; Search-R1 data has {list(REQUIRED_COLUMNS)}")
        if table.num_rows == 0:
            raise DataError(f"{source} has no rows")
        return iter(table.to_pylist()), table.num_rows
    why_local = _why_local(source)
    if why_local is not None:
        # said at once: a hub lookup of a mistyped path only fails after its network retries
        raise DataError(f"{source} does not exist (taken as a local path: {why_local})")
    import datasets  # only for hub ids

    try:
        dataset = datasets.load_dataset(source, split=split)
    except Exception as exc:  # not found, unreachable, gated, no such split: the library's classes vary
        raise DataError(f"cannot load hub dataset {source} (split {split}): {_first_line(exc)}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in dataset.column_names]
    if missing:
        raise DataError(f"{source}[{split}] has no column(s) {missing}")
    if len(dataset) == 0:
        raise DataError(f"{source}[{split}] has no rows")
    return iter(dataset), len(dataset)


def convert(
    source: str,
    output: str,
    *,
    split: str = "train",
    data_sources: set[str] | None = None,
    limit: int | None = None,
    system_prompt: str | None = None,
    keep_prompt: bool = False,
    tools: tuple[str, ...] = ("search",),
    gold_from: str | None = None,
) -> tuple[int, str | None]:
    """Write the converted rows; returns how many, and what was resolved (--gold-answers), if anything.

    `system_prompt`: None for the built-in one, which names the `tools`; `gold_from`: the column whose answers a row
    keeps when its gold columns disagree; None refuses such rows."""
    system_prompt = chat_system_prompt(tools) if system_prompt is None else system_prompt
    rows, total = read_rows(source, split)
    tools_json = json.dumps([TOOLS.get(name).schema for name in tools], ensure_ascii=False)
    converted = []
    skipped_sources = set()
    disagreements = []  # (row index, reward_model's answers, golden_answers')
    # closed (its line ended) before any error or count is printed: a message never lands on a half-drawn bar
    with tqdm(rows, total=total, desc="converting", unit="row") as progress:
        for index, row in enumerate(progress):
            if data_sources and row.get("data_source") not in data_sources:
                skipped_sources.add(str(row.get("data_source")))
                continue
            found = gold_disagreement(row)
            if found is not None:
                disagreements.append((index, *found))
                if gold_from is not None:
                    row = with_gold_answers(row, found[GOLD_COLUMNS.index(gold_from)])
            if keep_prompt:
                converted.append(keep_prompt_row(row, index))
            else:
                converted.append(convert_row(row, index, system_prompt, tools_json))
            if limit is not None and len(converted) >= limit:
                break
    if disagreements and gold_from is None:
        raise DataError(
            f"{len(disagreements)} of {_rows(len(converted))} hold different gold answers in reward_model and "
            f"golden_answers ({_rows_named(disagreements)}); nothing was written. The reward reads reward_model; "
            "pass --gold-answers reward_model or --gold-answers golden_answers to write that column's answers in both"
        )
    if not converted:  # only a data-source filter can leave nothing: read_rows refuses an input without rows
        raise DataError(
            f"no rows with data_source in {sorted(data_sources or [])}; the input has {sorted(skipped_sources)[:20]}"
        )
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(converted), output)
    resolved = None
    if disagreements:
        resolved = (
            f"{_rows(len(disagreements))} held different gold answers in reward_model and golden_answers; both now "
            f"hold the {gold_from} column's ({_rows_named(disagreements)})"
        )
    return len(converted), resolved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="Search-R1 parquet file, or a hub dataset id (owner/name)")
    parser.add_argument("--output", required=True, help="where to write the chat-format parquet")
    parser.add_argument("--split", default="train", help="dataset split when --input is a hub id (default: train)")
    parser.add_argument("--data-sources", default=None, help="keep only these data_source values, comma-separated")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many rows (default: all)")
    parser.add_argument("--system-prompt-file", default=None, help="text file replacing the built-in system prompt")
    parser.add_argument(
        "--keep-prompt",
        action="store_true",
        help="keep every column as it is (XML mode's prompt) and only add metadata = {'data_source': ...}",
    )
    parser.add_argument(
        "--gold-answers",
        choices=GOLD_COLUMNS,
        default=None,
        help="for rows whose reward_model and golden_answers disagree: write this column's answers into both "
        "(default: refuse such rows, counting them, and write nothing)",
    )
    parser.add_argument(
        "--tools",
        default="search",
        help=f"the tools the rows offer, comma-separated, as SEARCH_R1_TOOLS enables them: {', '.join(TOOLS.names())}"
        " (and those --extensions register)",
    )
    parser.add_argument(
        "--extensions",
        default=os.environ.get("SEARCH_R1_EXTENSIONS", ""),
        help="modules that register tools of their own, comma-separated, as SEARCH_R1_EXTENSIONS names them "
        "(default: that variable)",
    )
    options = parser.parse_args(argv)
    try:
        import_extensions([name.strip() for name in options.extensions.split(",") if name.strip()], "--extensions")
    except ConfigError as exc:
        parser.error(str(exc))
    tools = tuple(name.strip() for name in options.tools.split(",") if name.strip())
    unknown = [name for name in tools if name not in TOOLS]
    if unknown or not tools:
        parser.error(f"--tools {options.tools!r}: accepted: names from {', '.join(TOOLS.names())}")
    if options.limit is not None and options.limit < 1:
        parser.error("--limit must be at least 1")
    if not options.output.endswith(".parquet"):
        parser.error(f"--output must end with .parquet, got {options.output!r}")
    system_prompt = None  # the built-in one, naming the --tools
    if options.system_prompt_file:
        try:
            with open(options.system_prompt_file, encoding="utf-8") as handle:
                system_prompt = handle.read().strip()
        except OSError as exc:
            parser.error(f"--system-prompt-file: {exc}")
    sources = {s.strip() for s in options.data_sources.split(",") if s.strip()} if options.data_sources else None
    try:
        count, resolved = convert(
            options.input,
            options.output,
            split=options.split,
            data_sources=sources,
            limit=options.limit,
            system_prompt=system_prompt,
            keep_prompt=options.keep_prompt,
            tools=tools,
            gold_from=options.gold_answers,
        )
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {count} rows to {options.output}")
    if resolved:
        print(f"resolved: {resolved}")
    return 0


if __name__ == "__main__":
    with needs_extra("oai_format_data_preprocess.py", "data"):  # datasets, for a hub id, is imported when used
        sys.exit(main())
