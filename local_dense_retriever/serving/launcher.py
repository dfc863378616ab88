"""Start the retrieval server CLI as a child process on loopback and wait until `/health` says it is ready."""

import os
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the repository: local_dense_retriever is importable from it


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def health_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


SERVER_MODULE = ["-m", "local_dense_retriever.retrieval_server"]
SERVER_SCRIPT = [str(PACKAGE_ROOT / "local_dense_retriever" / "retrieval_server.py")]  # as Search-R1 runs it


class ServerProcess:
    """`with ServerProcess([...flags]) as server:` runs `python -m local_dense_retriever.retrieval_server`.

    `program` replaces what follows `python` (e.g. SERVER_SCRIPT, or another server speaking the same API);
    `open_file_limit` runs it under that RLIMIT_NOFILE (soft and hard, like `ulimit -n`); `env` is added to this
    process's environment for the child.
    """

    def __init__(
        self,
        flags: list[str],
        log_path: Path,
        port: int | None = None,
        startup_timeout: float = 600.0,
        program: list[str] = SERVER_MODULE,
        open_file_limit: int | None = None,
        env: dict[str, str] | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, *program, *flags, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.env = {**os.environ, **env} if env else None
        self.process: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self.open_file_limit = open_file_limit

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        started = time.perf_counter()
        limit = self.open_file_limit
        self.process = subprocess.Popen(
            self.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=PACKAGE_ROOT,
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))) if limit else None,
            env=self.env,
        )
        log.close()
        deadline = started + self.startup_timeout
        while health_status(self.url) != 200:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"the retrieval server exited with code {code}:\n{self.log_tail()}")
            if time.perf_counter() > deadline:
                self.stop()
                raise TimeoutError(f"the server was not ready in {self.startup_timeout} s:\n{self.log_tail()}")
            time.sleep(0.1)
        self.startup_seconds = time.perf_counter() - started

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
