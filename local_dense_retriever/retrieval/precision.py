"""The encoder's precision on the CPU, chosen by measurement on the machine that serves.

bf16 (where the processor has AVX512-BF16 or AMX) and int8 (dynamically quantised Linear layers) are tried against
fp32 on the same probe queries: each must encode them at least MIN_SPEEDUP times faster than fp32, and its top-k
rows through the served index must be the same set as fp32's for at least MIN_AGREEMENT of the queries; the fastest
that passes is used, else fp32. The decision is cached (per model, index, CPU and torch version) so a restart does
not measure again. Only with `--dtype measured`: the default (`auto`) keeps fp32 on the CPU, where a query's answer
does not depend on the other queries of its batch (with bf16 or int8 it moves within SCORE_TOLERANCE).
"""

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

MIN_SPEEDUP = 1.15  # below this, noise between two timings could flip the choice back and forth
MIN_AGREEMENT = 0.99
PROBE_QUERIES = 128  # two server batches: enough to time, and 1% is one query in 100
BATCH = 64  # the server's CPU batch size
CACHE_ENV = "LOCAL_DENSE_RETRIEVER_CACHE"
# How far a query's scores may move with the other queries of its batch (padding length and kernel tiling change the
# order of sums): fp32 ~1e-7; bf16 vectors differed by up to 1.1e-3 per element here (cosine >= 0.99999), so scores
# by up to ~5e-3; int8 quantises each batch's activations with one scale, so more. Answers compared across batches
# (tests, benchmarks) allow documents whose scores tie within this to swap.
SCORE_TOLERANCE = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 5e-3, "int8": 2e-2}


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_candidates(flags: set[str] | None = None) -> list[str]:
    """The reduced precision worth trying on this CPU: bf16 where it has native bf16 instructions (emulated bf16 is
    slower than fp32); else int8 where torch has an x86 quantised engine. One, not both: each trial costs seconds
    of start-up, and int8 quantises each batch's activations with one scale, so its answers move more with the
    other queries of a batch (SCORE_TOLERANCE) and its top-3 rows agreed with fp32's far less often here."""
    import torch

    flags = cpu_flags() if flags is None else flags
    if {"avx512_bf16", "amx_bf16"} & flags:
        return ["bf16"]
    if {"x86", "fbgemm"} & set(torch.backends.quantized.supported_engines):
        return ["int8"]
    return []


@dataclass
class Trial:
    precision: str
    queries_per_s: float
    agreement: float | None = None  # share of probe queries whose top-k rows equal fp32's (as a set)
    speedup: float | None = None
    error: str | None = None


@dataclass
class PrecisionChoice:
    chosen: str
    reason: str
    probe: str  # what the probe queries were
    trials: list[Trial] = field(default_factory=list)
    cached: bool = False

    def summary(self) -> str:
        figures = ", ".join(
            f"{t.precision} {t.queries_per_s:.0f} q/s"
            + (f" ({t.speedup:.2f}x, top-3 agreement {t.agreement:.1%})" if t.agreement is not None else "")
            + (f" failed: {t.error}" if t.error else "")
            for t in self.trials
        )
        return f"{self.chosen}: {self.reason} [{figures}; probe: {self.probe}]"


def time_encoding(encoder, queries: list[str], rounds: int = 1, warm_up: bool = True) -> tuple[float, np.ndarray]:
    """Queries/s of encoding `queries` in server-sized batches (best of `rounds`), and the vectors."""
    if warm_up:
        encoder.encode_queries(queries[:BATCH])  # the first calls build kernels and specialise the traced graph
    best, vectors = float("inf"), None
    for _ in range(rounds):
        started = time.perf_counter()
        parts = [encoder.encode_queries(queries[i : i + BATCH]) for i in range(0, len(queries), BATCH)]
        best = min(best, time.perf_counter() - started)
        vectors = np.concatenate(parts)
    return len(queries) / best, vectors


