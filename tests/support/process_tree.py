"""What a test started, by PID: the process tree under one process, recorded before it is told to stop, and which of
those processes are still alive once it has stopped. A PID is compared with its start time, so a number the kernel
gave to a new process meanwhile is not taken for a survivor."""

import contextlib
import os
import select
import signal
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Started:
    pid: int
    created: float
    command: str


def tree(*roots: int) -> list[Started]:
    """Each of `roots` and every process under it, as they are now."""
    found: dict[int, Started] = {}
    for root in roots:
        top = psutil.Process(root)
        for process in [top, *top.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                found[process.pid] = Started(process.pid, process.create_time(), " ".join(process.cmdline()))
    return list(found.values())


def _same(started: Started) -> psutil.Process | None:
    try:
        process = psutil.Process(started.pid)
        if process.create_time() != started.created or process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process
    except psutil.NoSuchProcess:
        return None


def _exits(pid: int, timeout: float) -> None:
    """Returns once `pid` exits (its pidfd becomes readable), or after `timeout`: a bound against a hang only."""
    with contextlib.suppress(ProcessLookupError):
        fd = os.pidfd_open(pid)
        try:
            select.select([fd], [], [], timeout)
        finally:
            os.close(fd)


def survivors(recorded: list[Started], timeout: float = 30.0) -> list[Started]:
    """The recorded processes still running after each was given `timeout` seconds to finish exiting (a server sent
    SIGTERM by its parent's cleanup may still be on its way out when the parent's own exit is seen)."""
    for started in recorded:
        if _same(started) is not None:
            _exits(started.pid, timeout)
    return [started for started in recorded if _same(started) is not None]


def kill(recorded: list[Started]) -> None:
    """SIGKILL what is left of `recorded` (a test's cleanup after a failure), by PID and start time."""
    for started in recorded:
        process = _same(started)
        if process is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
