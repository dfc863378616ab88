"""Build a search index from a corpus jsonl: FAISS (any index_factory string), a Qdrant collection, or BM25.

    python -m local_dense_retriever.index_builder --corpus_path wiki-18.jsonl --retriever_name e5 \
        --retriever_model intfloat/e5-base-v2 --faiss_type Flat --save_dir indexes/

Passages are streamed in chunks (bounded memory), encoded in length-sorted micro-batches (fp16 and every GPU
when present, fp32 on CPU), and added as they come; IVF/PQ types are trained on the first --train_size vectors
(on the first GPU with --faiss_gpu).
Row i of the index is line i of the corpus. The corpus's byte-offset sidecar is written too, for the server.
"""

import argparse
import logging
import os
import queue
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from local_dense_retriever.building.layouts import build_layout, new_index, set_search_params, write_index
from local_dense_retriever.retrieval import cpu_threads
from local_dense_retriever.retrieval.layouts import Layout
from local_dense_retriever.retrieval.model_source import check_model_source

from local_dense_retriever.retrieval.corpus import (
    CorpusFormatError,
    count_documents,
    ensure_decompressed,
    iter_documents,
    offsets_path_for,
)

logger = logging.getLogger("local_dense_retriever.index_builder")


@dataclass
class BuildConfig:
    corpus_path: str
    index_path: str | None = None  # FAISS file or BM25 directory; Qdrant uses the qdrant_* fields
    retriever_name: str = "e5"
    retriever_model: str = "intfloat/e5-base-v2"
    backend: str = "faiss"  # faiss | qdrant (bm25 is chosen with retriever_name="bm25")
    faiss_type: str = "Flat"
    metric: str = "ip"
    faiss_gpu: bool = False
    train_size: int = 200_000
    chunk_size: int = 16_384
    max_length: int = 256
    batch_size: int | None = None  # rows per forward pass; the token budget below usually decides
    max_tokens_per_forward: int | None = None
    num_threads: int | None = None  # CPU threads for encoding and FAISS; None: the CPUs this process may use
    pooling_method: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    embeddings_path: str | None = None  # reuse saved embeddings instead of encoding
    from_index: str | None = None  # a Flat index whose vectors the layout is built from (random training sample)
    faiss_search_params: str | None = None  # written into the index (efSearch, nprobe): the server starts with them
    hnsw_ef_construction: int | None = None  # HNSW's build-time breadth; None: FAISS's default (40)
    save_embeddings: str | None = None
    qdrant_url: str | None = None
    qdrant_path: str | None = None
    qdrant_collection: str = "search_r1"
    overwrite: bool = False
    progress: bool = True

    @property
    def is_bm25(self) -> bool:
        return self.retriever_name.lower() == "bm25"


@dataclass
class BuildSummary:
    documents: int
    seconds: float
    output: str


def _load_encoder(config: BuildConfig):
    """The encoder, and how its forward passes run: on the CPU, in the layout the tuner measures fastest (as in
    the server: one pass on every CPU, or one single-threaded pass per CPU beside busy processes)."""
    from local_dense_retriever.retrieval.encoders import encoder_from_config

    encoder = encoder_from_config(
        config,
        max_tokens_per_forward=config.max_tokens_per_forward,
        max_rows_per_forward=config.batch_size,
        multi_gpu=True,
    )
    import faiss  # noqa: F401 (loaded now, so that its pool is sized with torch's)

    threads = cpu_threads.thread_count(config.num_threads)
    cpu_threads.configure_pools(threads)
    on_cpu = encoder.device.type == "cpu"
    tuner = cpu_threads.ThreadTuner(threads, adaptive=on_cpu and config.num_threads is None, window=8)
    logger.info("encoding on %s; CPU threads: %s", encoder.device, cpu_threads.report())
    return encoder, (TunedPasses(tuner) if tuner.adaptive else map)


