"""A real run: the runtime env in a private file, a Ray head only when none answers, the job; on exit, Ctrl-C,
SIGTERM or SIGHUP, the job it submitted (`ray job stop`: Ctrl-C only stops `ray job submit` from tailing the logs)
and the head it started, from the moment it exists, are stopped. Nothing else is touched: nothing is killed by name,
a running cluster is left as it is.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from slime_search_r1.launch.command import Launch
from slime_search_r1.launch.printed import (
    RAY,
    dump_folder,
    head_command,
    runtime_env_json,
    submit_command,
    viewer_command,
)
from slime_search_r1.launch.signals import Stopped, holding, ignore_signals, stop_on_signals
from slime_search_r1.settings.kinds import ConfigError

PROG = "run_qwen2.5_3B.sh"
HEAD_START_TIMEOUT_S = 120  # for a started Ray head's dashboard to answer


def info(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def dashboard_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=3) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def start_head(launch: Launch, log_path: Path) -> subprocess.Popen:
    """The head, started; wait_for_head() then waits until it answers."""
    command = head_command(launch)
    info(f"starting a Ray head: {' '.join(command)}")
    with open(log_path, "wb") as log:  # its own session: a Ctrl-C in the terminal is ours to pass on, in order
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_head(launch: Launch, head: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + HEAD_START_TIMEOUT_S
    while not dashboard_up(launch.dashboard_url):
        if head.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            raise ConfigError(f"ray start failed:\n{tail}\nif a stale cluster holds the ports, check 'ray status' and "
                              "stop it yourself")  # fmt: skip
        if time.monotonic() > deadline:
            raise ConfigError(f"the Ray dashboard did not answer at {launch.dashboard_url} within "
                              f"{HEAD_START_TIMEOUT_S} s; see 'ray status'")  # fmt: skip
        time.sleep(1)


def stop_head(head: subprocess.Popen) -> None:
    """`ray start --block` stops every process of the node it started on SIGTERM, and only those."""
    info(f"stopping the Ray head this run started (pid {head.pid})")
    head.terminate()
    try:
        head.wait(60)
    except subprocess.TimeoutExpired:
        info(f"warning: Ray head {head.pid} still running after 60 s")


def run(launch: Launch) -> int:
    if shutil.which(RAY) is None:
        raise ConfigError(f"'{RAY}' not found on PATH; run inside slime's environment")
    stop_on_signals()
    head = job = None
    finished = False
    with tempfile.TemporaryDirectory(prefix="search-r1-run.") as run_dir:  # mode 700
        env_file = Path(run_dir) / "runtime_env.json"
        with os.fdopen(os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(runtime_env_json(launch, hide_secrets=False))
        try:
            if dashboard_up(launch.dashboard_url):
                info(f"using the Ray cluster that answers at {launch.dashboard_url} (it is left running)")
            else:  # the head is ours from the moment it exists: a signal or a failed start stops it (finally)
                with holding():
                    head = start_head(launch, Path(run_dir) / "ray_head.log")
                wait_for_head(launch, head, Path(run_dir) / "ray_head.log")
            if dump_folder(launch):
                info(f"dumps go to {dump_folder(launch)}; see them with: {viewer_command(launch)}")
            info(f"submitting job {launch.job_id}")
            with holding():
                job = subprocess.Popen(submit_command(launch, str(env_file)), start_new_session=True)
            code = job.wait()
            finished = True
            return code
        except Stopped as stopped:
            return stopped.code
        finally:
            ignore_signals()
            if job is not None and not finished:
                info(f"stopping Ray job {launch.job_id}")
                stop = [RAY, "job", "stop", "--address", launch.dashboard_url, launch.job_id]
                if subprocess.run(stop, timeout=90, stdout=sys.stderr).returncode != 0:
                    info(f"warning: could not stop job {launch.job_id}")
                job.terminate()
                job.wait()
            if head is not None and head.poll() is None:
                stop_head(head)
