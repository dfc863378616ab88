"""CPU threads for the encoder (torch) and FAISS: as many as this process may use, fewer while that is faster,
and none spinning.

Why: torch and faiss-cpu each bring their own libgomp, so a batch runs through two OpenMP pools one after the
other, and by default every pool thread spins (GOMP_SPINCOUNT 300000, ~3 ms) after each parallel region. An
encoder pass is hundreds of small regions, each ending in a barrier: when another process holds a core, the
thread sharing it makes every region wait, and the spinning burns the time slices it gets. Sizing from
os.cpu_count() also ignored taskset, cpusets and container CPU quotas.

What:
- `calm_openmp()` sets OMP_WAIT_POLICY=PASSIVE before torch or faiss loads (OpenMP reads it only then): idle pool
  threads sleep at once, so the pool that is not working leaves the cores to the one that is (one pool shared by
  both would need torch and faiss built against one libgomp; the wheels bundle their own). The CLIs call it first.
- `thread_count()`: the CPUs in this process's affinity mask, capped by its cgroup CPU quota; --num_threads
  overrides it.
- `ThreadTuner` then picks, per batch size, the thread count whose batches run fastest: all usable CPUs on a
  quiet machine, fewer while other processes hold some cores (with static OpenMP scheduling, a thread that
  shares its core with a busy process paces every region).

Measured on the 2-core machine, 100k passages, MiniLM, Flat, one core taken by a pinned busy process
(bench/retriever_load.py --busy_cores 1 and its --wrapper case; bench/RESULTS.md has the current tables):
- 256 clients, QPS idle -> busy: libgomp's default spinning 294 -> 98; PASSIVE with 2 threads 289 -> 174;
  PASSIVE with 1 thread 204 -> 200; PASSIVE with the tuner 281 -> 196 (the spinning server in the same run:
  307 -> 90). Spinning with short spin counts (GOMP_SPINCOUNT 3000-30000) was slower under
  contention than PASSIVE in every run (in-process, batch of 1: 35-84 ms against 24 ms).
- one batch of 64 in-process: 2 threads 212 ms idle / 364 ms busy, 1 thread 308 / 309 ms. Hence the tuner.
"""

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

FIXED_WAIT_POLICY = "PASSIVE"  # for a fixed thread count (--num_threads); tuned layouts keep libgomp's default
PROC_SELF = Path("/proc/self")
_policy_before_load: bool | None = None  # None: set_wait_policy() was never called in this process


@dataclass(frozen=True)
class CpuBudget:
    cpus: int  # whole CPUs this process can keep busy at once
    affinity: int  # CPUs in its affinity mask (taskset, cpuset cgroups)
    quota: float | None  # CPUs' worth of time its cgroup quota allows; None: no quota
    machine: int  # os.cpu_count(), for reference

    @property
    def source(self) -> str:
        if self.quota is not None and self.cpus < self.affinity:
            return "cgroup CPU quota"
        return "CPU affinity" if self.affinity < self.machine else "all CPUs"


