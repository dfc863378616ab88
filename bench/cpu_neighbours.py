"""Other processes on the benchmark machine's CPUs: how many cores they use (ForeignCpu), waiting until they leave
the CPUs alone before a measurement (wait_until_quiet), and busy processes the benchmark starts itself beside the
server (BusyCores). The retriever benchmarks run on a shared machine whose other users come and go."""

import os
import subprocess
import sys
import time

import psutil

BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


class ForeignCpu:
    """Average cores used by processes other than this benchmark, its server and its busy processes."""

    def __init__(self, server_pid: int | None = None, busy_pids: tuple[int, ...] = ()):
        pids = ([server_pid] if server_pid else []) + list(busy_pids)
        self._ours = [psutil.Process()] + [psutil.Process(pid) for pid in pids]

    def _busy(self) -> tuple[float, float, float]:
        times = psutil.cpu_times()
        busy = sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))
        ours = sum(sum(p.cpu_times()[:2]) for p in self._ours)  # user + system
        return busy, ours, time.perf_counter()

    def __enter__(self) -> "ForeignCpu":
        self._start = self._busy()
        return self

    def __exit__(self, *exc) -> None:
        busy, ours, now = self._busy()
        self.cores = max(0.0, ((busy - self._start[0]) - (ours - self._start[1])) / (now - self._start[2]))


def wait_until_quiet(
    max_wait: float, server_pid: int | None = None, threshold: float = 0.1, busy_pids: tuple[int, ...] = ()
) -> None:
    """Wait (bounded) until other processes leave the CPU alone for 3 seconds in a row."""
    deadline = time.perf_counter() + max_wait
    quiet_seconds = 0
    while time.perf_counter() < deadline:
        with ForeignCpu(server_pid, busy_pids) as foreign:
            time.sleep(1.0)
        quiet_seconds = quiet_seconds + 1 if foreign.cores < threshold else 0
        if quiet_seconds >= 3:
            return
    if max_wait > 0:
        print(f"  (other processes still busy after {max_wait:.0f} s; measuring anyway)", flush=True)


class BusyCores:
    """`k` processes spinning `while True: pass`, each pinned to one of the last k CPUs this process may use.

    They stop by themselves after `seconds` and are terminated by PID on exit, whatever happens meanwhile.
    """

    def __init__(self, k: int, seconds: float):
        cpus = sorted(os.sched_getaffinity(0))
        if not 0 <= k < len(cpus):
            raise ValueError(f"--busy_cores {k}: choose 0 to {len(cpus) - 1}; this process may use {len(cpus)} CPUs")
        self.cpus = cpus[len(cpus) - k :] if k else []
        self.free_cpus = cpus[: len(cpus) - k]
        self.seconds = seconds
        self.processes: list[subprocess.Popen] = []

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(process.pid for process in self.processes)

    def __enter__(self) -> "BusyCores":
        try:
            for cpu in self.cpus:
                process = subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(seconds=self.seconds)])
                self.processes.append(process)
                os.sched_setaffinity(process.pid, {cpu})
        except BaseException:
            self.stop()
            raise
        time.sleep(0.5 if self.processes else 0.0)  # let the interpreters start and reach their loops
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []
