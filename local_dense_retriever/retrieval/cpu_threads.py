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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

WAIT_POLICY = "PASSIVE"
PROC_SELF = Path("/proc/self")
_calmed_before_load: bool | None = None  # None: calm_openmp() was never called in this process


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


def calm_openmp() -> bool:
    """Make idle OpenMP threads sleep instead of spinning; True when torch and faiss load after this call.

    An OMP_WAIT_POLICY already in the environment is kept (ACTIVE may still win on a machine of one's own).
    """
    global _calmed_before_load
    loaded = [name for name in ("torch", "faiss") if name in sys.modules]
    policy = os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    if loaded:
        logger.warning("%s already loaded: OMP_WAIT_POLICY=%s does not apply to it", " and ".join(loaded), policy)
    _calmed_before_load = not loaded
    return _calmed_before_load


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
        "wait_policy_set_before_openmp_loaded": _calmed_before_load,
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


def batch_size_class(bits: int) -> str:
    return "1" if bits <= 1 else f"{1 << (bits - 1)}-{(1 << bits) - 1}"


@dataclass
class _SizeClass:
    """Tuning state of one batch-size class (1, 2-3, 4-7, ...): batches of different sizes scale differently."""

    label: str
    rung: int = 0  # index into the ladder: the count in use
    batches: int = 0
    seconds: dict[int, float] = field(default_factory=dict)  # rung -> smoothed seconds per batch
    baseline: float | None = None  # the current count's smoothed time when a probe last confirmed it
    probes: int = 0
    last_probe_up: bool = True


class ThreadTuner:
    """Runs each batch with the thread count measured fastest for batches of its size, and keeps measuring.

    A probe runs one batch one rung away from the current count (alternately fewer and more threads): every
    `probe_every`-th batch of a size class, and at once when the current count's smoothed batch time has grown by
    `slowdown` since a probe last confirmed it (another process took a core). When the probed rung's smoothed
    time beats the current one by `margin`, it becomes the current one. So the count follows other processes as
    they come and go, at the price of about one batch in `probe_every` run with a worse count (1-2% of throughput
    on an idle machine). Not thread-safe: the server's single batch worker is its only caller. `adaptive=False`
    (--num_threads given, or nothing runs on the CPU) keeps `max_threads`.
    """

    def __init__(
        self,
        max_threads: int,
        adaptive: bool = True,
        set_threads: Callable[[int], None] = set_pool_threads,
        probe_every: int = 32,
        smoothing: float = 0.5,
        margin: float = 0.05,
        slowdown: float = 0.2,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.ladder = thread_ladder(max_threads) if adaptive else [max_threads]
        self.adaptive = adaptive and len(self.ladder) > 1
        self._set_threads = set_threads
        self.probe_every, self.smoothing, self.margin, self.slowdown = probe_every, smoothing, margin, slowdown
        self._clock = clock
        self._classes: dict[int, _SizeClass] = {}
        self._applied: int | None = None

    def wrap(self, search: Callable) -> Callable:
        """`search(queries, k)` run with the tuned thread count for `len(queries)`."""
        if not self.adaptive:
            return search

        def tuned_search(queries: list[str], k: int):
            bits = len(queries).bit_length()
            size_class = self._classes.get(bits)
            if size_class is None:
                size_class = self._classes[bits] = _SizeClass(batch_size_class(bits))
            rung = self._next_rung(size_class)
            self._apply(self.ladder[rung])
            started = self._clock()
            result = search(queries, k)
            self._record(size_class, rung, self._clock() - started)
            return result

        return tuned_search

    def _apply(self, threads: int) -> None:
        if threads != self._applied:
            self._set_threads(threads)
            self._applied = threads

    def _next_rung(self, size_class: _SizeClass) -> int:
        size_class.batches += 1
        current = size_class.seconds.get(size_class.rung)
        slowed = size_class.baseline is not None and current > size_class.baseline * (1 + self.slowdown)
        if size_class.batches % self.probe_every and not slowed:
            return size_class.rung
        if slowed:  # most likely another process took a core: try one thread fewer first
            size_class.last_probe_up = False
        else:
            size_class.last_probe_up = not size_class.last_probe_up
        step = -1 if size_class.last_probe_up else 1  # rung - 1 = more threads
        if not 0 <= size_class.rung + step < len(self.ladder):
            step = -step
        return size_class.rung + step

    def _record(self, size_class: _SizeClass, rung: int, seconds: float) -> None:
        before = size_class.seconds.get(rung)
        if rung == size_class.rung and before is not None:
            smoothed = before + self.smoothing * (seconds - before)
        else:
            # A probe's count last ran batches many batches ago, maybe beside a process that has gone since:
            # blending with that time kept a server at 1 thread on an idle machine for two probes (~20 s) here.
            smoothed = seconds
        size_class.seconds[rung] = smoothed
        current = size_class.seconds.get(size_class.rung)
        if rung == size_class.rung:
            # Not the running minimum: batch times vary by 10-15% here, and the minimum of a noisy series sits so
            # low that ordinary batches would keep triggering probes.
            if size_class.baseline is None:
                size_class.baseline = smoothed
            return
        size_class.probes += 1
        if current is None or smoothed >= current * (1 - self.margin):
            size_class.baseline = current  # the current count stays: its time now is the one to compare with
        else:
            logger.info(
                "batches of %s queries: %d threads (%.1f ms) instead of %d (%.1f ms)",
                size_class.label,
                self.ladder[rung],
                smoothed * 1000,
                self.ladder[size_class.rung],
                current * 1000,
            )
            size_class.rung, size_class.baseline = rung, smoothed

    def report(self) -> dict:
        """Live state for /health: the count in use and the smoothed batch times per batch-size class."""
        classes = {}
        for _, size_class in sorted(list(self._classes.items())):  # a snapshot: the batch worker may be adding
            classes[size_class.label] = {
                "threads": self.ladder[size_class.rung],
                "batches": size_class.batches,
                "probes": size_class.probes,
                "ms_per_batch_by_threads": {
                    str(self.ladder[rung]): round(seconds * 1000, 1)
                    for rung, seconds in sorted(list(size_class.seconds.items()))
                },
            }
        return {"adaptive_threads": self.adaptive, "thread_ladder": self.ladder, "by_batch_size": classes}