def _own_cgroups(proc_self: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and cgroup v1 `cpu` controller path (from /proc/self/cgroup)."""
    v2 = v1 = None
    try:
        lines = (proc_self / "cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:  # "0::/user.slice/x.scope" (v2) or "4:cpu,cpuacct:/docker/abc" (v1)
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _cgroup_mounts(proc_self: Path) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """(root, mount point) of the cgroup2 mount and of the cgroup v1 mount that holds the `cpu` controller."""
    v2 = v1 = None
    try:
        lines = (proc_self / "mountinfo").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:  # "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu"
        fields, _, fs_fields = line.partition(" - ")
        fields, fs_fields = fields.split(), fs_fields.split()
        if len(fields) < 5 or len(fs_fields) < 3:
            continue
        root, mount_point, fs_type, options = fields[3], fields[4], fs_fields[0], fs_fields[2].split(",")
        if fs_type == "cgroup2" and v2 is None:
            v2 = (root, mount_point)
        elif fs_type == "cgroup" and "cpu" in options and v1 is None:
            v1 = (root, mount_point)
    return v2, v1


def _cgroup_dirs(mount: tuple[str, str], cgroup_path: str) -> list[Path]:
    """The cgroup's directory and its parents up to the mount point: a parent's quota caps its children too."""
    root, mount_point = mount
    relative = os.path.relpath(cgroup_path, root)
    if relative.startswith(".."):  # outside this mount's view (another cgroup namespace): only the mount's own
        relative = "."
    directory, top = Path(mount_point) / relative, Path(mount_point)
    dirs = [directory]
    while directory != top and top in directory.parents:
        directory = directory.parent
        dirs.append(directory)
    return dirs


def _quota_v2(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]  # "max 100000" or "150000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _quota_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())  # -1: no quota
        period = int((directory / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def cgroup_cpu_quota(proc_self: Path = PROC_SELF) -> float | None:
    """The tightest CPU quota (cgroup v2 cpu.max or v1 CFS) on this process's cgroup or its parents, in CPUs."""
    v2_path, v1_path = _own_cgroups(proc_self)
    v2_mount, v1_mount = _cgroup_mounts(proc_self)
    quotas = []
    if v2_path is not None and v2_mount is not None:
        quotas += [_quota_v2(directory) for directory in _cgroup_dirs(v2_mount, v2_path)]
    if v1_path is not None and v1_mount is not None:
        quotas += [_quota_v1(directory) for directory in _cgroup_dirs(v1_mount, v1_path)]
    quotas = [quota for quota in quotas if quota is not None and quota > 0]
    return min(quotas) if quotas else None


def usable_cpus(proc_self: Path = PROC_SELF) -> CpuBudget:
    """CPUs this process can keep busy: its affinity mask, capped by its cgroup quota rounded down (at least 1).

    Rounded down because a thread throttled until the next quota period would stall every OpenMP barrier.
    """
    machine = os.cpu_count() or 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else machine
    quota = cgroup_cpu_quota(proc_self)
    cpus = affinity if quota is None else max(1, min(affinity, math.floor(quota)))
    return CpuBudget(cpus=cpus, affinity=affinity, quota=quota, machine=machine)


def thread_count(num_threads: int | None = None) -> int:
    """Threads for torch's and FAISS's pools: `num_threads` (--num_threads) when given, else the usable CPUs."""
    return num_threads or usable_cpus().cpus


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


def thread_ladder(max_threads: int) -> list[int]:
    """Counts the tuner may use, largest first, each about 2/3 of the previous: 8 -> [8, 6, 4, 3, 2, 1]."""
    ladder = [max(1, max_threads)]
    while ladder[-1] > 1:
        ladder.append(ladder[-1] - max(1, ladder[-1] // 3))
    return ladder


@dataclass(frozen=True)
class Layout:
    """How the CPUs are spent: `batches` batches computed at once, each on `threads` OpenMP threads of its own."""

    threads: int
    batches: int

    def __str__(self) -> str:
        return f"{self.batches}x{self.threads}"


def layouts(cpus: int, parallel_batches: bool = True) -> list[Layout]:
    """Layouts the tuner may use, from one batch on every CPU down to one single-threaded batch per CPU:
    2 -> [1x2, 2x1]; 8 -> [1x8, 1x6, 2x4, 2x3, 4x2, 8x1]. Without `parallel_batches` (a searcher that must run
    one batch at a time) only the thread count steps down: 2 -> [1x2, 1x1]."""
    return [Layout(threads, cpus // threads if parallel_batches else 1) for threads in thread_ladder(cpus)]


@dataclass(frozen=True)
class Ticket:
    """Leave to run one batch now with `layout.threads` threads (ThreadTuner.begin); hand it back with end()."""

    layout: Layout
    rung: int
    started: float


@dataclass
class _Window:
    """Batches measured together under one layout."""

    rung: int
    open: bool = False  # its first batch has begun: batches of the previous layout have drained
    size: int = 16  # batches it measures
    busy: float = 0.0  # seconds during which at least one batch was running
    items: int = 0  # queries (or passages) of the batches that ended in it
    batches: int = 0

    @property
    def cost(self) -> float:
        """Busy seconds per query: 1 / throughput under full load, the latency of a lone query under light load."""
        return self.busy / self.items if self.items else math.inf


class ThreadTuner:
    """Chooses, by measurement, how the CPU threads are spent: one batch at a time on every usable CPU, or one
    single-threaded batch per CPU (or a step between), and keeps measuring while other processes come and go.

    Workers ask `begin()` before each batch: it answers with the layout's thread count, or None while running
    batches hold all the CPUs (so the threads at work never outnumber the usable CPUs, also while the layout
    changes); the worker calls `enter(ticket)` in its own thread (OpenMP thread counts are per calling thread), runs
    the batch, and calls `end(ticket, items)`. The tuner measures windows of `window` batches: the wall time during
    which at least one batch ran, per query. That one figure ranks layouts under any load: under full load it is
    1 / throughput; with one query at a time it is that query's latency. After the first window (the start-up
    check), then every `probe_every` windows (doubling up to `max_probe_every` while probes keep confirming the
    layout), after two windows whose cost moved by `change` the same way from the layout's confirmed cost, and
    after a window whose cost moved by a factor `jump` either way (a neighbour came or went, or the load changed)
    followed by a half window re-measuring the current layout, a half window runs a neighbouring layout; it is kept
    when it beats the current layout's last window by `margin`. A window whose cost after 2 batches is already
    `far_worse` times its reference (for a probe, the current layout's last window; else the confirmed cost) ends
    there: probing a shared layout beside a busy process costs 2 slow batches, not a window of them, and a
    neighbour's arrival is acted on after 4.
    Thread-safe.
    `adaptive=False` (--num_threads, GPUs, BM25) keeps the first layout: one batch at a time on `cpus` threads;
    `fixed` keeps that layout.
    """

    def __init__(
        self,
        cpus: int,
        adaptive: bool = True,
        parallel_batches: bool = True,
        set_threads: Callable[[int], None] | None = None,
        window: int = 16,
        probe_every: int = 16,
        max_probe_every: int = 64,
        margin: float = 0.05,
        change: float = 0.2,
        jump: float = 1.5,
        far_worse: float = 2.0,
        clock: Callable[[], float] = time.perf_counter,
        fixed: Layout | None = None,
    ):
        if fixed is not None:  # this layout, untuned
            cpus, adaptive, self.ladder = fixed.threads * fixed.batches, False, [fixed]
        else:
            self.ladder = layouts(max(1, cpus), parallel_batches) if adaptive else [Layout(max(1, cpus), 1)]
        self.cpus = max(1, cpus)
        self.adaptive = adaptive and len(self.ladder) > 1
        self.workers = max(layout.batches for layout in self.ladder)  # worker threads the batcher needs
        self._set_threads = set_pool_threads if set_threads is None else set_threads
        self.window, self.margin, self.change, self.jump, self.far_worse = window, margin, change, jump, far_worse
        self.probe_every, self.max_probe_every = probe_every, max_probe_every
        self._clock = clock
        self._lock = threading.Lock()
        self._local = threading.local()  # the thread count applied in each worker thread
        self.rung = 0  # the layout in use
        # The start-up check is short: a shared layout beside a busy process takes seconds per window.
        self._window = _Window(0, open=True, size=max(2, window // 4))
        self._threads_in_use = 0
        self._running = 0
        self._last_event = clock()
        self._current_cost: float | None = None  # the current layout's last window
        self._confirmed_cost: float | None = None  # its cost when a probe or a switch last confirmed it
        self._probe: int | None = None  # the rung a probe window runs
        self._probe_interval = 1  # windows from one probe to the next: the first right after start-up
        self._last_step = 1  # the direction of the last probe on the ladder (+1: fewer threads per batch)
        self._moved = 0  # the last window's move beyond `change` from the confirmed cost: -1, 0 or +1
        self._rebaseline = False  # the last window jumped: re-measure this layout before probing
        self._windows_since_probe = 0
        self.costs: dict[int, float] = {}  # rung -> its last window's seconds per query, for /health
        self.probes = 0
        self.switches = 0

    @property
    def layout(self) -> Layout:
        return self.ladder[self.rung]

    def begin(self) -> Ticket | None:
        """Leave to start a batch now, or None while the CPUs are taken (ask again after a batch ends)."""
        with self._lock:
            rung = self._window.rung
            layout = self.ladder[rung]
            if self._threads_in_use + layout.threads > self.cpus:
                return None
            now = self._advance()
            window = self._window
            window.open = True  # the first batch of a new layout: measure from here
            self._threads_in_use += layout.threads
            self._running += 1
            return Ticket(layout, rung, now)

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
            if not self.adaptive or ticket.rung != window.rung or not window.open:
                return  # a batch of the layout before: its time is not the new layout's
            window.items += items
            window.batches += 1
            # Far worse need not wait for a whole window (beside a busy process a shared batch was 3-5x slower
            # here): a probe's first batch, taken as if its layout's other batches ran beside it, or the current
            # layout's first batches (two per batch at once: batches in flight skew fewer) end the window there.
            if self._probe is not None:
                alone = (self._last_event - ticket.started) / (max(1, items) * ticket.layout.batches)
                far_worse = window.batches == 1 and alone > self.far_worse * self._current_cost
            else:
                far_worse = window.batches >= 2 * ticket.layout.batches and window.cost > self.far_worse * (
                    self._confirmed_cost or math.inf
                )
            if window.batches >= window.size or far_worse:
                self._close_window()

    def _advance(self) -> float:
        now = self._clock()
        if self._running and self._window.open:
            self._window.busy += now - self._last_event
        self._last_event = now
        return now

    def _close_window(self) -> None:
        window = self._window
        cost = window.cost
        self.costs[window.rung] = cost
        if self._probe is not None:
            self.probes += 1
            if cost < self._current_cost * (1 - self.margin):
                logger.info(
                    "CPU layout %s (batches x threads): %.2f ms per query, instead of %s: %.2f ms",
                    self.ladder[window.rung],
                    cost * 1000,
                    self.layout,
                    self._current_cost * 1000,
                )
                self.rung, self._current_cost, self._confirmed_cost = window.rung, cost, cost
                self.switches += 1
                self._probe_interval = self.probe_every
            else:
                self._confirmed_cost = self._current_cost
                self._probe_interval = min(self.max_probe_every, max(self.probe_every, 2 * self._probe_interval))
            self._probe = None
            self._windows_since_probe = 0
            self._moved = 0
        else:
            self._current_cost = cost
            if self._confirmed_cost is None:
                self._confirmed_cost = cost
            self._windows_since_probe += 1
            ratio = cost / self._confirmed_cost if self._confirmed_cost else 1.0
            if self._rebaseline:
                # The clean window after a jump: this layout's cost as things are now, what a probe must beat.
                self._rebaseline = False
                self._current_cost = self._confirmed_cost = cost
                self._probe = self._neighbour(slower=ratio > 1)
            elif not 1 / self.jump <= ratio <= self.jump:
                # A jump either way (a neighbour came or went, the load changed): this window mixes before and
                # after (a probe once beat such a window by 3x and then lost to the layout it replaced), so a
                # short window of this layout measures the new conditions first, then a probe runs.
                self._rebaseline = True
                self._moved = 0
            else:
                # A move beyond `change` must last two windows in a row (beside a busy process single windows vary
                # by 20-40% here).
                direction = 0 if abs(ratio - 1) <= self.change else (1 if ratio > 1 else -1)
                moved = direction != 0 and direction == self._moved
                self._moved = direction
                if moved or self._windows_since_probe >= self._probe_interval:
                    self._probe = self._neighbour(slower=ratio > 1)
        rung = self.rung if self._probe is None else self._probe
        # A new layout opens when its first batch begins. Probes and re-measures are half windows: they cost what
        # they measure.
        size = self.window if self._probe is None and not self._rebaseline else max(2, self.window // 2)
        self._window = _Window(rung, open=rung == window.rung, size=size)

    def _neighbour(self, slower: bool) -> int:
        """The rung a probe tries: after a slowdown (most likely a busy neighbour) the one with fewer threads per
        batch, else the other side of the last probe's, within the ladder."""
        step = 1 if slower else -self._last_step
        if not 0 <= self.rung + step < len(self.ladder):
            step = -step
        self._last_step = step
        return self.rung + step

    def report(self) -> dict:
        """Live state for /health."""
        with self._lock:
            return {
                "adaptive_threads": self.adaptive,
                "layouts": [str(layout) for layout in self.ladder],
                "layout": str(self.layout),
                "threads_per_batch": self.layout.threads,
                "batches_at_once": self.layout.batches,
                "probes": self.probes,
                "switches": self.switches,
                "ms_per_query_by_layout": {
                    str(self.ladder[rung]): round(cost * 1000, 3) for rung, cost in sorted(self.costs.items())
                },
            }
