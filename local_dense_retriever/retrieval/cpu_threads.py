"""CPU threads for the encoder (torch) and FAISS: how idle OpenMP threads wait, how large the pools are, and how the
usable CPUs are spent, one batch on all of them or one single-threaded batch on each, by measurement.

Why: torch and faiss-cpu each bring their own libgomp, so a batch runs through two OpenMP pools, and an encoder
pass is hundreds of small parallel regions, each ending in a barrier. When another process holds a core, the pool
thread that shares it makes every region wait: one batch on both cores of the 2-core machine ran 11x slower per
query beside a pinned busy process, while two single-threaded batches side by side (no team, no barrier) ran 1.6x
slower. On a quiet machine the shared batch is the faster one (9% at full load, 2x for a lone query). Hence the
ThreadTuner below; the CPUs it may use come from cpu_budget.py (affinity and cgroup quota).

Measured on the 2-core machine, 100k passages, MiniLM, Flat, one core taken by a pinned busy process
(bench/retriever_load.py --busy_cores 1; bench/RESULTS.md has the current tables): 256 clients, QPS idle -> busy:
libgomp's default spinning with a fixed 2 threads 294 -> 98; PASSIVE with 2 threads 289 -> 174; PASSIVE with 1
thread 204 -> 200; the tuner 281 -> 196.
"""

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from local_dense_retriever.retrieval.cpu_budget import OtherProcessesCpu, thread_count, usable_cpus

__all__ = ["Layout", "ThreadTuner", "Ticket", "configure_pools", "layouts", "report", "set_pool_threads",
           "set_wait_policy", "thread_count", "usable_cpus"]  # fmt: skip

logger = logging.getLogger(__name__)

FIXED_WAIT_POLICY = "PASSIVE"  # for a fixed thread count (--num_threads); tuned layouts keep libgomp's default
_policy_before_load: bool | None = None  # None: set_wait_policy() was never called in this process


def set_wait_policy(tuned: bool) -> bool:
    """Choose how idle OpenMP threads wait, before torch and faiss load (OpenMP reads it only then); True when
    they load after this call.

    Tuned (the ThreadTuner picks the layout): libgomp's default, spin ~300k rounds then sleep. A batch on every CPU
    then runs as fast as with ACTIVE (10k, batch of 64: 107 ms against 159 ms with PASSIVE, whose sleeping threads
    are woken for every parallel region), and beside a busy process the tuner leaves that layout for
    single-threaded batches, which have no team to wait for. Fixed (--num_threads): PASSIVE, as nothing else keeps
    a team's threads from spinning against a busy process. An OMP_WAIT_POLICY already in the environment is kept.
    """
    global _policy_before_load
    loaded = [name for name in ("torch", "faiss") if name in sys.modules]
    if not tuned:
        os.environ.setdefault("OMP_WAIT_POLICY", FIXED_WAIT_POLICY)
    if loaded:
        logger.warning("%s already loaded: the OpenMP wait policy set now does not apply", " and ".join(loaded))
    _policy_before_load = not loaded
    return _policy_before_load


def report() -> dict:
    """What this process runs with, for /health and the logs."""
    budget = usable_cpus()
    settings = {
        "usable_cpus": budget.cpus,
        "usable_cpus_from": budget.source,
        "affinity_cpus": budget.affinity,
        "cgroup_cpu_quota": budget.quota,
        "machine_cpus": budget.machine,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default (spin, then sleep)"),
        "wait_policy_set_before_openmp_loaded": _policy_before_load,
    }
    if "torch" in sys.modules:
        settings["torch_threads"] = sys.modules["torch"].get_num_threads()
    if "faiss" in sys.modules:
        settings["faiss_threads"] = sys.modules["faiss"].omp_get_max_threads()
    return settings


