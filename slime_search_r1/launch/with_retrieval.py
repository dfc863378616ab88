"""python -m slime_search_r1.launch.with_retrieval PLUGIN: the retrieval server and training side by side in one tmux
session, stopped together (what run_qwen2.5_3B_with_retrieval.sh runs).

1. checks tmux, the settings and, when it starts a server, the server itself (its Python and modules, the index
   and corpus files, the port: local_dense_retriever.serving.launcher.preflight) and its memory plan: the layout its
   flags choose, printed with its RAM and per-GPU bytes, refused when it cannot fit in RAM or on its GPUs beside
   what TRAIN_CMD's train.py flags declare (retriever_server.py), before anything starts;
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

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from local_dense_retriever.serving.launcher import PreflightError, ServerProcess, preflight
from slime_search_r1.launch.retriever_memory import NODE_RETRIEVER_VARIABLES
from slime_search_r1.launch.retriever_server import (
    check_memory,
    cpu_prefix,
    retrieval_bases,
    server_flags,
    wait_until_ready,
)
from slime_search_r1.launch.signals import Stopped, holding, ignore_signals, stop_on_signals
from slime_search_r1.launch.tmux_session import (
    PROG,
    Failed,
    Tmux,
    first_to_exit,
    info,
    log_tail,
    stop_training,
    training_window,
)
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import read_environment
from slime_search_r1.settings.table import REPO, WRAPPER, read_by
from slime_search_r1.settings.view import Section

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
SERVER_HOST = "127.0.0.1"  # the server serves this node's training only
USAGE = (f"usage: bash {PROG} [--help]\n\n" + __doc__.split("\n\n", 1)[1].split("The retrieval URL")[0]
         + "Its settings (RETRIEVER_*, TRAIN_CMD, ...): python -m slime_search_r1.launch --list\n")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--training-window"]:
        return training_window(Path(argv[1]))
    plugin, argv = Path(argv[0]), argv[1:]  # the script names its generate_with_search.py
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return 0
    try:
        if argv:
            raise Failed(f"unknown argument '{argv[0]}'; settings are environment variables (see --help)")
        knobs, _ = read_environment(read_by(WRAPPER), os.environ)
        stop_on_signals()  # from the checks on: what they start (the index's preparation, the launch asked) stops too
        return run(plugin, knobs)
    except Stopped as stopped:
        return stopped.code
    except (Failed, ConfigError, PreflightError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


def run(plugin: Path, knobs: Section) -> int:
    if shutil.which("tmux") is None:
        raise Failed("tmux is not installed (apt-get install tmux)")
    bases = retrieval_bases(plugin, os.environ)
    split = urlsplit(bases[0])
    start_local = knobs.start_retriever == "auto" and len(bases) == 1 and split.hostname in LOCAL_HOSTS
    tmux = Tmux()
    if tmux.run("has-session", "-t", f"={tmux.session}").returncode == 0:
        raise Failed(f"tmux session '{tmux.session}' already exists (an earlier run?); attach with "
                     f"'{tmux.attach_hint()}' and stop it first")  # fmt: skip
    server = None
    port = split.port or (443 if split.scheme == "https" else 80)
    node_env = {}
    if start_local:
        if knobs.retriever_preset == "embedded":  # its Python and the port first: preparing the index needs both
            preflight(knobs.retriever_python, [], SERVER_HOST, port)
        flags, prefix = server_flags(knobs), cpu_prefix(knobs)
        facts = preflight(knobs.retriever_python, flags, SERVER_HOST, port)
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
                                   python=knobs.retriever_python, prefix=prefix, host=SERVER_HOST,
                                   program=[str(REPO / "local_dense_retriever" / "retrieval_server.py")],
                                   die_with_parent=True)  # fmt: skip
            info(f"starting the retrieval server on {SERVER_HOST}:{port} in tmux window 'retriever' (log: "
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
        stop_training(tmux, pane)
        if server is not None:
            if server.process.poll() is None:
                info(f"stopping the retrieval server (pid {server.process.pid})")
            server.stop()
        if tmux.created:
            tmux.run("kill-session", "-t", f"={tmux.session}")
        shutil.rmtree(run_dir, ignore_errors=True)
        if training_log.exists():
            info(f"training log: {training_log}")


if __name__ == "__main__":
    sys.exit(main())