class TunedPasses:
    """Runs forward passes on the tuner's worker threads, as many at once as its layout allows, and yields their
    results as they finish (encode() puts rows in place). A failed pass stops the others and raises."""

    def __init__(self, tuner: cpu_threads.ThreadTuner):
        self.tuner = tuner

    def __call__(self, forward: Callable, passes: list) -> Iterator:
        done: queue.SimpleQueue = queue.SimpleQueue()
        lock = threading.Condition()
        state = {"next": 0, "stop": False}

        def take():
            with lock:
                while not state["stop"] and state["next"] < len(passes):
                    ticket = self.tuner.begin()
                    if ticket is not None:
                        state["next"] += 1
                        return ticket, passes[state["next"] - 1]
                    lock.wait()  # for a pass to end and free its CPUs
                return None

        def work() -> None:
            try:
                while (job := take()) is not None:
                    ticket, rows = job
                    self.tuner.enter(ticket)
                    try:
                        result = (forward(rows), None)
                    except BaseException as err:
                        result = (None, err)
                    with lock:
                        self.tuner.end(ticket, len(rows))
                        state["stop"] |= result[1] is not None  # a failed pass: start no more
                        lock.notify_all()
                    done.put(result)
            except BaseException as err:  # never leave the caller waiting for a pass that will not come
                with lock:
                    state["stop"] = True
                done.put((None, err))

        workers = [threading.Thread(target=work, name=f"encode-{i}", daemon=True) for i in range(self.tuner.workers)]
        for worker in workers:
            worker.start()
        try:
            for _ in passes:
                result, error = done.get()
                if error is not None:
                    raise error
                yield result
        finally:
            with lock:
                state["stop"] = True
            for worker in workers:
                worker.join()


def _encoded_chunks(config: BuildConfig, encoder, run, corpus_path: Path, total: int) -> Iterator[np.ndarray]:
    texts: list[str] = []
    with tqdm(total=total, unit="doc", desc="encode passages", disable=not config.progress) as bar:
        for document in iter_documents(corpus_path):
            texts.append(document["contents"])
            if len(texts) == config.chunk_size:
                yield encoder.encode_passages(texts, on_batch=bar.update, run=run)
                texts = []
        if texts:
            yield encoder.encode_passages(texts, on_batch=bar.update, run=run)


def _open_saved(path: str, total: int) -> np.ndarray:
    try:
        embeddings = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as err:
        raise ValueError(f"--embeddings_path {path}: not a readable .npy file ({err})") from None
    if embeddings.ndim != 2 or len(embeddings) != total:
        raise ValueError(f"--embeddings_path {path} has shape {embeddings.shape}; the corpus has {total} documents")
    return embeddings


def _saved_chunks(path: str, embeddings: np.ndarray, chunk_size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(embeddings), chunk_size):
        chunk = np.ascontiguousarray(embeddings[start : start + chunk_size], dtype=np.float32)
        # An all-zero row is never an embedding: it is a row an interrupted build never wrote (files written before
        # saves went through a temporary name could be left at full size like that). Checked before indexing it.
        bad = np.flatnonzero(~chunk.any(axis=1) | ~np.isfinite(chunk).all(axis=1))
        if len(bad):
            raise ValueError(
                f"--embeddings_path {path}: row {start + int(bad[0])} (and {len(bad) - 1} more in rows {start} to "
                f"{start + len(chunk) - 1}) is all zeros or not finite, so the file is incomplete or corrupt; "
                "encode the corpus again (--save_embeddings writes a complete file or none)"
            )
        yield chunk


def _saving(chunks: Iterable[np.ndarray], path: str, total: int) -> Iterator[np.ndarray]:
    """Pass chunks through while writing them to a float32 .npy file (for Qdrant loads or rebuilds).

    The file is written under a temporary name and renamed once every row is in it, so `path` only ever holds a
    complete file; a failed build removes the partial one.
    """
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    store, start = None, 0
    try:
        for chunk in chunks:
            if store is None:
                store = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32, shape=(total, chunk.shape[1]))
            store[start : start + len(chunk)] = chunk
            start += len(chunk)
            yield chunk
        if store is None or start != total:
            raise ValueError(f"--save_embeddings {path}: got {start} embeddings for {total} documents")
        store.flush()
        del store
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_faiss_index(chunks: Iterable[np.ndarray], config: BuildConfig, index_path: Path) -> int:
    import faiss

    cpu_threads.configure_pools(cpu_threads.thread_count(config.num_threads))  # IVF/PQ training, adds
    metric = faiss.METRIC_INNER_PRODUCT if config.metric == "ip" else faiss.METRIC_L2
    index, pending, added = None, [], 0
    for chunk in chunks:
        if index is None:
            index = new_index(chunk.shape[1], config.faiss_type, metric, config.hnsw_ef_construction)
            if config.faiss_gpu:
                index = _to_gpu(index)
        if not index.is_trained:  # IVF / PQ: hold back vectors until there are enough to train on
            pending.append(chunk)
            if sum(len(part) for part in pending) < config.train_size:
                continue
            chunk, pending = np.concatenate(pending), []
            _train(index, chunk[: config.train_size])
        index.add(chunk)
        added += len(chunk)
    if pending:  # the corpus is smaller than --train_size: train on all of it
        chunk = np.concatenate(pending)
        _train(index, chunk)
        index.add(chunk)
        added += len(chunk)
    if index is None:
        raise ValueError("no vectors to index")
    if config.faiss_gpu:
        index = faiss.index_gpu_to_cpu(index)
    set_search_params(index, config.faiss_search_params)
    write_index(index, index_path)
    return added


