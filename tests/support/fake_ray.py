"""A stand-in for the `ray` CLI, for testing what run_qwen2.5_3B.sh starts and stops (Ray itself is not installed).

It mimics the behaviour the script relies on, checked against ray 2.60 on this machine:
- `ray start --head --block --dashboard-port P`: serves GET /api/version on 127.0.0.1:P until SIGTERM;
- `ray job submit --submission-id ID --runtime-env FILE -- CMD...`: runs CMD with the runtime env's env_vars as a
  job that outlives the submit command (as Ray's does: Ctrl-C only stops tailing), waits for it and exits 0 if it
  succeeded, 1 if it failed (the log records the file's and its folder's modes);
- `ray job stop ID`: stops that job.
Every call is appended to $FAKE_RAY_LOG as a JSON line: {"argv": [...], "event": ...}.
"""

import http.server
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path


def log_path() -> Path:
    return Path(os.environ["FAKE_RAY_LOG"])


def jobs_dir() -> Path:
    return log_path().parent / "fake_ray_jobs"


def record(event: str, **fields) -> None:
    with log_path().open("a") as out:
        out.write(json.dumps({"argv": sys.argv[1:], "event": event, "pid": os.getpid(), **fields}) + "\n")


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


class VersionHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = b'{"ray_version": "fake"}'
        self.send_response(200 if self.path == "/api/version" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def start_head(argv: list[str]) -> int:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(option(argv, "--dashboard-port"))), VersionHandler)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    record("head-started")
    stopped.wait()
    server.shutdown()
    record("head-stopped")
    return 1  # what `ray start --block` returns after SIGTERM


def submit(argv: list[str]) -> int:
    job_id = option(argv, "--submission-id")
    runtime_env = Path(option(argv, "--runtime-env"))
    modes = {
        "runtime_env_mode": runtime_env.stat().st_mode & 0o777,
        "folder_mode": runtime_env.parent.stat().st_mode & 0o777,
    }
    env_vars = json.loads(runtime_env.read_text())["env_vars"]
    command = argv[argv.index("--") + 1 :]
    jobs_dir().mkdir(exist_ok=True)
    # A job of its own session: signals to this submit command (Ctrl-C, SIGTERM) do not reach it.
    job = subprocess.Popen(command, env={**os.environ, **env_vars}, start_new_session=True)
    (jobs_dir() / job_id).write_text(str(job.pid))
    record("job-submitted", job_id=job_id, job_pid=job.pid, **modes)
    code = job.wait()
    record("job-finished", job_id=job_id, code=code)
    return 0 if code == 0 else 1


def stop_job(argv: list[str]) -> int:
    job_id = argv[-1]
    record("job-stop", job_id=job_id)
    pid = int((jobs_dir() / job_id).read_text())
    try:
        exited = os.pidfd_open(pid)  # readable once the job has exited (as `ray job stop`, wait for it)
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return 0
    select.select([exited], [], [], 60)
    os.close(exited)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"] and "--head" in argv and "--block" in argv:
        return start_head(argv)
    if argv[:2] == ["job", "submit"]:
        return submit(argv)
    if argv[:2] == ["job", "stop"]:
        return stop_job(argv)
    record("unexpected")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
