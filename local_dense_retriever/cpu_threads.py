"""CPU threads for the encoder (torch) and FAISS: as many as this process may really use, and none spinning.

Why: torch and faiss-cpu each bring their own libgomp, so a batch runs through two OpenMP pools one after the
other, and by default every pool thread spins (GOMP_SPINCOUNT 300000) after each parallel region. An encoder
forward pass is hundreds of small regions, each ending in a barrier; when another process holds one of the
cores, the thread that shares it must wait for its time slice at every barrier, and spinning burns the slices
it gets. Sizing from os.cpu_count() also ignored taskset, cpusets and container CPU quotas.

What: `calm_openmp()` sets OMP_WAIT_POLICY=PASSIVE (idle pool threads sleep at once) before torch or faiss is
loaded, since OpenMP reads it only then; the CLIs call it first thing. `thread_count()` sizes both pools to the
CPUs in this process's affinity mask, capped by its cgroup's CPU quota; --num_threads overrides it.

Measured on the 2-core machine, 100k passages, MiniLM, Flat, 256 single-query clients, one core taken by a
busy process (same run, before this module): defaults 38.5 QPS, PASSIVE 290 QPS, --num_threads 1 354 QPS,
against 529 QPS idle. bench/retriever_load.py --busy-cores 1 measures it again (bench/RESULTS.md).
"""

import logging
import math
import os
import sys
from dataclasses import dataclass
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
