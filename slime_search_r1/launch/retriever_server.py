"""The retrieval server the tmux wrapper starts, decided and checked before anything starts: which servers the plugin
searches (its settings, resolved as training resolves them), the server's flags (RETRIEVER_ARGS, the embedded
preset's, --faiss_gpu), its CPUs, its memory plan beside what TRAIN_CMD's training declares on each GPU (asked from
the launch itself: retriever_memory.py), and waiting until it answers.
"""

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from local_dense_retriever.retrieval.memory_plan import GIB, MemoryPlanError
from local_dense_retriever.serving.launcher import (
    NODE_GPUS_UNKNOWN,
    ServerFacts,
    ServerLayout,
    ServerProcess,
    flag_value,
    server_layout,
    server_ready,
)
from slime_search_r1.launch.checks import configs_from_source
from slime_search_r1.launch.retriever_memory import (
    NODE_RETRIEVER_VARIABLES,
    TrainingGpus,
    check_beside_training,
    gpu_memory_total,
    node_retriever_environment,
)
from slime_search_r1.launch.signals import run_child
from slime_search_r1.launch.tmux_session import Failed, info, log_tail
from slime_search_r1.settings.kinds import expand_ids
from slime_search_r1.settings.sources import resolve_config, search_r1_configs
from slime_search_r1.settings.table import DESCRIBE_VARIABLE, REPO
from slime_search_r1.settings.view import Section

LAUNCH_CALL = "-m slime_search_r1.launch"  # how run_qwen2.5_3B.sh (or a copy) hands over to the launch
DESCRIBE_TIMEOUT = 120  # seconds for the launch to say what training holds (it reads the flags and exits)


def retrieval_bases(plugin: Path, environ) -> list[str]:
    """The plugin's retrieval URL(s) without /retrieve; refuses a backend that needs no retrieval server."""
    configs = search_r1_configs(configs_from_source(plugin), environ)
    if configs["search_backend"] != "local":
        raise Failed(f"SEARCH_BACKEND={configs['search_backend']} needs no retrieval server; run run_qwen2.5_3B.sh "
                     "directly")  # fmt: skip
    return [url.removesuffix("/retrieve") for url in resolve_config(configs).local.search_url]


def server_flags(knobs: Section) -> list[str]:
    """The server's flags: the embedded preset's (RETRIEVER_PRESET=embedded), then RETRIEVER_ARGS (the last of a
    repeated flag wins), then --faiss_gpu when RETRIEVER_FAISS_GPU asks for it (auto: when nvidia-smi lists a GPU
    and those flags do not already say where the search runs)."""
    flags = []
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
    flags += shlex.split(knobs.retriever_args or "")
    gpu = knobs.retriever_faiss_gpu == "1"
    if knobs.retriever_faiss_gpu == "auto" and not search_place_chosen(flags) and shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        gpu = any(line.startswith("GPU") for line in listed.splitlines())
    return [*flags, *(["--faiss_gpu"] if gpu and "--faiss_gpu" not in flags else [])]


def search_place_chosen(flags: list[str]) -> bool:
    """Whether the server's flags already say where the search runs (--torch_search, which replaces FAISS;
    --faiss_gpu; a --backend other than faiss): RETRIEVER_FAISS_GPU=auto then adds nothing, since the server refuses
    --faiss_gpu beside the first and the last."""
    backend = next((flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag == "--backend"), "faiss")
    return "--torch_search" in flags or "--faiss_gpu" in flags or backend != "faiss"


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
    """What TRAIN_CMD's train.py flags hold on each GPU, from the launch itself (it writes them to a file and exits,
    DESCRIBE_VARIABLE); None, with a line saying so, when TRAIN_CMD does not say."""
    unknown = "the retriever's memory plan is checked against RAM and each GPU's total only"
    if not runs_the_launch(train_cmd):
        info(f"TRAIN_CMD does not run the launch ({LAUNCH_CALL}, as run_qwen2.5_3B.sh does), so what training "
             f"holds on each GPU is not known: {unknown}")  # fmt: skip
        return None
    with tempfile.TemporaryDirectory(prefix="search-r1-describe.") as folder:
        answer = Path(folder) / "training.json"
        env = {k: v for k, v in os.environ.items() if k not in NODE_RETRIEVER_VARIABLES}
        env[DESCRIBE_VARIABLE] = str(answer)
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
            info(f"TRAIN_CMD exited without saying what training holds; {unknown}")
            return None
        return TrainingGpus.from_json(json.loads(answer.read_text())["training"])


def flag_source(knobs: Section, name: str) -> str:
    """The wrapper variable a server flag came from: RETRIEVER_ARGS (given last, so it wins), else the embedded
    preset's flags, else RETRIEVER_FAISS_GPU (the only other source of a flag)."""
    if name in shlex.split(knobs.retriever_args or ""):
        return "RETRIEVER_ARGS"
    if knobs.retriever_preset == "embedded" and name != "--faiss_gpu":
        return "RETRIEVER_PRESET=embedded"
    return f"RETRIEVER_FAISS_GPU={knobs.retriever_faiss_gpu}"


def chosen_by(knobs: Section, server: ServerLayout, flags: list[str]) -> str:
    """The server flags that chose the layout, each with the wrapper variable it came from, for the plan's
    messages."""
    if server.flag:
        return f"{server.flag} ({flag_source(knobs, server.flag.split()[0])})"
    chosen = f"--index_path {flag_value(flags, '--index_path')} ({flag_source(knobs, '--index_path')})"
    if server.mmap:
        chosen += f" --faiss_mmap ({flag_source(knobs, '--faiss_mmap')})"
    return f"{chosen}, on the CPU"


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
    try:
        checked = check_beside_training(server, chosen_by(knobs, server, flags), training, gpu_total, ram)
    except MemoryPlanError as err:
        raise Failed(str(err)) from None
    for line in checked.lines:
        info(line)
    for warning in checked.warnings:
        info(f"warning: {warning}")
    return node_retriever_environment(server)


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
