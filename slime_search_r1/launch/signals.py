"""Signals as the launch scripts' shells had them: SIGINT, SIGTERM or SIGHUP stops the run with the shell's exit code
for it, and once cleanup starts a second Ctrl-C cannot cut it short.

A signal becomes an exception (Stopped) wherever the run is, so every `finally` on the way out stops what it started.
While a child is being started the signal waits (`holding`): raised between the fork and the caller's hold on the
new process, it would leave that process running. `run_child` is subprocess.run with that hold, and with the child
(its whole session, if it has one) killed on any exception, a stop or a timeout, before the exception goes on;
`children` does the same for several children running at once.
"""

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_held = 0  # how many `holding` blocks are open
_pending: int | None = None  # a signal that came during one


class Stopped(Exception):
    """A signal asked this run to stop; `code` is the shell's exit code for it (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, code: int):
        self.code = code


def _stop(signum, _frame) -> None:
    global _pending
    if _held:
        _pending = signum
        return
    raise Stopped(128 + signum)


def stop_on_signals() -> None:
    for signum in STOPPING:
        signal.signal(signum, _stop)


def ignore_signals() -> None:
    """For the cleanup: what it stops must be stopped."""
    for signum in STOPPING:
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """A stopping signal that comes during the block is raised (Stopped) when it ends: start a child and keep hold of
    it (assign it where the cleanup looks) inside one."""
    global _held, _pending
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _pending is not None:
            signum, _pending = _pending, None
            raise Stopped(128 + signum)


def run_child(command: list[str], *, timeout: float | None = None, new_session: bool = False, **popen):
    """subprocess.run(command, timeout=timeout, **popen) that leaves nothing running when it raises: a stop, the
    timeout (subprocess.TimeoutExpired) or any other error kills the child first (with `new_session`, every process
    of the session it was started in)."""
    process = None
    try:
        with holding():
            process = subprocess.Popen(command, start_new_session=new_session, **popen)
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                if new_session:  # the group its session began with, whose id is the child's PID
                    os.killpg(process.pid, signal.SIGKILL)
                elif process.poll() is None:
                    process.kill()
            process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


@contextlib.contextmanager
def children() -> Iterator[Callable[..., subprocess.Popen]]:
    """`with children() as start:` start(command, **popen) is subprocess.Popen, held as run_child holds its child;
    if the block ends with an exception (a stop included), every child it started that still runs is killed."""
    started: list[subprocess.Popen] = []

    def start(command: list[str], **popen) -> subprocess.Popen:
        with holding():
            started.append(subprocess.Popen(command, **popen))
        return started[-1]

    try:
        yield start
    except BaseException:
        for process in started:
            if process.poll() is None:
                process.kill()
        for process in started:
            process.wait()
        raise
