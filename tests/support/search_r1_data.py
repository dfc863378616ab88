"""Write small test files with the exact schema of Search-R1's test parquet (qa_search_test_merge.py)."""

from pathlib import Path

import pandas as pd

from slime_search_r1.data import search_r1_prompt


def search_r1_rows(questions: list[tuple[str, str, list[str]]]) -> list[dict]:
    """(data_source, question, golden answers) -> rows with Search-R1's columns and nesting."""
    rows = []
    for index, (source, question, answers) in enumerate(questions):
        rows.append(
            {
                "id": f"test_{index}",
                "question": question,
                "golden_answers": list(answers),
                "data_source": source,
                "prompt": [{"role": "user", "content": search_r1_prompt(question)}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": list(answers)}},
                "extra_info": {"split": "test", "index": index},
            }
        )
    return rows


def write_search_r1_parquet(path: Path, questions: list[tuple[str, str, list[str]]]) -> Path:
    pd.DataFrame(search_r1_rows(questions)).to_parquet(path, engine="pyarrow", index=False)
    return path