def build_from_flat(config: BuildConfig, total: int) -> int:
    """--from_index: the layout from a Flat index's vectors, memory-mapped and streamed; IVF/PQ/SQ train on a random
    sample of --train_size rows (not the first rows, which follow the corpus's order)."""
    from local_dense_retriever.retrieval.index_files import FlatVectors

    vectors = FlatVectors(config.from_index)
    if vectors.size != total:
        raise ValueError(
            f"--from_index {config.from_index} has {vectors.size} vectors; the corpus has {total} documents"
        )
    cpu_threads.configure_pools(cpu_threads.thread_count(config.num_threads))
    layout = Layout(config.faiss_type, config.faiss_search_params or "", config.hnsw_ef_construction)
    built = build_layout(vectors, layout, config.train_size, progress=config.progress)
    write_index(built.index, Path(config.index_path))
    return built.index.ntotal


def _train(index, vectors: np.ndarray) -> None:
    logger.info("training %s on %d vectors", type(index).__name__, len(vectors))
    index.train(vectors)


def _to_gpu(index):
    """One GPU: training (k-means) is what gains; shards would each train their own quantizer."""
    import faiss

    from local_dense_retriever.retrieval.backends import faiss_gpu_count

    faiss_gpu_count()  # raises when there is none
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)


def write_qdrant_collection(chunks: Iterable[np.ndarray], config: BuildConfig) -> int:
    from qdrant_client import QdrantClient, models

    if bool(config.qdrant_url) == bool(config.qdrant_path):
        raise ValueError("give exactly one of --qdrant_url and --qdrant_path")
    client = QdrantClient(url=config.qdrant_url) if config.qdrant_url else QdrantClient(path=config.qdrant_path)
    try:
        added = 0
        for chunk in chunks:
            if added == 0:
                if client.collection_exists(config.qdrant_collection):
                    if not config.overwrite:
                        raise ValueError(f"Qdrant collection {config.qdrant_collection!r} exists; pass --overwrite")
                    client.delete_collection(config.qdrant_collection)
                # Dot product = FAISS's inner product, so scores and rankings match the FAISS path.
                vectors = models.VectorParams(size=chunk.shape[1], distance=models.Distance.DOT)
                client.create_collection(config.qdrant_collection, vectors_config=vectors)
            client.upload_collection(
                config.qdrant_collection, vectors=chunk, ids=range(added, added + len(chunk)), batch_size=256
            )
            added += len(chunk)
        return added
    finally:
        client.close()


