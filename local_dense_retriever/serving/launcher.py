"""The retrieval server as a child process: checked before it starts (preflight, which also reads what the index's
memory plan needs), started, waited for until it is ready (server_ready, the one health probe), and stopped by its
own PID. The tests, the benchmarks, the demo and the tmux wrapper (slime_search_r1/launch/with_retrieval.py) all start
it through ServerProcess; server_layout() says which memory-plan layout the server's flags choose."""

import ctypes
import importlib.util
import json
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
from dataclasses import asdict, dataclass
from pathlib import Path

from local_dense_retriever.retrieval.memory_plan import E5_BASE_PARAMETERS, MemoryPlan, gib, plan_memory
from local_dense_retriever.retrieval.model_source import looks_like_a_path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the repository: local_dense_retriever is importable from it
# What retrieval_server.py imports; the wrapper checks the retriever's Python has them before it starts the server.
SERVER_MODULES = ("torch", "transformers", "faiss", "fastapi", "uvicorn", "orjson", "pydantic", "numpy", "psutil")


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


@dataclass(frozen=True)
class ServerFacts:
    """What the index's memory plan needs, read in the retriever's own Python (it has numpy and psutil)."""

    ram_available: int  # bytes this machine could still give the server now
    visible_gpus: int  # GPUs CUDA would show the server (CUDA_VISIBLE_DEVICES applied)
    # the index's code, dim and size (retrieval/index_files.py) and its layout as the memory plan names it (HNSW32,
    # IVF4096,SQ8, ...: retrieval/index_layout.py; None for one it does not name); None: not headed so
    header: dict | None = None
    index_bytes: int | None = None  # the index file's size


# Runs in the retriever's Python: its modules first, then (only when they are all there) the facts.
PROBE = "import sys; sys.path.insert(0, sys.argv[1]); import local_dense_retriever.serving.launcher as x; x.probe()"


def probe() -> None:
    """`python -c PROBE PACKAGE_ROOT INDEX_PATH`: prints {"missing": [...]} or the ServerFacts as JSON."""
    missing = [module for module in SERVER_MODULES if importlib.util.find_spec(module) is None]
    if missing:
        print(json.dumps({"missing": missing}))
        return
    from local_dense_retriever.retrieval.gpus import visible_gpu_count
    from local_dense_retriever.retrieval.index_files import read_header
    from local_dense_retriever.retrieval.index_layout import layout_name
    from local_dense_retriever.retrieval.memory_plan import available_ram

    index_path = sys.argv[2]
    facts = ServerFacts(available_ram(), visible_gpu_count())
    if index_path and os.path.isfile(index_path):
        header = read_header(index_path)
        header = header and {**asdict(header), "layout": layout_name(index_path)}
        facts = ServerFacts(facts.ram_available, facts.visible_gpus, header, os.path.getsize(index_path))
    print(json.dumps({"missing": [], "facts": asdict(facts)}))


def preflight(python: str, flags: list[str], host: str, port: int) -> ServerFacts:
    """What would stop the server, refused before it starts (and before any GPU is spent on training): every problem
    at once (the retriever's Python and its modules, each missing file, the port); returns what the index's memory
    plan needs (server_layout(), then the caller's check beside training)."""
    index_path = flag_value(flags, "--index_path") or ""
    problems, answer = [], None
    try:
        result = subprocess.run([python, "-c", PROBE, str(PACKAGE_ROOT), index_path], capture_output=True,
                                text=True, timeout=120)  # fmt: skip
    except FileNotFoundError:
        problems.append(f"the retriever's Python '{python}' not found (RETRIEVER_PYTHON)")
    else:
        if result.returncode != 0:
            problems.append(f"the retriever's Python '{python}' does not run: {result.stderr.strip()[-300:]}")
        else:
            answer = json.loads(result.stdout.strip().splitlines()[-1])
    if answer and answer["missing"]:
        problems.append(
            f"the retriever's Python '{python}' lacks: {' '.join(answer['missing'])}; install them there (pip "
            f"install -e '{PACKAGE_ROOT}[retriever]') or point RETRIEVER_PYTHON at the right environment"
        )
    for flag, what in (("--corpus_path", "corpus"), ("--index_path", "index"), ("--pages_path", "pages")):
        path = flag_value(flags, flag)
        if path is not None and not os.path.exists(path):
            problems.append(f"{what} not found: {path} ({flag}; see local_dense_retriever/README.md)")
    model = flag_value(flags, "--retriever_model")
    if model is not None and looks_like_a_path(model) and not os.path.isdir(os.path.expanduser(model)):
        problems.append(f"encoder not found: {model} (--retriever_model: a model directory or a Hugging Face id)")
    if not port_free(host, port):
        problems.append(
            f"port {port} on {host} is in use (see: ss -ltnp 'sport = :{port}'); stop what holds it, or choose "
            "another port in RETRIEVAL_SERVER_URL, or use the running server with START_RETRIEVER=0"
        )
    if len(problems) == 1:
        raise PreflightError(problems[0])
    if problems:
        raise PreflightError(f"the retrieval server cannot start ({len(problems)} problems):\n  - " +
                             "\n  - ".join(problems))  # fmt: skip
    return ServerFacts(**answer["facts"])


