"""What the server loads before it answers: the model, index and corpus, checked against each other, and the
batching workers (one per batch the CPU layout may run at once); in a background thread, so the server listens at
once and /health says which stage it is at."""

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from local_dense_retriever.retrieval import cpu_threads
from local_dense_retriever.retrieval.corpus import Corpus
from local_dense_retriever.retrieval.pages import Pages
from local_dense_retriever.serving.batcher import DynamicBatcher
from local_dense_retriever.serving.config import ServerConfig

logger = logging.getLogger("local_dense_retriever")

CPU_MAX_BATCH_SIZE = 64
GPU_MAX_BATCH_SIZE = 512


@dataclass
class Resources:
    searcher: object
    corpus: Corpus
    batcher: DynamicBatcher
    description: str
    thread_settings: dict = field(default_factory=dict)  # what the process was given (usable CPUs, wait policy)
    thread_tuner: cpu_threads.ThreadTuner | None = None  # how it spends the CPUs now (batches x threads)
    pages: Pages | None = None  # --pages_path: POST /access

    def close(self) -> None:
        self.batcher.close()
        self.corpus.close()
        if self.pages is not None:
            self.pages.close()
        if hasattr(self.searcher, "close"):
            self.searcher.close()


def load_resources(config: ServerConfig, report: Callable[[str], None] = lambda stage: None) -> Resources:
    """Model, index and corpus, checked against each other, the pages when given, plus the batching workers."""
    report("importing torch and faiss")
    from local_dense_retriever.retrieval import backends

    tuner = None
    if config.is_bm25:
        report("loading the BM25 index")
        searcher = backends.BM25Searcher(config.index_path)
        max_batch_size = config.max_batch_size or CPU_MAX_BATCH_SIZE
    else:
        from local_dense_retriever.retrieval.encoders import encoder_from_config

        report("loading the encoder")
        encoder = encoder_from_config(config)
        threads = cpu_threads.thread_count(config.num_threads)
        report("loading the index")
        if config.backend == "qdrant":
            index = backends.QdrantIndex(config.qdrant_collection, url=config.qdrant_url, path=config.qdrant_path)
        else:
            index = backends.FaissIndex(
                config.index_path,
                use_gpu=config.faiss_gpu,
                gpu_fp16=config.faiss_fp16,
                search_params=config.faiss_search_params,
                mmap=config.faiss_mmap,
            )
        cpu_threads.configure_pools(threads)  # torch and faiss are loaded now
        searcher = backends.DenseSearcher(encoder, index)
        # The tuner picks how the CPU threads are spent, by measurement (--num_threads fixes one batch on that many
        # threads; GPUs need no tuning). Batches may run side by side only where each worker can have a searcher of
        # its own: an encoder on the CPU and a FAISS index on the CPU (GPU indexes are not thread-safe).
        on_cpu = encoder.device.type == "cpu" or (config.backend == "faiss" and not config.faiss_gpu)
        parallel = encoder.device.type == "cpu" and config.backend == "faiss" and not config.faiss_gpu
        tuner = cpu_threads.ThreadTuner(
            threads, adaptive=on_cpu and config.num_threads is None, parallel_batches=parallel
        )
        max_batch_size = config.max_batch_size or (
            GPU_MAX_BATCH_SIZE if encoder.device.type == "cuda" else CPU_MAX_BATCH_SIZE
        )
    report("opening the corpus")
    corpus = Corpus(config.corpus_path)
    if len(corpus) != searcher.size:
        raise ValueError(
            f"--corpus_path {corpus.path} has {len(corpus)} documents but the index has {searcher.size}; "
            "row i of the index must be line i of the corpus (were they built from the same file?)"
        )
    pages = None
    if config.pages_path is not None:
        report("opening the pages (their URL index is built once, in one pass)")
        pages = Pages(config.pages_path)
    report("warming up")
    searcher.search(["warm-up query"], min(config.topk, len(corpus)))
    workers = tuner.workers if tuner else 1
    searches = [searcher.search] + [searcher.fork().search for _ in range(workers - 1)]
    batcher = DynamicBatcher(searches, max_batch_size=max_batch_size, max_wait_ms=config.max_wait_ms, tuner=tuner)
    description = f"{searcher.description}; corpus {corpus.path} ({len(corpus)} documents)"
    settings = cpu_threads.report()
    logger.info("CPU threads: %s", settings)
    if pages is not None:
        description += f"; pages {pages.path} ({len(pages)})"
    return Resources(searcher, corpus, batcher, description, settings, tuner, pages)


class Runtime:
    """Loading state shared by the routes: loading -> ok, or loading -> failed."""

    def __init__(self, load: Callable[[Callable[[str], None]], Resources]):
        self._load = load
        self.status = "loading"
        self.stage = "starting"
        self.load_seconds: dict[str, float] = {}  # per stage, so slow startups say where the time went
        self._stage_started = time.perf_counter()
        self.error: str | None = None
        self.resources: Resources | None = None
        self.on_failure: Callable[[], None] = lambda: None

    def start(self) -> None:
        threading.Thread(target=self._run, name="retriever-loader", daemon=True).start()

    def _run(self) -> None:
        try:
            self.resources = self._load(self._report)
        except Exception as err:
            self.status, self.error = "failed", f"{type(err).__name__}: {err}"
            if isinstance(err, ValueError | OSError):  # bad or mismatched inputs: the message says which
                logger.error("the retriever failed to load: %s", " ".join(str(err).split()))
            else:  # a bug: keep the traceback
                logger.exception("the retriever failed to load")
            self.on_failure()
            return
        self._close_stage("ready")
        gc.freeze()  # the model, index and tokenizer live forever: keep them out of every full GC pass
        self.status = "ok"
        logger.info("retriever ready in %.1f s: %s", sum(self.load_seconds.values()), self.resources.description)

    def _close_stage(self, next_stage: str) -> None:
        now = time.perf_counter()
        self.load_seconds[self.stage] = round(now - self._stage_started, 3)
        self.stage, self._stage_started = next_stage, now

    def _report(self, stage: str) -> None:
        self._close_stage(stage)
        logger.info("%s ...", stage)
