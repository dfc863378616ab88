"""How many CPUs this process can keep busy: its affinity mask (taskset, cpusets) capped by its cgroup CPU quota
(v2 cpu.max or v1 CFS, on its cgroup or any parent), rounded down. Sizing from os.cpu_count() ignored all three."""

import math
import os
from dataclasses import dataclass
from pathlib import Path

PROC_SELF = Path("/proc/self")


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


class OtherProcessesCpu:
    """CPU time other processes take from this process's CPUs: the busy time of its affinity CPUs in /proc/stat
    (everything but idle and iowait, steal included) less this process's own CPU time. Call it for the running
    total in seconds; None where /proc/stat cannot be read (the tuner then goes by its measurements alone)."""

    def __init__(self, cpus: set[int] | None = None, proc_stat: Path = Path("/proc/stat")):
        if cpus is None:
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        self.cpus = {f"cpu{cpu}" for cpu in cpus}
        self.proc_stat = proc_stat
        self.tick = 1 / os.sysconf("SC_CLK_TCK")

    def __call__(self) -> float | None:
        try:
            lines = self.proc_stat.read_text().splitlines()
        except OSError:
            return None
        busy = 0
        for line in lines:  # "cpu0 user nice system idle iowait irq softirq steal guest guest_nice"
            name, *ticks = line.split()
            if name in self.cpus:
                ticks = [int(tick) for tick in ticks[:8]]
                busy += sum(ticks) - ticks[3] - ticks[4]
        own = os.times()
        return busy * self.tick - (own.user + own.system)
