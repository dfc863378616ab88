"""python -m slime_search_r1.launch.with_retrieval PLUGIN: the retrieval server and training side by side in one tmux
session, stopped together (what run_qwen2.5_3B_with_retrieval.sh runs).

1. checks tmux, the settings and, when it starts a server, the server itself (its Python and modules, the index
   and corpus files, the port: local_dense_retriever.serving.launcher.preflight) and its memory plan: the layout its
   flags choose, printed with its RAM and per-GPU bytes, refused when it cannot fit in RAM or on its GPUs beside
   what TRAIN_CMD's train.py flags declare (asked from the launch: retriever_memory.py), before anything starts;
2. starts the retrieval server (a child of this process, stopped by its PID) and shows its log in tmux window
   "retriever"; waits until it is ready (GET /health, RETRIEVER_STARTUP_TIMEOUT);
3. starts training (TRAIN_CMD) in window "training", its output also in a log;
4. waits for training to exit, or for the server to die; on exit, Ctrl-C, SIGTERM or SIGHUP (from the checks on)
   it stops exactly what it started (training first, by Ctrl-C in its window, then the server) and exits with
   training's exit code (1 if the server died first).
The retrieval URL and the search backend are the plugin's settings, resolved as training resolves them (the dict in
generate_with_search.py, then the environment): one local URL gets a server started here; a non-local URL, several
URLs or START_RETRIEVER=0 are used as they are. Watch it with: tmux attach -t slime-search-r1
"""

import errno
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from local_dense_retriever.retrieval.memory_plan import GIB, MemoryPlanError
from local_dense_retriever.serving.launcher import (
    NODE_GPUS_UNKNOWN,
    PreflightError,
    ServerFacts,
    ServerLayout,
    ServerProcess,
    flag_value,
    preflight,
    server_layout,
    server_ready,
)
from slime_search_r1.launch.checks import configs_from_source
from slime_search_r1.launch.knobs import REPO, WRAPPER, expand_ids, help_table
from slime_search_r1.launch.retriever_memory import (
    DESCRIBE_VARIABLE,
    NODE_RETRIEVER_VARIABLES,
    TrainingGpus,
    check_beside_training,
    gpu_memory_total,
    node_retriever_environment,
)
from slime_search_r1.launch.signals import Stopped, holding, ignore_signals, run_child, stop_on_signals
from slime_search_r1.settings import ConfigError, Section, read_environment, resolve_config, search_r1_configs

PROG = "run_qwen2.5_3B_with_retrieval.sh"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
LAUNCH_CALL = "-m slime_search_r1.launch"  # how run_qwen2.5_3B.sh (or a copy) hands over to the launch
DESCRIBE_TIMEOUT = 120  # seconds for the launch to say what training holds (it reads the flags and exits)
USAGE = (f"usage: bash {PROG} [--help]\n\n" + __doc__.split("\n\n", 1)[1].split("The retrieval URL")[0]
         + "Variables (RETRIEVAL_SERVER_URL and the plugin's other settings apart):\n")  # fmt: skip


class Failed(Exception):
    """Stop with exit code 1 and this message."""


def info(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def log_tail(path: Path, lines: int = 30) -> None:
    text = path.read_text(errors="replace") if path.exists() else ""
    print(f"---- last lines of {path} ----", *text.splitlines()[-lines:], "----", sep="\n", file=sys.stderr)


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


class Tmux:
    def __init__(self, knobs: Section):
        self.prefix = ["tmux", *(["-L", knobs.tmux_socket] if knobs.tmux_socket else [])]
        self.session = knobs.tmux_session
        self.created = False

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix, *args], capture_output=True, text=True)

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
        return shlex.join([*self.prefix, "attach", "-t", self.session])


def retrieval_bases(plugin: Path, environ) -> list[str]:
    """The plugin's retrieval URL(s) without /retrieve; refuses a backend that needs no retrieval server."""
    configs = search_r1_configs(configs_from_source(plugin), environ)
    if configs["search_backend"] != "local":
        raise Failed(f"SEARCH_BACKEND={configs['search_backend']} needs no retrieval server; run run_qwen2.5_3B.sh "
                     "directly")  # fmt: skip
    return [url.removesuffix("/retrieve") for url in resolve_config(configs).local.search_url]


