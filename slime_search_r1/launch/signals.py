"""Signals as the launch scripts' shells had them: SIGINT, SIGTERM or SIGHUP stops the run with the shell's exit code
for it, and once cleanup starts a second Ctrl-C cannot cut it short."""

import signal

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """A signal asked this run to stop; `code` is the shell's exit code for it (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, code: int):
        self.code = code


def _stop(signum, _frame) -> None:
    raise Stopped(128 + signum)


def stop_on_signals() -> None:
    for signum in STOPPING:
        signal.signal(signum, _stop)


def ignore_signals() -> None:
    """For the cleanup: what it stops must be stopped."""
    for signum in STOPPING:
        signal.signal(signum, signal.SIG_IGN)
