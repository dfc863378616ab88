"""Questions to measure with: a user's training or test file, or, without one, queries cut from the corpus.

Files: .txt (one question a line), .json (a list of strings, or of objects with a "question" field), .jsonl (objects
with "question"), .parquet (a "question" column, as Search-R1's nq_hotpotqa_train files have; else "prompt"
rows whose last user message holds "Question: ...", as the chat conversion writes them).
"""

import json
import re
from pathlib import Path

import numpy as np

from local_dense_retriever.retrieval.corpus import Corpus

ACCEPTED = ".txt (a question a line), .json / .jsonl (strings or objects with a 'question' field), .parquet"


def read_questions(path: str | Path, limit: int | None = None, seed: int = 0) -> list[str]:
    """Distinct non-blank questions of the file; `limit` of them drawn at random when it holds more."""
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise ValueError(f"--queries {path}: no such file (accepted: {ACCEPTED})")
    if suffix == ".txt":
        questions = path.read_text(encoding="utf-8").splitlines()
    elif suffix == ".jsonl":
        questions = [_question(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line]
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        questions = [_question(item) for item in (data if isinstance(data, list) else [])]
    elif suffix == ".parquet":
        questions = _parquet_questions(path)
    else:
        raise ValueError(f"--queries {path}: accepted are {ACCEPTED}")
    questions = list(dict.fromkeys(q.strip() for q in questions if isinstance(q, str) and q.strip()))
    if not questions:
        raise ValueError(f"--queries {path}: no question found (accepted: {ACCEPTED})")
    if limit is not None and len(questions) > limit:
        picked = np.sort(np.random.default_rng(seed).choice(len(questions), limit, replace=False))
        questions = [questions[i] for i in picked]
    return questions


def _question(item) -> str | None:
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        return item.get("question") or item.get("query")
    return None


def _parquet_questions(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if "question" in table.column_names:
        return [str(q) for q in table.column("question").to_pylist()]
    if "prompt" in table.column_names:
        questions = []
        for prompt in table.column("prompt").to_pylist():
            text = prompt[-1].get("content", "") if isinstance(prompt, list) and prompt else str(prompt)
            match = re.search(r"Question:\s*(.+?)\s*$", text, re.S)
            questions.append(match[1] if match else text)
        return questions
    raise ValueError(f"--queries {path}: no 'question' or 'prompt' column (has {', '.join(table.column_names)})")


def corpus_queries(corpus: Corpus, count: int, words: int = 12, seed: int = 0) -> list[str]:
    """Stand-in queries when no question file is given: the first `words` words of the text of `count` passages
    drawn at random (their title line dropped), so they read like a query about that passage's topic."""
    total = len(corpus)
    rows = np.sort(np.random.default_rng(seed).choice(total, min(count, total), replace=False))
    queries = []
    for document in corpus.get_many(rows.tolist()):
        contents = document.get("contents", "")
        text = contents.split("\n", 1)[1] if "\n" in contents else contents
        queries.append(" ".join(text.split()[:words]) or contents[:80])
    return queries