@dataclass(frozen=True)
class ServerLayout:
    """The memory-plan layout a server's flags choose, and where: the GPUs it uses, memory-mapped or read whole."""

    layout: str  # memory_plan's layout name (for a CPU index other than Flat: read from its file)
    corpus_size: int
    dim: int
    gpu_ids: tuple[int, ...] = ()
    mmap: bool = False  # --faiss_mmap on a Flat index
    flag: str = ""  # the server flag that chose it: "--torch_search 0,1", "--faiss_gpu", "" (FAISS on the CPU)
    file_bytes: int | None = None  # that uncovered CPU index: planned from its file, which FAISS reads whole

    def plan(self) -> MemoryPlan:
        if self.file_bytes is None:
            return plan_memory(self.layout, self.corpus_size, self.dim, len(self.gpu_ids), mmap=self.mmap)
        encoder = E5_BASE_PARAMETERS * 4
        note = f"the index file {gib(self.file_bytes)}, read whole, + encoder"
        return MemoryPlan(self.layout, self.corpus_size, self.dim, 0, self.file_bytes + encoder, note, 0)


def gpu_id_list(value: str, visible: int) -> tuple[int, ...]:
    """GPU ids as --torch_search names them (`all`: the visible ones); ValueError naming what is accepted."""
    from local_dense_retriever.retrieval.gpus import parse_gpu_list

    # Where no GPU is visible (a check on another machine than the node), any distinct ids are taken as named.
    return tuple(parse_gpu_list("--torch_search", value, visible or 1 << 16) or ())


NODE_GPUS_UNKNOWN = "no GPU is visible here and the node's GPUs are not known"


def server_layout(flags: list[str], facts: ServerFacts, node_gpus: int | None = None) -> ServerLayout | str:
    """The layout the server's flags choose, over the GPUs it would use (`all` and --faiss_gpu: every visible GPU,
    or `node_gpus` where none is visible here); or a sentence saying why there is no plan. PreflightError when the
    flags do not parse as the server's own parser reads them."""
    from local_dense_retriever.serving.config import build_parser

    parser = build_parser()

    def refuse(message: str) -> None:
        raise PreflightError(f"the server's flags: {message}")

    parser.error = refuse  # the server's own parser, which would stop the server with this message
    args = parser.parse_args(flags)
    if args.retriever_name.lower() == "bm25" or args.backend == "qdrant":
        return "BM25 and Qdrant are not planned (no FAISS index file)"
    header = facts.header
    if header is None:
        return f"--index_path {args.index_path}: its header gives no size (not a plain FAISS index file)"
    size, dim, flat = header["size"], header["dim"], header["code"] in ("IxFI", "IxF2")
    # as the memory plan names layouts; FAISS's type code only for a kind it has no name for
    named = header.get("layout") or f"FAISS type {header['code']} (not a layout the memory plan names)"
    gpus = facts.visible_gpus or node_gpus or 0
    if args.torch_search is not None and args.torch_search.strip().lower() != "cpu":
        if args.torch_search.strip().lower() == "all" and not gpus:
            return f"--torch_search all: {NODE_GPUS_UNKNOWN}"
        try:
            ids = gpu_id_list(args.torch_search, gpus)
        except ValueError as err:
            raise PreflightError(str(err)) from None
        dtype = args.torch_search_dtype or "fp16"
        return ServerLayout(f"torch-{dtype}", size, dim, ids, flag=f"--torch_search {args.torch_search}")
    if args.torch_search is not None:  # torch on the CPU holds the vectors in RAM: planned as a Flat index read whole
        return ServerLayout("Flat", size, dim, flag="--torch_search cpu")
    if args.faiss_gpu:
        if not flat:
            return f"--faiss_gpu with a {named} index: the plan covers FAISS on GPUs for Flat indexes only"
        if not gpus:
            return f"--faiss_gpu: {NODE_GPUS_UNKNOWN}"
        layout = "faiss-gpu-fp32" if args.faiss_fp32 else "faiss-gpu-fp16"
        return ServerLayout(layout, size, dim, tuple(range(gpus)), flag="--faiss_gpu")
    if flat:
        return ServerLayout("Flat", size, dim, mmap=args.faiss_mmap)
    return ServerLayout(named, size, dim, file_bytes=facts.index_bytes)


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
        try:
            self.start()
        except BaseException:  # a start cut short (Ctrl-C, a signal, a timeout) stops what it spawned
            self.stop()
            raise
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