def set_pool_threads(threads: int) -> None:
    """Resize torch's and FAISS's OpenMP pools (whichever is loaded); cheap, the pools keep their threads."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    if "faiss" in sys.modules:
        sys.modules["faiss"].omp_set_num_threads(threads)


def configure_pools(threads: int) -> None:
    """The one place the retriever sizes its pools: `threads` for torch's and FAISS's OpenMP pools, and no torch
    inter-op threads (one batch at a time is the whole workload). On GPU too: tokenizing, copies and pooling stay
    on the CPU."""
    set_pool_threads(threads)
    if "torch" in sys.modules:
        try:
            sys.modules["torch"].set_num_interop_threads(1)
        except RuntimeError:  # already set once in this process
            pass


@dataclass(frozen=True)
class Layout:
    """How the CPUs are spent: `batches` batches computed at once, each on `threads` OpenMP threads of its own."""

    threads: int
    batches: int

    def __str__(self) -> str:
        return f"{self.batches}x{self.threads}"


def layouts(cpus: int, parallel_batches: bool = True) -> list[Layout]:
    """The two layouts the tuner chooses from: one batch on every CPU (shared), or one single-threaded batch per CPU
    (split): 2 -> [1x2, 2x1]; 8 -> [1x8, 8x1]. A searcher that must run one batch at a time (GPU indexes) splits
    nothing: [1x2, 1x1]. One CPU: [1x1]."""
    cpus = max(1, cpus)
    if cpus == 1:
        return [Layout(1, 1)]
    return [Layout(cpus, 1), Layout(1, cpus if parallel_batches else 1)]


@dataclass(frozen=True)
class Ticket:
    """Leave to run one batch now with `layout.threads` threads (ThreadTuner.begin); hand it back with end()."""

    layout: Layout
    choice: int  # which of the tuner's layouts
    started: float


@dataclass
class _Window:
    """Batches of one layout measured together: `kind` says why ("measure" the layout in use, "remeasure" it after a
    jump, "probe" the other one)."""

    choice: int
    kind: str
    size: int  # batches it measures
    open: bool = False  # its first batch has begun: batches of the layout before have drained
    busy: float = 0.0  # seconds during which at least one of its batches was running
    items: int = 0  # queries (or passages) of its batches
    batches: int = 0

    @property
    def cost(self) -> float:
        """Busy seconds per query: 1 / throughput under full load, the latency of a lone query under light load."""
        return self.busy / self.items if self.items else math.inf


class ThreadTuner:
    """Chooses, by measurement, between one batch on every usable CPU (shared) and one single-threaded batch per
    CPU (split), and keeps measuring while other processes come and go. The policy, in full:

    1. The cost of a layout is measured over a window of `window` batches: the wall time during which at least one
       of its batches ran, per query. Under full load that is 1 / throughput; with one query at a time, its latency.
    2. The first window is short (a quarter), and a probe of the other layout follows it at once: a server started
       beside a busy process finds the split layout within a dozen batches.
    3. A probe runs the other layout for half a window; it is kept when it costs `margin` less than the layout in
       use cost in its last window. Probes run again every `probe_every` windows.
    4. A window whose cost moved by a factor `jump` either way from the layout's settled cost (what the last probe
       or re-measure found: a neighbour came or went, or the load changed) mixes before and after: half a window
       re-measures the layout in use, then a probe runs.
    5. A batch that shows its window far worse (`far_worse` times the layout's last cost: a probe's first batch, or
       the layout in use after two batches at once) ends the window there: probing a shared batch beside a busy
       process costs one slow batch, and a neighbour's arrival is acted on within four.
    6. A window during which other processes kept more than `busy_cpus` of the usable CPUs busy (`other_cpu`: their
       CPU seconds on this process's CPUs, beyond those a cgroup quota leaves spare) moves to the split layout
       without a probe, and the shared one is not probed while that lasts; the first window after it probes the
       shared one. Throughput alone does not decide there: beside a busy core a shared batch waits at every
       barrier for the thread that shares the core, which stretches the tail more than the mean (256 clients on
       100k passages, bench/RESULTS.md: p99/p50 1.74-1.95 in the windows that ended shared, 1.12-1.57 split), and
       each probe of it is a slow batch that every queued query waits behind.

    Workers ask `begin()` before each batch: it answers with a ticket, or None while running batches hold all the
    CPUs (the threads at work never outnumber the usable CPUs, also while the layout changes); the worker calls
    `enter(ticket)` in its own thread (OpenMP thread counts are per calling thread), runs the batch, and calls
    `end(ticket, items)`. Thread-safe. `adaptive=False` (--num_threads, GPUs, BM25) keeps one batch at a time on
    `cpus` threads; `fixed` keeps that layout.
    """

    def __init__(
        self,
        cpus: int,
        adaptive: bool = True,
        parallel_batches: bool = True,
        set_threads: Callable[[int], None] | None = None,
        window: int = 16,
        probe_every: int = 16,
        margin: float = 0.05,
        jump: float = 1.5,
        far_worse: float = 2.0,
        busy_cpus: float = 0.5,
        clock: Callable[[], float] = time.perf_counter,
        other_cpu: Callable[[], float | None] | None = None,
        fixed: Layout | None = None,
    ):
        if fixed is not None:
            self.layouts, adaptive = [fixed], False
        else:
            self.layouts = layouts(cpus, parallel_batches) if adaptive else [Layout(max(1, cpus), 1)]
        self.cpus = max(layout.threads * layout.batches for layout in self.layouts)
        self.adaptive = adaptive and len(self.layouts) > 1
        self.workers = max(layout.batches for layout in self.layouts)  # worker threads the batcher needs
        self._set_threads = set_pool_threads if set_threads is None else set_threads
        self.window, self.probe_every, self.margin, self.jump, self.far_worse = (
            window, probe_every, margin, jump, far_worse
        )  # fmt: skip
        self._clock = clock
        if other_cpu is None and self.adaptive:
            budget = usable_cpus()
            other_cpu, busy_cpus = OtherProcessesCpu(), busy_cpus + max(0, budget.affinity - self.cpus)
        self._other_cpu, self.busy_cpus = other_cpu, busy_cpus
        self._other_since = (clock(), other_cpu()) if other_cpu is not None and self.adaptive else None
        self.other_cpus: float | None = None  # CPUs other processes kept busy over the last window, for /health
        self._lock = threading.Lock()
        self._local = threading.local()  # the thread count applied in each worker thread
        self.choice = 0  # the layout in use: shared first
        self._cost: float | None = None  # its last window's cost: what a probe must beat
        self._settled: float | None = None  # its cost as the last probe or re-measure found it
        self._window = _Window(0, "measure", max(2, window // 4), open=True)
        self._windows_since_probe = 0
        self._others_were_busy = False
        self._threads_in_use = 0
        self._running = 0
        self._last_event = clock()
        self.costs: dict[int, float] = {}  # layout -> its last window's seconds per query, for /health
        self.probes = 0
        self.switches = 0

    @property
    def layout(self) -> Layout:
        return self.layouts[self.choice]

    def begin(self) -> Ticket | None:
        """Leave to start a batch now, or None while the CPUs are taken (ask again after a batch ends)."""
        with self._lock:
            choice = self._window.choice
            layout = self.layouts[choice]
            if self._threads_in_use + layout.threads > self.cpus:
                return None
            now = self._advance()
            self._window.open = True  # the first batch of a new layout: measure from here
            self._threads_in_use += layout.threads
            self._running += 1
            return Ticket(layout, choice, now)

    def enter(self, ticket: Ticket) -> None:
        """Size this thread's torch and FAISS pools for the ticket (a no-op when they already are)."""
        if getattr(self._local, "threads", None) != ticket.layout.threads:
            self._set_threads(ticket.layout.threads)
            self._local.threads = ticket.layout.threads

    def end(self, ticket: Ticket, items: int) -> None:
        """The batch of `ticket` is done; `items`: the queries (or passages) it held."""
        with self._lock:
            self._advance()
            self._running -= 1
            self._threads_in_use -= ticket.layout.threads
            window = self._window
            if not self.adaptive or ticket.choice != window.choice or not window.open:
                return  # a batch of the layout before: its time is not this window's
            window.items += items
            window.batches += 1
            if window.batches >= window.size or self._far_worse(window, ticket, items):
                self._close_window()

    def _far_worse(self, window: _Window, ticket: Ticket, items: int) -> bool:
        """Rule 5. A probe's first batch is taken as if its layout's other batches ran beside it; the layout in use
        is judged after two batches per batch at once (batches in flight skew fewer)."""
        if self._cost is None:
            return False
        if window.kind == "probe":
            alone = (self._last_event - ticket.started) / (max(1, items) * ticket.layout.batches)
            return window.batches == 1 and alone > self.far_worse * self._cost
        return window.batches >= 2 * ticket.layout.batches and window.cost > self.far_worse * self._cost

    def _advance(self) -> float:
        now = self._clock()
        if self._running and self._window.open:
            self._window.busy += now - self._last_event
        self._last_event = now
        return now

    def _others_busy(self) -> bool:
        """Rule 6: whether other processes kept more than `busy_cpus` of this process's CPUs busy since the last
        window closed."""
        if self._other_since is None:
            return False
        (since, other_before), now, other_now = self._other_since, self._clock(), self._other_cpu()
        if other_now is None or other_before is None or now <= since:
            return False
        self._other_since = (now, other_now)
        self.other_cpus = (other_now - other_before) / (now - since)
        return self.other_cpus > self.busy_cpus

    def _close_window(self) -> None:
        window, cost, before = self._window, self._window.cost, self._cost
        self.costs[window.choice] = cost
        others_busy, others_were_busy = self._others_busy(), self._others_were_busy
        self._others_were_busy = others_busy
        if others_busy or others_were_busy:
            self._beside_other_processes(window, cost, others_busy)
            return
        if window.kind == "probe":  # rule 3
            self.probes += 1
            self._windows_since_probe = 0
            if cost < before * (1 - self.margin):
                logger.info(
                    "CPU layout %s (batches x threads): %.2f ms per query, instead of %s: %.2f ms",
                    self.layouts[window.choice], cost * 1000, self.layout, before * 1000,
                )  # fmt: skip
                self.choice, self._cost = window.choice, cost
                self.switches += 1
            self._settled = self._cost
            self._next("measure")
            return
        self._cost = cost
        self._windows_since_probe += 1
        if window.kind == "remeasure" or before is None:  # rules 2 and 4: conditions known, try the other layout
            self._settled = cost
            self._next("probe")
        elif not 1 / self.jump <= (cost / self._settled if self._settled else 1.0) <= self.jump:  # rule 4
            self._next("remeasure")
        else:
            self._next("probe" if self._windows_since_probe >= self.probe_every else "measure")

    def _beside_other_processes(self, window: _Window, cost: float, others_busy: bool) -> None:
        """Rule 6: split while other processes hold a CPU; once they leave, probe the shared layout."""
        if window.kind == "probe":
            self.probes += 1
            self._windows_since_probe = 0
        if window.choice == self.choice:
            self._cost = cost
        split = len(self.layouts) - 1
        if others_busy and self.choice != split:
            logger.info(
                "CPU layout %s (batches x threads) instead of %s: other processes keep %.1f CPUs busy",
                self.layouts[split], self.layout, self.other_cpus,
            )  # fmt: skip
            self.choice, self._cost = split, self.costs.get(split)
            self.switches += 1
        self._settled = self._cost
        self._next("measure" if others_busy or self._cost is None else "probe")

    def _next(self, kind: str) -> None:
        choice = 1 - self.choice if kind == "probe" else self.choice
        size = self.window if kind == "measure" else max(2, self.window // 2)
        # The same layout goes on at once; another one opens when its first batch begins.
        self._window = _Window(choice, kind, size, open=choice == self._window.choice)

    def report(self) -> dict:
        """Live state for /health."""
        with self._lock:
            return {
                "adaptive_threads": self.adaptive,
                "layouts": [str(layout) for layout in self.layouts],
                "layout": str(self.layout),
                "threads_per_batch": self.layout.threads,
                "batches_at_once": self.layout.batches,
                "probes": self.probes,
                "switches": self.switches,
                "other_processes_cpus": None if self.other_cpus is None else round(self.other_cpus, 2),
                "ms_per_query_by_layout": {
                    str(self.layouts[choice]): round(cost * 1000, 3) for choice, cost in sorted(self.costs.items())
                },
            }