def agreement(rows_a: np.ndarray, rows_b: np.ndarray) -> float:
    """Share of queries whose top-k rows are the same set (the order of near-ties may differ)."""
    same = [set(a.tolist()) == set(b.tolist()) for a, b in zip(rows_a, rows_b, strict=True)]
    return float(np.mean(same)) if same else 0.0


def choose(
    fp32_encoder,
    make_encoder: Callable[[str], object],
    search: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]],
    queries: list[str],
    probe: str,
    candidates: list[str],
    k: int = 3,
    min_speedup: float = MIN_SPEEDUP,
    min_agreement: float = MIN_AGREEMENT,
    measure: Callable = time_encoding,
) -> tuple[PrecisionChoice, dict]:
    """Measure fp32 and each candidate; returns the choice and the candidates' encoders by name (to reuse the
    chosen one). Timings alternate (fp32, candidate, fp32, candidate) and each keeps its best, so drift favours
    neither. `measure(encoder, queries, warm_up=...)` gives (queries/s, vectors)."""
    base_qps, base_vectors = measure(fp32_encoder, queries)
    _, base_rows = search(base_vectors, k)
    trials = [Trial("fp32", base_qps)]
    encoders = {"fp32": fp32_encoder}
    for name in candidates:
        try:
            encoder = make_encoder(name)
            qps, vectors = measure(encoder, queries)
            base_qps = max(base_qps, measure(fp32_encoder, queries, warm_up=False)[0])
            qps = max(qps, measure(encoder, queries, warm_up=False)[0])
            _, rows = search(vectors, k)
        except Exception as err:  # a kernel this CPU or torch build lacks: keep fp32
            trials.append(Trial(name, 0.0, error=f"{type(err).__name__}: {err}"))
            continue
        encoders[name] = encoder
        trials.append(Trial(name, qps, agreement(rows, base_rows)))
    trials[0].queries_per_s = base_qps
    for trial in trials[1:]:
        if trial.error is None:
            trial.speedup = trial.queries_per_s / base_qps
    passing = [t for t in trials[1:] if t.error is None and t.speedup >= min_speedup and t.agreement >= min_agreement]
    if passing:
        best = max(passing, key=lambda t: t.queries_per_s)
        reason = f"{best.speedup:.2f}x fp32's queries/s with {best.agreement:.1%} of top-{k} rows equal to fp32's"
        return PrecisionChoice(best.precision, reason, probe, trials), encoders
    if not candidates:
        reason = "this CPU has no bf16 instructions and torch no int8 engine"
    else:
        reason = (
            f"no reduced precision was at least {min_speedup}x faster with {min_agreement:.0%} of top-{k} rows equal"
        )
    return PrecisionChoice("fp32", reason, probe, trials), encoders


def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "local_dense_retriever")
    return Path(root) / "encoder_precision.json"


def cache_key(model_path: str, index_path: str | None, settings: dict) -> str:
    """What the decision depends on: the model's files, the index file, the CPU, torch and the threads."""
    import torch

    def stamp(path: str | None) -> list:
        if not path or not os.path.exists(path):
            return [path]
        target = Path(path)
        files = sorted(target.glob("*")) if target.is_dir() else [target]
        return [str(target.resolve())] + [(f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in files]

    parts = {
        "model": stamp(model_path),
        "index": stamp(index_path),
        "cpu": [platform.processor(), sorted(f for f in cpu_flags() if "avx" in f or "amx" in f)],
        "torch": torch.__version__,
        **settings,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def load_cached(key: str) -> PrecisionChoice | None:
    try:
        entry = json.loads(cache_path().read_text()).get(key)
    except (OSError, ValueError):
        return None
    if not entry:
        return None
    trials = [Trial(**trial) for trial in entry.pop("trials", [])]
    return PrecisionChoice(**{**entry, "cached": True}, trials=trials)


def store_cached(key: str, choice: PrecisionChoice) -> None:
    path = cache_path()
    try:
        entries = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = {k: v for k, v in asdict(choice).items() if k != "cached"}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(entries, indent=1))
        os.replace(partial, path)
    except OSError as err:  # a read-only home: measure again next time
        logger.info("encoder precision not cached (%s)", err)