def server_flags(knobs: Section) -> list[str]:
    if knobs.retriever_preset == "embedded":
        info(f"preparing the embedded mini-Wikipedia index (built once, cached under {REPO}/.cache; minutes on CPU)")
        try:
            command = [knobs.retriever_python, "-m", "local_dense_retriever.demo", "--print_server_flags"]
            printed = run_child(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
        except FileNotFoundError:
            raise Failed(f"the retriever's Python '{knobs.retriever_python}' not found (RETRIEVER_PYTHON)") from None
        flags = [line for line in printed.stdout.splitlines() if line]
        if printed.returncode != 0 or not flags:
            raise Failed("could not prepare the embedded index (see the error above)")
    else:
        flags = ["--index_path", knobs.retriever_index_path, "--corpus_path", knobs.retriever_corpus_path,
                 "--retriever_name", knobs.retriever_name, "--retriever_model", knobs.retriever_model]  # fmt: skip
    gpu = knobs.retriever_faiss_gpu == "1"
    if knobs.retriever_faiss_gpu == "auto" and shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        gpu = any(line.startswith("GPU") for line in listed.splitlines())
    threads = ["--num_threads", str(knobs.retriever_num_threads)] if knobs.retriever_num_threads else []
    extra = shlex.split(knobs.retriever_extra_args or "")
    return [*flags, "--topk", str(knobs.retriever_topk), *(["--faiss_gpu"] if gpu else []), *threads, *extra]


def cpu_prefix(knobs: Section) -> list[str]:
    """taskset -c RETRIEVER_CPUS (it execs the server: the PID stays the server's)."""
    if not knobs.retriever_cpus:
        return []
    if shutil.which("taskset") is None:
        raise Failed("RETRIEVER_CPUS needs taskset (apt-get install util-linux)")
    wanted = set(expand_ids(knobs.retriever_cpus))
    allowed = os.sched_getaffinity(0)
    if not wanted & allowed:
        raise Failed(f"RETRIEVER_CPUS={knobs.retriever_cpus} names no CPU this script may use (allowed: "
                     f"{','.join(map(str, sorted(allowed)))})")  # fmt: skip
    return ["taskset", "-c", knobs.retriever_cpus]


def runs_the_launch(train_cmd: str) -> bool:
    """Whether TRAIN_CMD runs python -m slime_search_r1.launch (itself, or a script that calls it, as
    run_qwen2.5_3B.sh does): only then is it asked what training holds, since a command that does not answer would
    run for real."""
    try:
        words = shlex.split(train_cmd)
    except ValueError:
        return False
    if any(words[i : i + 2] == ["-m", "slime_search_r1.launch"] for i in range(len(words))):
        return True
    for word in words:
        path = Path(word)
        if path.suffix == ".sh" and path.is_file() and LAUNCH_CALL in path.read_text(errors="replace"):
            return True
    return False


def ask_training(train_cmd: str) -> TrainingGpus | None:
    """What TRAIN_CMD's train.py flags hold on each GPU, from the launch itself (a dry run that writes them to a file
    and exits, DESCRIBE_VARIABLE); None, with a line saying so, when TRAIN_CMD does not say."""
    unknown = "the retriever's memory plan is checked against RAM and each GPU's total only"
    if not runs_the_launch(train_cmd):
        info(f"TRAIN_CMD does not run the launch ({LAUNCH_CALL}, as run_qwen2.5_3B.sh does), so what training "
             f"holds on each GPU is not known: {unknown}")  # fmt: skip
        return None
    with tempfile.TemporaryDirectory(prefix="search-r1-describe.") as folder:
        answer = Path(folder) / "training.json"
        env = {k: v for k, v in os.environ.items() if k not in NODE_RETRIEVER_VARIABLES}
        env.update({DESCRIBE_VARIABLE: str(answer), "DRY_RUN": "1"})  # DRY_RUN: a launch without the variable
        try:  # in a session of its own: on a timeout or a stop, what it started is killed, and only that
            asked = run_child(["bash", "-c", train_cmd], timeout=DESCRIBE_TIMEOUT, new_session=True, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
        except subprocess.TimeoutExpired:
            info(f"TRAIN_CMD did not say what training holds in {DESCRIBE_TIMEOUT} s; {unknown}")
            return None
        if asked.returncode != 0:
            last = (asked.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise Failed(f"training would not start (TRAIN_CMD's launch, asked first: exit code "
                         f"{asked.returncode}): {last}")  # fmt: skip
        if not answer.exists():
            info(f"TRAIN_CMD ran without saying what training holds (a launch older than this wrapper?); {unknown}")
            return None
        return TrainingGpus.from_json(json.loads(answer.read_text())["training"])


def wrapper_setting(knobs: Section, server: ServerLayout, flags: list[str]) -> str:
    """The server flag and the wrapper variable that chose the layout, for the plan's messages."""
    extra = shlex.split(knobs.retriever_extra_args or "")
    if server.flag:
        name = server.flag.split()[0]
        if name in extra:
            return f"{server.flag} (RETRIEVER_EXTRA_ARGS)"
        return f"{server.flag} (RETRIEVER_FAISS_GPU={knobs.retriever_faiss_gpu})"
    index = f"--index_path {flag_value(flags, '--index_path')}" + (" --faiss_mmap" if server.mmap else "")
    return f"{index} ({'RETRIEVER_PRESET=embedded' if knobs.retriever_preset == 'embedded' else 'on the CPU'})"


def check_memory(knobs: Section, flags: list[str], facts: ServerFacts) -> dict:
    """Prints the server's memory plan and refuses one that cannot fit beside training (Failed, one line); returns
    the NODE_RETRIEVER_* variables that describe the server to the launch in the training window. TRAIN_CMD is asked
    what training holds only for a layout on GPUs."""
    server, training = server_layout(flags, facts), None  # the server's flags are checked first
    if server.endswith(NODE_GPUS_UNKNOWN) if isinstance(server, str) else server.gpu_ids:
        training = ask_training(knobs.train_cmd)
        server = server_layout(flags, facts, training.node_gpus if training else None)
    if isinstance(server, str):
        info(f"no memory plan: {server}")
        return {}
    gpu_total = gpu_memory_total(knobs.gpu_memory_gib) if server.gpu_ids else (None, "")
    if knobs.retriever_ram_gib:
        ram = (int(knobs.retriever_ram_gib * GIB), "RETRIEVER_RAM_GIB")
    else:
        ram = (facts.ram_available, "now, in the retriever's Python")
    trainer_bytes = int(knobs.trainer_residual_gib * GIB)
    try:
        checked = check_beside_training(server, wrapper_setting(knobs, server, flags), training, gpu_total,
                                        trainer_bytes, ram)  # fmt: skip
    except MemoryPlanError as err:
        raise Failed(str(err)) from None
    for line in checked.lines:
        info(line)
    for warning in checked.warnings:
        info(f"warning: {warning}")
    return node_retriever_environment(server)


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


def wait_until_ready(bases: list[str], server: ServerProcess | None, knobs: Section, retriever_log: Path) -> None:
    started, timeout = time.monotonic(), knobs.retriever_startup_timeout
    for base in bases:
        info(f"waiting for {base}/health (up to {timeout:g} s)")
        try:
            if server is not None:
                server.wait_ready()
            else:
                while not server_ready(base):
                    if time.monotonic() - started > timeout:
                        raise TimeoutError
                    time.sleep(1)
        except RuntimeError:
            log_tail(retriever_log)
            raise Failed(f"the retrieval server exited during startup (log above: {retriever_log})") from None
        except TimeoutError:
            if server is not None:
                log_tail(retriever_log)
            raise Failed(f"{base} was not healthy after {timeout:g} s; a large index can take longer to load (raise "
                         "RETRIEVER_STARTUP_TIMEOUT), or check the server") from None  # fmt: skip
    info(f"retrieval server ready after {time.monotonic() - started:.0f} s")


def stop_training(tmux: Tmux, pane: int | None, timeout: float) -> None:
    if pane is None or first_to_exit([pane], 0) is not None:
        return
    info(f"stopping training (Ctrl-C in its window, up to {timeout:g} s)")
    tmux.run("send-keys", "-t", f"={tmux.session}:training", "C-c")
    if first_to_exit([pane], timeout) is None:
        info("training did not stop; sending SIGTERM to its window's process group")
        os.killpg(pane, signal.SIGTERM)
        first_to_exit([pane], 10)


def run(plugin: Path, knobs: Section) -> int:
    if shutil.which("tmux") is None:
        raise Failed("tmux is not installed (apt-get install tmux)")
    bases = retrieval_bases(plugin, os.environ)
    split = urlsplit(bases[0])
    start_local = knobs.start_retriever == "auto" and len(bases) == 1 and split.hostname in LOCAL_HOSTS
    tmux = Tmux(knobs)
    if tmux.run("has-session", "-t", f"={tmux.session}").returncode == 0:
        raise Failed(f"tmux session '{tmux.session}' already exists (an earlier run?); attach with "
                     f"'{tmux.attach_hint()}' and stop it, or set TMUX_SESSION to another name")  # fmt: skip
    server = None
    port = split.port or (443 if split.scheme == "https" else 80)
    node_env = {}
    if start_local:
        if knobs.retriever_preset == "embedded":  # its Python and the port first: preparing the index needs both
            preflight(knobs.retriever_python, [], knobs.retriever_host, port)
        flags, prefix = server_flags(knobs), cpu_prefix(knobs)
        facts = preflight(knobs.retriever_python, flags, knobs.retriever_host, port)
        node_env = check_memory(knobs, flags, facts)
    stamp = time.strftime("%Y%m%d_%H%M%S")
    logs = Path(knobs.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    retriever_log, training_log = logs / f"retrieval_server_{stamp}.log", logs / f"training_{stamp}.log"
    run_dir = Path(tempfile.mkdtemp(prefix="search-r1-wrapper."))  # mode 700: the environment file holds secrets
    pane = None
    try:
        if start_local:
            server = ServerProcess(flags, retriever_log, port=port, startup_timeout=knobs.retriever_startup_timeout,
                                   python=knobs.retriever_python, prefix=prefix, host=knobs.retriever_host,
                                   program=[str(REPO / "local_dense_retriever" / "retrieval_server.py")],
                                   die_with_parent=True)  # fmt: skip
            info(f"starting the retrieval server on {knobs.retriever_host}:{port} in tmux window 'retriever' (log: "
                 f"{retriever_log})")  # fmt: skip
            with holding():
                server.spawn()
            tmux.window("retriever", shlex.join(["tail", "-n", "+1", "-F", str(retriever_log)]))
        else:
            info(f"using the retrieval server(s) at {', '.join(bases)}; none is started here")
        wait_until_ready(bases, server, knobs, retriever_log)
        # not the caller's tmux; NODE_RETRIEVER_* describe the server started here, if any, to the launch
        dropped = ("TMUX", "TMUX_PANE", *(NODE_RETRIEVER_VARIABLES if start_local else ()))
        env = {k: v for k, v in os.environ.items() if k not in dropped} | node_env
        spec = {"env": env, "cwd": os.getcwd(), "command": knobs.train_cmd, "log": str(training_log)}
        with os.fdopen(os.open(run_dir / "training.json", os.O_WRONLY | os.O_CREAT, 0o600), "w") as out:
            json.dump(spec, out)
        info(f"starting training in tmux window 'training' (log: {training_log})")
        window = [sys.executable, "-m", "slime_search_r1.launch.with_retrieval", "--training-window", str(run_dir)]
        pane = tmux.window("training", f"PYTHONPATH={shlex.quote(str(REPO))} exec {shlex.join(window)}")
        info(f"watch with: {tmux.attach_hint()}   (Ctrl-C here stops training and the server)")
        exited = first_to_exit([pane, *([server.process.pid] if server else [])])
        if exited != pane:
            log_tail(retriever_log)
            raise Failed("the retrieval server died during training (log above); stopping training")
        if not (run_dir / "training.exit").exists():
            raise Failed(f"the training window closed without an exit code (killed?); see {training_log}")
        code = int((run_dir / "training.exit").read_text())
        info(f"training exited with code {code}")
        return code
    except Stopped as stopped:
        return stopped.code
    except Failed as failed:
        print(f"{PROG}: error: {failed}", file=sys.stderr)
        return 1
    finally:
        ignore_signals()
        stop_training(tmux, pane, knobs.shutdown_timeout)
        if server is not None:
            if server.process.poll() is None:
                info(f"stopping the retrieval server (pid {server.process.pid})")
            server.stop()
        if tmux.created:
            tmux.run("kill-session", "-t", f"={tmux.session}")
        shutil.rmtree(run_dir, ignore_errors=True)
        if training_log.exists():
            info(f"training log: {training_log}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--training-window"]:
        return training_window(Path(argv[1]))
    plugin, argv = Path(argv[0]), argv[1:]  # the script names its generate_with_search.py
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE + help_table(WRAPPER))
        return 0
    try:
        if argv:
            raise Failed(f"unknown argument '{argv[0]}'; settings are environment variables (see --help)")
        knobs, _ = read_environment(WRAPPER.values(), os.environ)
        stop_on_signals()  # from the checks on: what they start (the index's preparation, the launch asked) stops too
        return run(plugin, knobs)
    except Stopped as stopped:
        return stopped.code
    except (Failed, ConfigError, PreflightError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