def write_bm25_index(corpus_path: Path, out_dir: Path, progress: bool = True, stopwords: str = "en") -> int:
    import json

    import bm25s

    from local_dense_retriever.retrieval.backends import BM25_SETTINGS_FILE, bm25_tokenize

    texts = [document["contents"] for document in iter_documents(corpus_path)]
    retriever = bm25s.BM25()
    retriever.index(bm25_tokenize(texts, stopwords, show_progress=progress), show_progress=progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    retriever.save(str(out_dir), show_progress=progress)
    (out_dir / BM25_SETTINGS_FILE).write_text(json.dumps({"stopwords": stopwords}))
    return len(texts)


def default_index_path(save_dir: str, retriever_name: str, faiss_type: str) -> str:
    """FlashRAG / Search-R1 naming: e5_Flat.index; a `bm25` directory for BM25."""
    if retriever_name.lower() == "bm25":
        return str(Path(save_dir) / "bm25")
    return str(Path(save_dir) / f"{retriever_name}_{faiss_type.replace(',', '_')}.index")


def _output_locations(config: BuildConfig) -> list[tuple[str, Path, str]]:
    """(what, path, "file" | "directory") for everything the build writes."""
    corpus = Path(config.corpus_path)
    decompressed = corpus.with_suffix("") if corpus.suffix == ".gz" else corpus
    outputs = [("the corpus's offset sidecar", offsets_path_for(decompressed), "file")]
    if corpus.suffix == ".gz":
        outputs.append(("the decompressed corpus", decompressed, "file"))
    if config.is_bm25:
        outputs.append(("the BM25 index (--index_path / --save_dir)", Path(config.index_path), "directory"))
        return outputs
    if config.backend == "qdrant":
        if config.qdrant_path:
            outputs.append(("the Qdrant storage (--qdrant_path)", Path(config.qdrant_path), "directory"))
    else:
        outputs.append(("the index (--index_path / --save_dir)", Path(config.index_path), "file"))
    if config.save_embeddings:
        outputs.append(("the embeddings (--save_embeddings)", Path(config.save_embeddings), "file"))
    return outputs


def check_output_locations(config: BuildConfig) -> None:
    """Create and write-test every output location now, not after hours of encoding (wiki-18: ~21M passages)."""
    for what, path, kind in _output_locations(config):
        directory = path if kind == "directory" else path.parent
        if kind == "file" and path.is_dir():
            raise ValueError(f"{what}: {path} is a directory")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".{path.name}.write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            reason = f"{err.strerror or err}: {err.filename or directory}"
            raise ValueError(f"{what}: cannot write {path} ({reason})") from None


def check_free_space(config: BuildConfig, total: int, dim: int) -> None:
    """Vectors are written through a memory map: a full disk there kills the process (SIGBUS), so check first."""
    needed: dict[int, tuple[int, Path]] = {}
    files = [Path(config.save_embeddings)] if config.save_embeddings else []
    if config.backend == "faiss" and config.faiss_type == "Flat":  # BM25 builds never get here
        files.append(Path(config.index_path))  # a Flat index holds every vector too; others are smaller
    for path in files:
        device = path.parent.stat().st_dev
        size, _ = needed.get(device, (0, path))
        needed[device] = (size + total * dim * 4, path)
    for size, path in needed.values():
        free = shutil.disk_usage(path.parent).free
        if free < size:
            raise ValueError(
                f"{path.parent} has {free / 2**30:.1f} GiB free but {total} {dim}-d float32 vectors need "
                f"{size / 2**30:.1f} GiB there"
            )


def validate_corpus(corpus_path: Path, total: int, progress: bool) -> None:
    """Parse every line before encoding any: a bad line at row 20M must not cost the hours before it."""
    with tqdm(total=total, unit="doc", desc="check corpus", disable=not progress) as bar:
        for count, _ in enumerate(iter_documents(corpus_path), start=1):
            if count % 65536 == 0:
                bar.update(65536)
        bar.update(total - bar.n)


def build(config: BuildConfig) -> BuildSummary:
    started = time.perf_counter()
    check_output_locations(config)
    corpus_path = ensure_decompressed(Path(config.corpus_path), progress=config.progress)
    total = count_documents(corpus_path, progress=config.progress)  # also leaves the sidecar for the server
    if config.is_bm25:
        added = write_bm25_index(corpus_path, Path(config.index_path), progress=config.progress)
        output = config.index_path
    else:
        if config.from_index:
            chunks = None
        elif config.embeddings_path:
            embeddings = _open_saved(config.embeddings_path, total)
            check_free_space(config, total, embeddings.shape[1])
            chunks = _saved_chunks(config.embeddings_path, embeddings, config.chunk_size)
        else:
            validate_corpus(corpus_path, total, config.progress)
            encoder, run = _load_encoder(config)
            check_free_space(config, total, encoder.dim)
            chunks = _encoded_chunks(config, encoder, run, corpus_path, total)
        if config.save_embeddings and chunks is not None:
            chunks = _saving(chunks, config.save_embeddings, total)
        if config.from_index:
            added = build_from_flat(config, total)
            output = config.index_path
        elif config.backend == "qdrant":
            added = write_qdrant_collection(chunks, config)
            output = f"qdrant collection {config.qdrant_collection} at {config.qdrant_url or config.qdrant_path}"
        else:
            added = write_faiss_index(chunks, config, Path(config.index_path))
            output = config.index_path
    if added != total:
        raise ValueError(f"indexed {added} documents but {corpus_path} has {total} lines")
    return BuildSummary(documents=added, seconds=time.perf_counter() - started, output=output)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Encode a corpus jsonl into a FAISS index, a Qdrant collection or a BM25 index.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--corpus_path", required=True, help="corpus .jsonl or .jsonl.gz")
    parser.add_argument("--retriever_name", "--retrieval_method", default="e5", help="e5, bge, dpr, any name, bm25")
    parser.add_argument("--retriever_model", "--model_path", default="intfloat/e5-base-v2")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--index_path", help="output FAISS index file (BM25: directory)")
    out.add_argument("--save_dir", help="output directory; the file is named <retriever_name>_<faiss_type>.index")
    parser.add_argument("--backend", choices=["faiss", "qdrant"], default="faiss")
    parser.add_argument("--faiss_type", default="Flat", help="faiss.index_factory string: Flat, HNSW32, IVF4096,PQ64")
    parser.add_argument("--metric", choices=["ip", "l2"], default="ip")
    parser.add_argument("--faiss_gpu", action="store_true", help="train and add on the first GPU (IVF/PQ k-means)")
    parser.add_argument("--train_size", type=int, default=200_000, help="vectors used to train IVF/PQ types")
    parser.add_argument("--chunk_size", type=int, default=16_384, help="passages encoded and added at a time")
    parser.add_argument("--max_length", type=int, default=256, help="passage tokens kept by the encoder")
    parser.add_argument("--batch_size", type=int, default=None, help="max passages per forward pass")
    parser.add_argument("--max_tokens_per_forward", type=int, default=None, help="padded tokens per forward pass")
    parser.add_argument("--num_threads", type=int, default=None, help="CPU threads for encoding (usable CPUs)")
    parser.add_argument("--pooling_method", choices=["auto", "mean", "cls", "pooler"], default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", choices=["auto", "fp32", "fp16", "bf16"], default="auto", help="auto: fp16 on GPU")
    parser.add_argument("--use_fp16", action="store_true", help="same as --dtype fp16 (FlashRAG's flag)")
    parser.add_argument(
        "--from_index",
        help="a Flat FAISS index of this corpus: build --faiss_type from its vectors (no encoding; the tuner's way)",
    )
    parser.add_argument(
        "--faiss_search_params", help='written into the index, e.g. "efSearch=128" (HNSW) or "nprobe=64" (IVF)'
    )
    parser.add_argument(
        "--hnsw_ef_construction",
        type=int,
        default=None,
        help="HNSW only: the graph's build-time breadth (FAISS's default 40); higher keeps recall at a given "
        "efSearch for a longer build (the tuner measures it: --candidates HNSW32:efConstruction=200,efSearch=256)",
    )
    parser.add_argument(
        "--embeddings_path",
        "--embedding_path",
        help="float32 .npy of passage embeddings to index instead of encoding",
    )
    saving = parser.add_mutually_exclusive_group()
    saving.add_argument("--save_embeddings", help="also write the passage embeddings to this .npy file")
    saving.add_argument(
        "--save_embedding",
        action="store_true",
        help="FlashRAG's flag: write them to emb_<retriever_name>.npy beside the index",
    )
    parser.add_argument("--qdrant_url", help="Qdrant server URL (--backend qdrant)")
    parser.add_argument("--qdrant_path", help="qdrant-client embedded storage directory (--backend qdrant)")
    parser.add_argument("--qdrant_collection", default="search_r1")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing Qdrant collection")
    parser.add_argument("--no_progress", action="store_true")
    return parser


def parse_config(argv: list[str] | None = None) -> BuildConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not Path(args.corpus_path).is_file():
        parser.error(f"--corpus_path {args.corpus_path}: no such file")
    if args.embeddings_path and not Path(args.embeddings_path).is_file():
        parser.error(f"--embeddings_path {args.embeddings_path}: no such file")
    if args.from_index:
        from local_dense_retriever.retrieval.index_files import read_header

        header = read_header(args.from_index) if Path(args.from_index).is_file() else None
        if header is None or not header.is_flat:
            parser.error(f"--from_index {args.from_index}: accepted is an existing Flat FAISS index file")
        if args.embeddings_path or args.backend != "faiss" or args.retriever_name.lower() == "bm25":
            parser.error("--from_index builds a FAISS index: accepted without --embeddings_path, qdrant and bm25")
    is_bm25 = args.retriever_name.lower() == "bm25"
    index_path = args.index_path
    if args.save_dir:
        index_path = default_index_path(args.save_dir, args.retriever_name, args.faiss_type)
    if (is_bm25 or args.backend == "faiss") and not index_path:
        parser.error("give --index_path or --save_dir for the output")
    if args.backend == "qdrant" and not is_bm25 and bool(args.qdrant_url) == bool(args.qdrant_path):
        parser.error("--backend qdrant needs exactly one of --qdrant_url and --qdrant_path")
    for flag in ("train_size", "chunk_size", "max_length", "batch_size", "max_tokens_per_forward", "num_threads"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag} must be at least 1, got {value}")
    if args.hnsw_ef_construction is not None and (args.hnsw_ef_construction < 1 or "HNSW" not in args.faiss_type):
        parser.error(
            f"--hnsw_ef_construction {args.hnsw_ef_construction}: accepted is an integer >= 1 with an HNSW "
            f"--faiss_type (got --faiss_type {args.faiss_type})"
        )
    if not is_bm25 and args.backend == "faiss" and (not args.embeddings_path or args.faiss_search_params):
        try:
            import faiss

            probe = faiss.index_factory(768, args.faiss_type)  # syntax check before hours of encoding
        except RuntimeError as err:
            parser.error(f"--faiss_type {args.faiss_type!r} is not a valid faiss.index_factory string: {err}")
        try:
            set_search_params(probe, args.faiss_search_params)
        except RuntimeError as err:
            reason = re.sub(r"^Error in .*? at \S+:\d+: ", "", str(err).strip())
            parser.error(
                f"--faiss_search_params {args.faiss_search_params!r} does not apply to {args.faiss_type}: {reason}"
            )
    model = args.retriever_model
    if (
        not is_bm25 and not args.embeddings_path and not args.from_index
    ):  # last: for a hub id that is not cached this asks the hub
        try:
            model = check_model_source(args.retriever_model)
        except ValueError as err:
            parser.error(f"--retriever_model {err}")
    return BuildConfig(
        corpus_path=args.corpus_path,
        index_path=index_path,
        retriever_name=args.retriever_name,
        retriever_model=model,
        backend=args.backend,
        faiss_type=args.faiss_type,
        metric=args.metric,
        faiss_gpu=args.faiss_gpu,
        train_size=args.train_size,
        chunk_size=args.chunk_size,
        max_length=args.max_length,
        batch_size=args.batch_size,
        max_tokens_per_forward=args.max_tokens_per_forward,
        num_threads=args.num_threads,
        pooling_method=args.pooling_method,
        device=args.device,
        dtype="fp16" if args.use_fp16 else args.dtype,
        embeddings_path=args.embeddings_path,
        from_index=args.from_index,
        faiss_search_params=args.faiss_search_params,
        hnsw_ef_construction=args.hnsw_ef_construction,
        save_embeddings=(
            str(Path(index_path).parent / f"emb_{args.retriever_name}.npy")
            if args.save_embedding
            else args.save_embeddings
        ),
        qdrant_url=args.qdrant_url,
        qdrant_path=args.qdrant_path,
        qdrant_collection=args.qdrant_collection,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Before parse_config imports faiss and encoding imports torch (OpenMP reads it only then).
    known, _ = build_parser().parse_known_args(argv)
    cpu_threads.set_wait_policy(tuned=known.num_threads is None)
    config = parse_config(argv)
    try:
        summary = build(config)
    except (CorpusFormatError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"indexed {summary.documents} documents into {summary.output} in {summary.seconds:.1f} s")
    return 0
