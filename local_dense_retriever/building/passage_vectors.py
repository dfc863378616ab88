"""The passage vectors an index is built from, one chunk at a time: encoded from the corpus (the encoder on every
GPU, or on the CPU in the layout the thread tuner measures fastest), or read from a saved .npy of embeddings
(checked for rows never written); and, on request, saved to a .npy as they pass."""

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from local_dense_retriever.building.index_config import BuildConfig
from local_dense_retriever.retrieval import cpu_threads
from local_dense_retriever.retrieval.corpus import iter_documents

logger = logging.getLogger("local_dense_retriever.index_builder")


def load_encoder(config: BuildConfig):
    """The encoder, and how its forward passes run: on the CPU, in the layout the tuner
    measures fastest (as in the server: one pass on every CPU, or one single-threaded pass per CPU beside busy
    processes)."""
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


def encoded_chunks(
    encoder, run, corpus_path: Path, total: int, chunk_size: int, progress: bool
) -> Iterator[np.ndarray]:
    """The corpus's passages encoded `chunk_size` at a time, in corpus order."""
    texts: list[str] = []
    with tqdm(total=total, unit="doc", desc="encode passages", disable=not progress) as bar:
        for document in iter_documents(corpus_path):
            texts.append(document["contents"])
            if len(texts) == chunk_size:
                yield encoder.encode_passages(texts, on_batch=bar.update, run=run)
                texts = []
        if texts:
            yield encoder.encode_passages(texts, on_batch=bar.update, run=run)


def open_saved(path: str, total: int) -> np.ndarray:
    """--embeddings_path, memory-mapped: one row per corpus line."""
    try:
        embeddings = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as err:
        raise ValueError(f"--embeddings_path {path}: not a readable .npy file ({err})") from None
    if embeddings.ndim != 2 or len(embeddings) != total:
        raise ValueError(f"--embeddings_path {path} has shape {embeddings.shape}; the corpus has {total} documents")
    return embeddings


def saved_chunks(path: str, embeddings: np.ndarray, chunk_size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(embeddings), chunk_size):
        chunk = np.ascontiguousarray(embeddings[start : start + chunk_size], dtype=np.float32)
        # An all-zero row is never an embedding: it is a row that was never written (a file preallocated at full
        # size by a writer that stopped early). Checked before indexing it.
        bad = np.flatnonzero(~chunk.any(axis=1) | ~np.isfinite(chunk).all(axis=1))
        if len(bad):
            raise ValueError(
                f"--embeddings_path {path}: row {start + int(bad[0])} (and {len(bad) - 1} more in rows {start} to "
                f"{start + len(chunk) - 1}) is all zeros or not finite, so the file is incomplete or corrupt; "
                "encode the corpus again (--save_embeddings writes a complete file or none)"
            )
        yield chunk


def saving(chunks: Iterable[np.ndarray], path: str, total: int) -> Iterator[np.ndarray]:
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
