"""Starting a process that a test stops with Ctrl-C (SIGINT), as a terminal would."""

import sys

# A suite started in the background without job control (nohup, `cmd &` in a script, some CI runners) inherits
# SIGINT ignored, and so does every process it starts: Python then never raises KeyboardInterrupt and bash cannot
# trap INT. The command runs with Ctrl-C's default action restored (exec keeps the process id the test signals).
_RESTORE_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"
)


def interruptible(command: list[str]) -> list[str]:
    """`command`, started so that a SIGINT sent to it acts as Ctrl-C whatever the test runner ignores."""
    return [sys.executable, "-c", _RESTORE_SIGINT, *command]
