"""What the server loads before it answers: the model, index and corpus, checked against each other, and the
batching workers (one per batch the CPU layout may run at once); in a background thread, so the server listens at
once and /health says which stage it is at."""

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from local_dense_retriever.retrieval import cpu_threads
from local_dense_retriever.retrieval.corpus import Corpus
from local_dense_retriever.retrieval.pages import Pages
from local_dense_retriever.serving.batcher import DynamicBatcher
from local_dense_retriever.serving.config import ServerConfig
from local_dense_retriever.serving.limits import QueryReading

logger = logging.getLogger("local_dense_retriever")

CPU_MAX_BATCH_SIZE = 64
GPU_MAX_BATCH_SIZE = 512
# The default token bound of a batch, per query of its size (1,024 for 64): 64 questions fit (FanOutQA's average
# 12.8 tokens with MiniLM's tokenizer, 14.8 with E5's "query: "), so it leaves their batches as they are, while 4
# long queries of 256 tokens make a batch: what a query sent beside them waits for (bench/RESULTS.md).
TOKENS_PER_QUERY = 16


@dataclass
class Resources:
    searcher: object
    corpus: Corpus
    batcher: DynamicBatcher
    description: str
    thread_settings: dict = field(default_factory=dict)  # what the process was given (usable CPUs, wait policy)
    thread_tuner: cpu_threads.ThreadTuner | None = None  # how it spends the CPUs now (batches x threads)
    pages: Pages | None = None  # --pages_path: POST /access
    reading: QueryReading = field(default_factory=lambda: QueryReading(None))  # queries as the encoder reads them

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

    tuner, reader = None, None
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
        index = load_vector_index(config, encoder.dim)
        cpu_threads.configure_pools(threads)  # torch and faiss are loaded now
        searcher = backends.DenseSearcher(encoder, index)
        faiss_on_cpu = config.backend == "faiss" and not config.faiss_gpu and not config.torch_search
        # The tuner picks how the CPU threads are spent, by measurement (--num_threads fixes one batch on that many
        # threads; GPUs need no tuning). Batches may run side by side only where each worker can have a searcher of
        # its own: an encoder on the CPU and a FAISS index on the CPU (GPU indexes are not thread-safe).
        on_cpu = encoder.device.type == "cpu" or faiss_on_cpu or config.torch_search == "cpu"
        parallel = encoder.device.type == "cpu" and faiss_on_cpu
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
    if not config.is_bm25 and config.dtype == "measured" and searcher.encoder.device.type == "cpu":
        report("choosing the encoder's precision on this CPU (fp32, bf16, int8: measured)")
        searcher = choose_encoder_precision(config, searcher, corpus)
    pages = None
    if config.pages_path is not None:
        report("opening the pages (their URL index is built once, in one pass)")
        pages = Pages(config.pages_path)
    report("warming up")
    searcher.search(["warm-up query"], min(config.topk, len(corpus)))
    if not config.is_bm25:  # before the workers start: it copies the tokenizer no one else is using then
        reader = searcher.encoder.query_reader()
    workers = tuner.workers if tuner else 1
    searches = [searcher.search] + [searcher.fork().search for _ in range(workers - 1)]
    batcher = DynamicBatcher(
        searches,
        max_batch_size=max_batch_size,
        max_wait_ms=config.max_wait_ms,
        max_batch_tokens=None if config.is_bm25 else config.max_batch_tokens or TOKENS_PER_QUERY * max_batch_size,
        tuner=tuner,
    )
    description = f"{searcher.description}; corpus {corpus.path} ({len(corpus)} documents)"
    settings = cpu_threads.report()
    logger.info("CPU threads: %s", settings)
    if pages is not None:
        description += f"; pages {pages.path} ({len(pages)})"
    return Resources(searcher, corpus, batcher, description, settings, tuner, pages, QueryReading(reader))


def load_vector_index(config: ServerConfig, encoder_dim: int):
    """The index the server searches: a Qdrant collection, torch shards of a Flat index's vectors, or a FAISS index
    file (on the CPU, memory-mapped, or cloned to the GPUs). The file's dimension is checked from its header and
    the layout's memory against what is free, in seconds, before a multi-GB file is read."""
    from local_dense_retriever.retrieval import backends
    from local_dense_retriever.retrieval.index_files import check_dimension

    if config.backend == "qdrant":
        return backends.QdrantIndex(config.qdrant_collection, url=config.qdrant_url, path=config.qdrant_path)
    check_dimension(config.index_path, encoder_dim)
    if config.torch_search:
        from local_dense_retriever.retrieval.index_files import FlatVectors
        from local_dense_retriever.retrieval.torch_search import TorchExactIndex, parse_devices

        devices = parse_devices(config.torch_search)
        return TorchExactIndex(
            FlatVectors(config.index_path), devices, config.torch_search_dtype, config.search_workspace_mb
        )
    if not config.faiss_mmap:
        check_ram_for_index(config.index_path)
    return backends.FaissIndex(
        config.index_path,
        use_gpu=config.faiss_gpu,
        gpu_fp16=config.faiss_fp16,
        search_params=config.faiss_search_params,
        mmap=config.faiss_mmap,
    )


def check_ram_for_index(index_path: str) -> None:
    """A FAISS index is read whole into RAM: refuse one larger than the memory available now."""
    from local_dense_retriever.retrieval.memory_plan import available_ram, gib

    size, available = Path(index_path).stat().st_size, available_ram()
    if size > available:
        raise ValueError(
            f"--index_path {index_path} is {gib(size)} but {gib(available)} of RAM is available; accepted: a layout "
            "that fits (python -m local_dense_retriever.tune_index), --faiss_mmap for a Flat index, or --torch_search "
            "on GPUs"
        )


def choose_encoder_precision(config: ServerConfig, searcher, corpus: Corpus):
    """The searcher with the CPU encoder in the precision measured best here (precision.py); cached per machine."""
    from local_dense_retriever.retrieval import backends, precision
    from local_dense_retriever.retrieval.encoders import encoder_from_config
    from local_dense_retriever.retrieval.questions import corpus_queries, read_questions

    settings = {"name": config.retriever_name, "max_length": config.max_length, "queries": config.precision_queries}
    settings["threads"] = cpu_threads.thread_count(config.num_threads)
    key = precision.cache_key(config.retriever_model, config.index_path, settings)
    choice = precision.load_cached(key)
    encoders = {"fp32": searcher.encoder}
    if choice is None:
        if config.precision_queries:
            queries = read_questions(config.precision_queries, limit=precision.PROBE_QUERIES)
            probe = f"{len(queries)} questions of {config.precision_queries}"
        else:
            queries = corpus_queries(corpus, precision.PROBE_QUERIES)
            probe = f"the first words of {len(queries)} corpus passages (--precision_queries gives real questions)"
        choice, encoders = precision.choose(
            searcher.encoder,
            lambda name: encoder_from_config(replace(config, dtype=name)),
            searcher.index.search_vectors,
            queries,
            probe,
            precision.cpu_candidates(),
            k=min(3, searcher.size),
        )
        precision.store_cached(key, choice)
    logger.info("encoder precision %s%s", choice.summary(), " (cached)" if choice.cached else "")
    if choice.chosen == "fp32":
        return searcher
    encoder = encoders.get(choice.chosen) or encoder_from_config(replace(config, dtype=choice.chosen))
    return backends.DenseSearcher(encoder, searcher.index)


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
