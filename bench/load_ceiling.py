"""The in-process ceiling of the retriever load benchmark (bench/retriever_load.py): the batched encode + FAISS
search the server does, timed without HTTP, in the two ways the CPUs can be spent; the best of --repeats runs, each
after other processes went quiet."""

import threading
import time
from pathlib import Path

import numpy as np
from cpu_neighbours import ForeignCpu, wait_until_quiet
from load_points import TOPK

from local_dense_retriever.demo import embedded_default


def measure_ceiling(model_dir: Path, index_path: Path, questions: list[str], batch: int, reps: int) -> dict:
    """Best-case throughput: the batched encode + FAISS search the server does, timed in-process (no HTTP), in the
    two ways the CPUs can be spent: one batch at a time on every CPU (libgomp's default wait: this process sets
    no policy), and one single-threaded batch per CPU side by side (own tokenizers, shared model and index).
    `qps` is the better of the two: the machine's ceiling, whichever layout the server picks."""
    import faiss
    import torch

    from local_dense_retriever.retrieval import cpu_threads
    from local_dense_retriever.retrieval.backends import DenseSearcher, FaissIndex
    from local_dense_retriever.retrieval.encoders import TextEncoder

    cpus = cpu_threads.thread_count()
    encoder = TextEncoder(str(model_dir), retriever_name=embedded_default.RETRIEVER_NAME, device="cpu")
    cpu_threads.configure_pools(cpus)
    searcher = DenseSearcher(encoder, FaissIndex(index_path))
    rng = np.random.default_rng(1)
    samples = [[questions[i] for i in rng.choice(len(questions), batch, replace=False)] for _ in range(reps)]
    searcher.search(samples[0], TOPK)  # warm-up
    encode_s, search_s = [], []
    for sample in samples:
        started = time.perf_counter()
        vectors = encoder.encode_queries(sample)
        encoded = time.perf_counter()
        searcher.index.search_vectors(vectors, TOPK)
        encode_s.append(encoded - started)
        search_s.append(time.perf_counter() - encoded)
    shared_qps = batch / float(np.median(np.array(encode_s) + np.array(search_s)))

    searchers = [searcher] + [searcher.fork() for _ in range(cpus - 1)]
    barrier = threading.Barrier(cpus)
    seconds = [0.0] * cpus

    def single_threaded(worker: int) -> None:
        torch.set_num_threads(1)
        faiss.omp_set_num_threads(1)  # per thread in libgomp
        searchers[worker].search(samples[0], TOPK)  # warm-up
        barrier.wait()
        started = time.perf_counter()
        for sample in samples[worker::cpus] * cpus:  # every worker runs `reps` batches
            searchers[worker].search(sample, TOPK)
        seconds[worker] = time.perf_counter() - started

    workers = [threading.Thread(target=single_threaded, args=(worker,)) for worker in range(cpus)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    cpu_threads.configure_pools(cpus)
    split_qps = sum(len(samples[worker::cpus] * cpus) for worker in range(cpus)) * batch / max(seconds)
    return {
        "batch": batch,
        "encode_ms": 1000 * float(np.median(encode_s)),
        "search_ms": 1000 * float(np.median(search_s)),
        "shared_qps": shared_qps,
        "split_qps": split_qps,
        "qps": max(shared_qps, split_qps),
    }


def best_ceiling(assets, index_path: Path, questions: list[str], args) -> dict:
    """measure_ceiling `--repeats` times, each after other processes went quiet; the best, with the range."""
    candidates = []
    for _ in range(args.repeats):
        wait_until_quiet(args.wait_for_quiet)
        with ForeignCpu() as foreign:
            candidates.append(measure_ceiling(assets.model_dir, index_path, questions, 64, args.ceiling_reps))
        candidates[-1]["other_cores"] = foreign.cores
    best = max(candidates, key=lambda c: c["qps"])
    best["qps_range"] = (min(candidate["qps"] for candidate in candidates), best["qps"])
    best["candidates"] = [round(candidate["qps"], 1) for candidate in candidates]
    print(f"  ceiling {best['qps']:.0f} queries/s (one batch on every CPU {best['shared_qps']:.0f}, one "
          f"single-threaded batch per CPU {best['split_qps']:.0f}; other processes {best['other_cores']:.2f} "
          "cores)", flush=True)  # fmt: skip
    return best
