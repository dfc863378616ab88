"""The retrieval server as a child process: checked before it starts (preflight), started, waited for until it is
ready (server_ready, the one health probe), and stopped by its own PID. The tests, the benchmarks, the demo and the
tmux wrapper (slime_search_r1/launch/with_retrieval.py) all start it through ServerProcess."""

import ctypes
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the repository: local_dense_retriever is importable from it
# What retrieval_server.py imports; the wrapper checks the retriever's Python has them before it starts the server.
SERVER_MODULES = ("torch", "transformers", "faiss", "fastapi", "uvicorn", "orjson", "pydantic")


class PreflightError(RuntimeError):
    """The server would not start (or not for long): one line saying what and how to fix it."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    """Whether the server could bind host:port now (as uvicorn binds: a socket in TIME_WAIT is no conflict)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True


def health_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def server_ready(url: str) -> bool:
    """200 from GET /health; a server without /health (Search-R1's own, 404) is ready when POST /retrieve answers."""
    status = health_status(url, timeout=3.0)
    if status != 404:
        return status == 200
    body = b'{"queries": ["health check"], "topk": 1, "return_scores": false}'
    request = urllib.request.Request(f"{url}/retrieve", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def flag_value(flags: list[str], name: str) -> str | None:
    """The last value of `name` in a flag list, as argparse keeps it."""
    values = [flags[i + 1] for i in range(len(flags) - 1) if flags[i] == name]
    return values[-1] if values else None


def preflight(python: str, flags: list[str], host: str, port: int) -> None:
    """What would stop the server, refused before it starts (and before any GPU is spent on training).

    The index's memory plan (will it fit in RAM or GPU memory beside training) belongs here too, once written.
    """
    try:
        probe = f"import importlib.util as u; print(' '.join(m for m in {SERVER_MODULES!r} if u.find_spec(m) is None))"
        result = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise PreflightError(f"the retriever's Python '{python}' not found (RETRIEVER_PYTHON)") from None
    if result.returncode != 0:
        raise PreflightError(f"the retriever's Python '{python}' does not run: {result.stderr.strip()[-300:]}")
    if result.stdout.strip():
        raise PreflightError(
            f"the retriever's Python '{python}' lacks: {result.stdout.strip()}; install them there (pip install -e "
            f"'{PACKAGE_ROOT}[retriever]') or point RETRIEVER_PYTHON at the right environment"
        )
    for flag, what in (("--corpus_path", "corpus"), ("--index_path", "index")):
        path = flag_value(flags, flag)
        if path is not None and not os.path.exists(path):
            raise PreflightError(f"{what} not found: {path} ({flag}; see local_dense_retriever/README.md)")
    if not port_free(host, port):
        raise PreflightError(
            f"port {port} on {host} is in use (see: ss -ltnp 'sport = :{port}'); stop what holds it, or choose "
            "another port in RETRIEVAL_SERVER_URL, or use the running server with START_RETRIEVER=0"
        )


SERVER_MODULE = ["-m", "local_dense_retriever.retrieval_server"]
SERVER_SCRIPT = [str(PACKAGE_ROOT / "local_dense_retriever" / "retrieval_server.py")]  # as Search-R1 runs it


def _die_with_parent() -> None:
    """SIGTERM this process when the one that started it dies, however it dies (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerProcess:
    """`with ServerProcess([...flags]) as server:` runs `python -m local_dense_retriever.retrieval_server`.

    `program` replaces what follows `python` (e.g. SERVER_SCRIPT, or another server speaking the same API);
    `python` is the interpreter (the retriever's environment) and `prefix` goes before it (e.g. taskset -c 0-7,
    which execs it: the PID stays the server's); `open_file_limit` runs it under that RLIMIT_NOFILE (soft and
    hard, like `ulimit -n`); `env` is added to this process's environment for the child. The server runs in a
    session of its own (a Ctrl-C in the terminal is the caller's to pass on); with `die_with_parent` it also gets
    SIGTERM if the caller dies without stopping it.
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
        python: str = sys.executable,
        prefix: list[str] | None = None,
        host: str = "127.0.0.1",
        die_with_parent: bool = False,
    ):
        self.port = port or free_port()
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}"
        self.command = [*(prefix or []), python, *program, *flags, "--host", host, "--port", str(self.port)]
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.env = {**os.environ, **env} if env else None
        self.process: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self.open_file_limit = open_file_limit
        self.die_with_parent = die_with_parent

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start the process (its log begins with the command); wait_ready() waits for it to answer."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        limit, die_with_parent = self.open_file_limit, self.die_with_parent

        def before_exec() -> None:
            if limit:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
            if die_with_parent:
                _die_with_parent()

        with open(self.log_path, "wb") as log:
            log.write(f"{time.strftime('%F %T')} starting: {shlex.join(self.command)}\n".encode())
            log.flush()
            self.started = time.perf_counter()
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=PACKAGE_ROOT,
                preexec_fn=before_exec if limit or die_with_parent else None,
                env=self.env,
                start_new_session=True,
            )

    def wait_ready(self) -> None:
        """Until server_ready(); raises RuntimeError if the process exits first, TimeoutError (after stopping it)
        when startup_timeout runs out. Both messages end with the log's tail."""
        deadline = self.started + self.startup_timeout
        while not server_ready(self.url):
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"the retrieval server exited with code {code}:\n{self.log_tail()}")
            if time.perf_counter() > deadline:
                self.stop()
                raise TimeoutError(f"the server was not ready in {self.startup_timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.1)
        self.startup_seconds = time.perf_counter() - self.started

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
