"""The tmux wrapper's session and the processes in it: its windows (the retriever's log, training), the training
window's own program (TRAIN_CMD, its output also in a log, its exit code recorded), waiting for the first of them to
exit, and stopping training. Also how the wrapper reports: one line per message on stderr, Failed for an error.
"""

import errno
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from slime_search_r1.launch.signals import holding

PROG = "run_qwen2.5_3B_with_retrieval.sh"
SESSION = "slime-search-r1"
STOP_TIMEOUT_S = 60  # for training to stop after Ctrl-C in its window, before SIGTERM


class Failed(Exception):
    """Stop with exit code 1 and this message."""


def info(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def log_tail(path: Path, lines: int = 30) -> None:
    text = path.read_text(errors="replace") if path.exists() else ""
    print(f"---- last lines of {path} ----", *text.splitlines()[-lines:], "----", sep="\n", file=sys.stderr)


class Tmux:
    """The session this run creates (refused when one of its name exists), on the tmux server of the environment."""

    def __init__(self):
        self.session = SESSION
        self.created = False

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", *args], capture_output=True, text=True)

    def window(self, name: str, command: str) -> int:
        """A window running `command` (a shell line) in the session, created with it if needed; its pane's PID."""
        where = ["new-window", "-t", f"{self.session}:"] if self.created else ["new-session", "-s", self.session]
        with holding():  # a stop waits until the session is known to exist (then the cleanup closes it)
            made = self.run(*where, "-d", "-P", "-F", "#{pane_pid}", "-n", name, "-c", os.getcwd(), command)
            self.created = self.created or made.returncode == 0
        if made.returncode != 0:
            raise Failed(f"tmux could not open window '{name}': {made.stderr.strip()}")
        return int(made.stdout.strip())

    def attach_hint(self) -> str:
        return shlex.join(["tmux", "attach", "-t", self.session])


def first_to_exit(pids: list[int], timeout: float | None = None) -> int | None:
    """The first of `pids` to exit, waiting on their pidfds (an event, not a polling loop); None after `timeout`."""
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            try:
                fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                return pid
            except OSError as exc:  # a kernel before 5.3 has no pidfds: look twice a second instead
                if exc.errno != errno.ENOSYS:
                    raise
                return _first_to_exit_polling(pids, timeout)
        ready = select.select(list(fds), [], [], timeout)[0]
        return fds[ready[0]] if ready else None
    finally:
        for fd in fds:
            os.close(fd)


def _first_to_exit_polling(pids: list[int], timeout: float | None) -> int | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        for pid in pids:
            try:  # gone, or a zombie (our own child, the server, until it is reaped)
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    return pid
            except FileNotFoundError:
                return pid
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def training_window(run_dir: Path) -> int:
    """Runs in the training window: the wrapper's environment and folder, TRAIN_CMD with its output also in the log;
    then its exit code in run_dir/training.exit, which the wrapper reads."""
    spec = json.loads((run_dir / "training.json").read_text())
    os.environ.clear()
    os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    for signum in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C in this window is for TRAIN_CMD; this stays to record
        signal.signal(signum, lambda *_: None)
    with open(spec["log"], "ab") as log:
        for out in (log, sys.stdout.buffer):
            out.write(f"{time.strftime('%F %T')} starting: {spec['command']}\n".encode())
            out.flush()
        child = subprocess.Popen(["bash", "-c", spec["command"]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for chunk in iter(lambda: os.read(child.stdout.fileno(), 65536), b""):
            for out in (log, sys.stdout.buffer):
                out.write(chunk)
                out.flush()
        code = child.wait()
    (run_dir / "training.exit.tmp").write_text(str(code))
    os.replace(run_dir / "training.exit.tmp", run_dir / "training.exit")
    return code


def stop_training(tmux: Tmux, pane: int | None) -> None:
    """Ctrl-C in the training window, then SIGTERM to its process group after STOP_TIMEOUT_S."""
    if pane is None or first_to_exit([pane], 0) is not None:
        return
    info(f"stopping training (Ctrl-C in its window, up to {STOP_TIMEOUT_S} s)")
    tmux.run("send-keys", "-t", f"={tmux.session}:training", "C-c")
    if first_to_exit([pane], STOP_TIMEOUT_S) is None:
        info("training did not stop; sending SIGTERM to its window's process group")
        os.killpg(pane, signal.SIGTERM)
        first_to_exit([pane], 10)
