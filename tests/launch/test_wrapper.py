"""run_qwen2.5_3B_with_retrieval.sh for real: tmux, the retrieval server on the mini-Wikipedia index, and a
stand-in training command that runs real rollouts through the plugin against the server the wrapper started.

Every test uses its own tmux server (TMUX_TMPDIR under tmp_path), so a user's tmux is never touched, and checks
afterwards that the session, the server process and the port are gone.
"""

import contextlib
import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slime_search_r1.launch.tmux_session import SESSION
from support import process_tree
from support.fake_retriever import FakeRetriever
from support.interrupt import interruptible
from support.launch_runs import edited_copy
from support.loopback import free_port, serve_in_thread
from support.retriever_fixtures import small_wiki_fixture  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "run_qwen2.5_3B_with_retrieval.sh"
STANDIN = REPO / "tests" / "support" / "standin_training.py"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture(name="wrapper_env")
def wrapper_env_fixture(tmp_path, small_wiki):
    tmux_dir = tmp_path / "tmux"
    tmux_dir.mkdir()
    env = {
        **os.environ,
        "TMUX_TMPDIR": str(tmux_dir),  # a private tmux server
        "LOG_DIR": str(tmp_path / "logs"),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "RETRIEVER_PYTHON": sys.executable,
        "RETRIEVER_ARGS": shlex.join(
            ["--index_path", str(small_wiki.index_path), "--corpus_path", str(small_wiki.corpus_path),
             "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir), "--num_threads", "1"]
        ),
        "RETRIEVAL_SERVER_URL": f"http://127.0.0.1:{free_port()}",
    }  # fmt: skip
    for name in ("TMUX", "TMUX_PANE", "SEARCH_BACKEND", "START_RETRIEVER", "RETRIEVER_PRESET"):
        env.pop(name, None)  # inside a user's tmux, $TMUX would point tmux at the user's server
    yield env
    subprocess.run(["tmux", "kill-server"], env=env, capture_output=True)  # only if a test left it behind


def run_wrapper(env, timeout=180, script: Path = WRAPPER) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=timeout)


def port_of(env) -> int:
    return int(env["RETRIEVAL_SERVER_URL"].rsplit(":", 1)[1].split("/")[0])


def retriever_pids(port: int) -> list[int]:
    """Processes running retrieval_server.py on this port (the one a wrapper under test started)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if any(a.endswith(b"retrieval_server.py") for a in argv) and str(port).encode() in argv:
            pids.append(int(proc.name))
    return pids


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def tmux_server_running(env) -> bool:
    return subprocess.run(["tmux", "list-sessions"], env=env, capture_output=True).returncode == 0


def exited(pid: int, timeout: float = 60) -> bool:
    """Waits for any process (not only a child) to exit: a pidfd becomes readable when it does."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def assert_all_stopped(env) -> None:
    port = port_of(env)
    # A server sent SIGKILL last may still be on its way out when the wrapper exits; its socket closes with it.
    assert all(exited(pid) for pid in retriever_pids(port))
    assert port_is_free(port)
    assert not tmux_server_running(env)


def logs(env, prefix: str) -> str:
    files = sorted(Path(env["LOG_DIR"]).glob(f"{prefix}_*.log"))
    assert len(files) == 1, files
    return files[0].read_text(errors="replace")


def run_standin_training(env, wiki, tmp_path, questions: int) -> tuple[dict, subprocess.CompletedProcess, dict]:
    """The wrapper with the stand-in training command on the first `questions` questions; checks it succeeded."""
    pairs = [[q.question, q.evidence_title] for q in wiki.questions[:questions]]
    (tmp_path / "questions.json").write_text(json.dumps(pairs))
    report_path = tmp_path / "report.json"
    env = {
        **env,
        "STANDIN_QUESTIONS": str(tmp_path / "questions.json"),
        "STANDIN_REPORT": str(report_path),
        "TRAIN_CMD": f"{sys.executable} {STANDIN}",
    }
    result = run_wrapper(env)
    assert result.returncode == 0, result.stderr + logs(env, "training")
    return env, result, json.loads(report_path.read_text())


def test_rollouts_use_the_retriever_it_started_then_everything_stops(wrapper_env, small_wiki, tmp_path):
    env, result, report = run_standin_training(wrapper_env, small_wiki, tmp_path, questions=6)
    # the plugin read RETRIEVAL_SERVER_URL from the wrapper and every rollout searched the real index
    assert report["retrieval_urls"] == [env["RETRIEVAL_SERVER_URL"] + "/retrieve"]
    assert report["rollouts"] == 12
    assert set(report["statuses"]) == {"completed"}
    assert report["searches"] == [1] * 12
    assert report["search_failures"] == 0
    titles = set(small_wiki.titles)
    assert all(answer and answer[0] in titles for answer in report["answers"])  # real Wikipedia documents
    assert sum(r == 1.0 for r in report["rewards"]) >= 8  # MiniLM puts the evidence page first for most

    # slime's rollout logging called the plugin's log functions, and its own logging still ran after each
    assert [call["backend"] for call in report["logged"]] == ["wandb"] * 4
    train, slime_train, evaluation, slime_eval = (call["metrics"] for call in report["logged"])
    assert train["rollout/step"] == 0
    assert slime_train["rollout/step"] == 0
    assert "rollout/response_len/mean" in slime_train
    metric = "rollout/search_r1/"
    assert train[metric + "searches/mean"] == 1.0
    assert train[metric + "searched_share"] == 1.0
    assert train[metric + "turns/mean"] == 2.0
    assert train[metric + "finish/answer"] == 1.0
    assert train[metric + "failed_share"] == 0.0
    assert train[metric + "invalid_actions/mean"] == 0.0
    assert train[metric + "tools/search/latency/p50"] > 0  # real HTTP searches
    assert train[metric + "tools/search/latency/p99"] >= train[metric + "tools/search/latency/p50"]
    assert train[metric + "observation_tokens/mean"] > 0
    assert train[metric + "em"] == sum(r == 1.0 for r in report["rewards"]) / 12  # the format is always valid
    assert train[metric + "format_valid"] == 1.0
    assert evaluation["eval/step"] == 0
    assert slime_eval["eval/step"] == 0
    assert evaluation["eval/search_r1/standin_eval/em_by_source/mini_wiki"] == slime_eval["eval/standin_eval"]
    assert evaluation["eval/search_r1/standin_eval/searches/mean"] == 1.0

    assert "retrieval server ready" in result.stderr
    assert "rollouts done" in logs(env, "training")
    assert "Uvicorn running" in logs(env, "retrieval_server")
    assert_all_stopped(env)


def test_embedded_preset_serves_the_index_that_embedded_default_prepared(wrapper_env, small_wiki, tmp_path):
    """RETRIEVER_PRESET=embedded: the wrapper takes the server flags from `embedded_default --print_server_flags`.

    Building the real 10k-summary index takes minutes, so only `prepare` is swapped for the small wiki (through a
    RETRIEVER_PYTHON shim); the flag printing, the wrapper's parsing of it and the server it starts are real.
    """
    fake_prepare = (
        "import sys; from pathlib import Path; from local_dense_retriever.demo import embedded_default as e; "
        "e.prepare = lambda *a, **k: e.MiniWikiAssets(corpus_path=Path(sys.argv[1]), index_path=Path(sys.argv[2]), "
        "embeddings_path=Path('unused'), model_dir=Path(sys.argv[3]), titles=set(), build_seconds=None, "
        "pages_path=Path(sys.argv[4])); "
        "sys.exit(e.main(['--print_server_flags']))"
    )
    shim = tmp_path / "retriever_python"
    shim.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$*" == "-m local_dense_retriever.demo --print_server_flags" ]]; then\n'
        f'  exec {sys.executable} -c "{fake_prepare}" '
        f"{small_wiki.corpus_path} {small_wiki.index_path} {small_wiki.model_dir} {small_wiki.pages_path}\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    shim.chmod(0o755)
    preset_env = {
        **wrapper_env,
        "RETRIEVER_PRESET": "embedded",
        "RETRIEVER_PYTHON": str(shim),
        "RETRIEVER_ARGS": "--num_threads 1",  # after the preset's flags
    }
    env, _, report = run_standin_training(preset_env, small_wiki, tmp_path, questions=2)
    assert report["rollouts"] == 4
    assert report["search_failures"] == 0
    assert all(answer and answer[0] in set(small_wiki.titles) for answer in report["answers"])
    server_log = logs(env, "retrieval_server")  # begins with the command the wrapper ran
    assert str(small_wiki.index_path) in server_log
    assert f"--pages_path {small_wiki.pages_path}" in server_log  # the articles by URL, for the access tool
    assert "minilm" in server_log and "--num_threads 1" in server_log
    assert "e5_Flat" not in server_log  # RETRIEVER_ARGS' default is not used with the preset
    assert_all_stopped(env)


def read_when_written(fifo: Path, writer_parent: subprocess.Popen) -> str:
    """What is written to `fifo`, waiting for it as long as it takes; "" if `writer_parent` exits first."""

    def unblock_if_the_parent_exits() -> None:
        writer_parent.wait()
        with contextlib.suppress(OSError):  # ENXIO: nobody reads any more
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    threading.Thread(target=unblock_if_the_parent_exits, daemon=True).start()
    with open(fifo) as reader:  # returns once a writer opened it: an event, not a polling window
        return reader.read()


def tmux_server_pid(env) -> int:
    return int(subprocess.run(["tmux", "display-message", "-p", "#{pid}"], env=env, capture_output=True, text=True,
                              check=True).stdout)  # fmt: skip


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_stops_training_and_the_retriever(wrapper_env, tmp_path, signum):
    started = tmp_path / "training_started"
    os.mkfifo(started)
    training = tmp_path / "long_training.py"
    training.write_text(
        "import sys, time\n"
        "try:\n"
        "    with open(sys.argv[1], 'w') as started:  # the test reads it: from here on Ctrl-C is handled\n"
        "        started.write('started')\n"
        "    time.sleep(300)\n"
        "except KeyboardInterrupt:\n"
        "    print('training interrupted', flush=True)\n"
        "    raise SystemExit(130)\n"
    )
    env = {**wrapper_env, "TRAIN_CMD": f"{sys.executable} {training} {started}"}
    process = subprocess.Popen(interruptible(["bash", str(WRAPPER)]), env=env, stderr=subprocess.PIPE, text=True)
    recorded = []
    try:
        assert read_when_written(started, process) == "started", process.stderr.read()
        assert retriever_pids(port_of(env))
        # what it started: the server (its child), and tmux's server with the two windows and training in them
        recorded = process_tree.tree(process.pid, tmux_server_pid(env))
        assert any(str(training) in p.command for p in recorded)

        process.send_signal(signum)  # Ctrl-C in the wrapper's terminal, kill, the terminal closing
        # The wrapper's own bounds, in wall-clock time: 60 s for training, 10 s after SIGTERM, 15 s for the server;
        # this guard is only against a hang.
        _, err = process.communicate(timeout=60 + 10 + 15 + 60)
        assert process_tree.survivors(recorded) == []
    finally:
        if process.poll() is None:
            process.kill()
        process_tree.kill(recorded)
    assert process.returncode == 128 + signum, err
    assert "training interrupted" in logs(env, "training")  # it was asked to stop (Ctrl-C in its window), not killed
    assert_all_stopped(env)


def blocking_step(fifo: Path) -> str:
    """A shell line that says it started on `fifo`, then runs until stopped (a step that takes minutes)."""
    return f"echo started > {fifo}; exec sleep 300"


def assert_a_signal_stops_what_the_checks_started(env, fifo: Path, signum: int) -> None:
    process = subprocess.Popen(interruptible(["bash", str(WRAPPER)]), env=env, stderr=subprocess.PIPE, text=True)
    recorded = []
    try:
        assert read_when_written(fifo, process) == "started\n", process.stderr.read()
        recorded = process_tree.tree(process.pid)
        assert len(recorded) >= 2, recorded  # the wrapper and the step it waits for
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)  # only against a hang
        assert process_tree.survivors(recorded) == []
        assert process.returncode == 128 + signum, err
    finally:
        if process.poll() is None:
            process.kill()
        process_tree.kill(recorded)
    assert not tmux_server_running(env)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_the_embedded_index_is_prepared_stops_the_preparation(wrapper_env, tmp_path, signum):
    """RETRIEVER_PRESET=embedded prepares the index first (minutes, the first time): a signal then stops it too."""
    preparing = tmp_path / "preparing"
    os.mkfifo(preparing)
    shim = tmp_path / "retriever_python"
    shim.write_text(
        "#!/usr/bin/env bash\n"
        f'if [[ "$*" == "-m local_dense_retriever.demo --print_server_flags" ]]; then {blocking_step(preparing)}; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    shim.chmod(0o755)
    env = {**wrapper_env, "RETRIEVER_PRESET": "embedded", "RETRIEVER_PYTHON": str(shim), "TRAIN_CMD": "exit 0"}
    assert_a_signal_stops_what_the_checks_started(env, preparing, signum)


def test_a_signal_while_the_launch_is_asked_what_training_holds_stops_that_launch(wrapper_env, tmp_path):
    """A server on GPUs: the wrapper asks TRAIN_CMD's launch what training holds (its own session, up to 120 s)."""
    asked = tmp_path / "asked"
    os.mkfifo(asked)
    launch = tmp_path / "launch.sh"
    launch.write_text(blocking_step(asked) + "\n")
    env = {
        **wrapper_env,
        "RETRIEVER_ARGS": wrapper_env["RETRIEVER_ARGS"] + " --torch_search 0",  # a layout on GPU 0
        "TRAIN_CMD": f"bash {launch} -m slime_search_r1.launch",  # what a command that runs the launch looks like
    }
    assert_a_signal_stops_what_the_checks_started(env, asked, signal.SIGTERM)


@pytest.mark.parametrize("how", ["non-local URL", "START_RETRIEVER=0"])
def test_a_given_server_is_used_as_it_is_and_the_exit_code_propagates(wrapper_env, how):
    retriever = FakeRetriever()
    host = "127.0.0.2" if how == "non-local URL" else "127.0.0.1"  # any 127/8 address reaches loopback
    with serve_in_thread(retriever.app, host=host) as url:
        env = {
            **wrapper_env,
            "RETRIEVAL_SERVER_URL": url,
            "TRAIN_CMD": 'curl -sf -H "Content-Type: application/json" -d \'{"queries": ["Paris"]}\' '
            '"$RETRIEVAL_SERVER_URL/retrieve" && exit 7',
        }
        if how == "START_RETRIEVER=0":
            env["START_RETRIEVER"] = "0"
        result = run_wrapper(env)
        assert result.returncode == 7, result.stderr
        assert "none is started here" in result.stderr
        assert retriever.queries == ["Paris"]  # training reached the given server
        assert retriever_pids(port_of(env)) == []
        assert not tmux_server_running(env)
        server_thread = f"uvicorn-{url.rsplit(':', 1)[1]}"
        still_serving = any(t.name == server_thread and t.is_alive() for t in threading.enumerate())
        assert retriever.requests == 1
        assert still_serving  # left running, untouched


def test_the_retrieval_url_in_the_edited_dict_decides_what_starts(wrapper_env, tmp_path):
    """The wrapper reads RETRIEVAL_SERVER_URL as training does: the dict in generate_with_search.py, then the
    environment; a non-local URL there is used as it is."""
    retriever = FakeRetriever()
    with serve_in_thread(retriever.app, host="127.0.0.2") as url:
        folder = edited_copy(tmp_path / "search-r1", f'        "local": {{"search_url": "{url}"}},\n')
        env = {k: v for k, v in wrapper_env.items() if k != "RETRIEVAL_SERVER_URL"}
        result = run_wrapper({**env, "TRAIN_CMD": "exit 7"}, script=folder / WRAPPER.name)
        assert result.returncode == 7, result.stderr
        assert f"using the retrieval server(s) at {url}; none is started here" in result.stderr
        assert not tmux_server_running(env)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"RETRIEVER_ARGS": "--index_path /nonexistent/e5_Flat.index"}, "index not found: /nonexistent/e5_Flat.index"),
        (
            {"RETRIEVER_ARGS": "--corpus_path /nonexistent/wiki-18.jsonl"},
            "corpus not found: /nonexistent/wiki-18.jsonl",
        ),
        ({"RETRIEVER_PYTHON": "/nonexistent/python"}, "the retriever's Python '/nonexistent/python' not found"),
        (
            {"RETRIEVAL_SERVER_URL": "127.0.0.1:8000"},
            "RETRIEVAL_SERVER_URL='127.0.0.1:8000' is invalid; accepted: http://host:port[/retrieve]",
        ),
        ({"SEARCH_BACKEND": "google"}, "SEARCH_BACKEND=google needs no retrieval server"),
        (
            {"RETRIEVER_ARGS": "--index_path 'unclosed"},
            """RETRIEVER_ARGS="--index_path 'unclosed" is invalid; accepted: flags as a shell splits them""",
        ),
        ({"RETRIEVER_CPUS": "0-x"}, "RETRIEVER_CPUS='0-x' is invalid; accepted: a CPU list for taskset -c"),
        ({"RETRIEVER_CPUS": "4095"}, "RETRIEVER_CPUS=4095 names no CPU this script may use"),
        ({"RETRIEVER_PRESET": "tiny"}, "RETRIEVER_PRESET='tiny' is invalid; accepted: none | embedded"),
    ],
)
def test_bad_settings_fail_before_anything_starts(wrapper_env, override, message):
    if "RETRIEVER_ARGS" in override and "'" not in override["RETRIEVER_ARGS"]:  # flags given last win
        override = {"RETRIEVER_ARGS": wrapper_env["RETRIEVER_ARGS"] + " " + override["RETRIEVER_ARGS"]}
    result = run_wrapper({**wrapper_env, **override, "TRAIN_CMD": "exit 0"}, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("run_qwen2.5_3B_with_retrieval.sh: error: ")
    assert message in result.stderr and result.stderr.count("\n") == 1  # one line
    assert not tmux_server_running(wrapper_env)
    assert not Path(wrapper_env["LOG_DIR"]).exists()


def bare_python(folder: Path) -> Path:
    """A `python3` without the project's packages (site-packages off): what a fresh machine's PATH gives."""
    folder.mkdir()
    (folder / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    (folder / "python3").chmod(0o755)
    return folder / "python3"


def test_in_a_fresh_clone_the_checks_use_the_projects_environment(wrapper_env, tmp_path):
    """RETRIEVER_PYTHON unset: the project's .venv (what `make install` made) runs the server, not the PATH's
    python3; a missing index is then the only problem named, with the corpus, in one run."""
    clone = edited_copy(tmp_path / "clone", "")
    (clone / ".venv").symlink_to(Path(sys.prefix))
    bare = bare_python(tmp_path / "bin")
    env = {k: v for k, v in wrapper_env.items() if k != "RETRIEVER_PYTHON"}
    env.update(
        PATH=f"{bare.parent}{os.pathsep}{env['PATH']}",
        PYTHON_BIN=sys.executable,
        TRAIN_CMD="exit 0",
        RETRIEVER_ARGS="--index_path /nonexistent/e5_Flat.index --corpus_path /nonexistent/wiki-18.jsonl",
    )
    result = run_wrapper(env, timeout=60, script=clone / WRAPPER.name)
    assert result.returncode == 1
    assert "lacks" not in result.stderr, result.stderr
    assert "error: the retrieval server cannot start (2 problems):" in result.stderr
    assert "\n  - corpus not found: /nonexistent/wiki-18.jsonl" in result.stderr
    assert "\n  - index not found: /nonexistent/e5_Flat.index" in result.stderr
    assert not tmux_server_running(env)


def test_every_missing_package_and_file_is_named_at_once(wrapper_env, tmp_path):
    bare = bare_python(tmp_path / "bin")
    env = {
        **wrapper_env,
        "RETRIEVER_PYTHON": str(bare),
        "TRAIN_CMD": "exit 0",
        "RETRIEVER_ARGS": "--index_path /nonexistent/e5_Flat.index --corpus_path /nonexistent/wiki-18.jsonl "
        "--retriever_model /nonexistent/e5-base-v2 --pages_path /nonexistent/pages.jsonl",
    }
    result = run_wrapper(env, timeout=60)
    assert result.returncode == 1
    assert "error: the retrieval server cannot start (5 problems):" in result.stderr
    lines = result.stderr.splitlines()[1:]
    assert lines[0].startswith(f"  - the retriever's Python '{bare}' lacks: torch transformers faiss")
    assert lines[1:] == [
        "  - corpus not found: /nonexistent/wiki-18.jsonl (--corpus_path; see local_dense_retriever/README.md)",
        "  - index not found: /nonexistent/e5_Flat.index (--index_path; see local_dense_retriever/README.md)",
        "  - pages not found: /nonexistent/pages.jsonl (--pages_path; see local_dense_retriever/README.md)",
        "  - encoder not found: /nonexistent/e5-base-v2 (--retriever_model: a model directory or a Hugging Face id)",
    ]
    assert not tmux_server_running(env)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning to one CPU must differ from the default")
def test_retriever_cpus_pins_the_server_and_its_num_threads_sets_its_threads(wrapper_env, tmp_path):
    health = tmp_path / "health.json"
    env = {
        **wrapper_env,
        "RETRIEVER_ARGS": wrapper_env["RETRIEVER_ARGS"] + " --num_threads 3",
        "RETRIEVER_CPUS": str(min(os.sched_getaffinity(0))),
        "TRAIN_CMD": f'curl -sf "$RETRIEVAL_SERVER_URL/health" -o {health}',
    }
    result = run_wrapper(env)
    assert result.returncode == 0, result.stderr
    threads = json.loads(health.read_text())["cpu_threads"]
    assert threads["affinity_cpus"] == 1  # taskset -c RETRIEVER_CPUS
    assert threads["torch_threads"] == 3 and threads["faiss_threads"] == 3  # the last --num_threads of RETRIEVER_ARGS
    assert_all_stopped(env)


def test_port_in_use_is_reported(wrapper_env):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {**wrapper_env, "RETRIEVAL_SERVER_URL": f"http://127.0.0.1:{port}", "TRAIN_CMD": "exit 0"}
        result = run_wrapper(env, timeout=60)
        assert result.returncode == 1
        assert f"port {port} on 127.0.0.1 is in use" in result.stderr
        assert not tmux_server_running(env)


def test_existing_session_is_left_alone(wrapper_env):
    session = SESSION
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "sleep 120"], env=wrapper_env, check=True)
    result = run_wrapper({**wrapper_env, "TRAIN_CMD": "exit 0"}, timeout=60)
    assert result.returncode == 1
    assert f"tmux session '{session}' already exists" in result.stderr
    assert subprocess.run(["tmux", "has-session", "-t", session], env=wrapper_env).returncode == 0


def test_server_never_healthy_fails_with_its_log_and_is_stopped(wrapper_env):
    # The real server needs several seconds to load its encoder; one second is never enough.
    env = {**wrapper_env, "RETRIEVER_STARTUP_TIMEOUT": "1", "TRAIN_CMD": "touch training-ran"}
    result = run_wrapper(env)
    assert result.returncode == 1
    assert "was not healthy after 1 s" in result.stderr
    assert "RETRIEVER_STARTUP_TIMEOUT" in result.stderr
    assert "---- last lines of" in result.stderr
    assert "starting:" in result.stderr  # the log's tail
    assert not list(Path(env["LOG_DIR"]).glob("training_*.log"))  # training never started
    assert_all_stopped(env)


def test_server_that_dies_at_startup_is_reported_with_its_log(wrapper_env, tmp_path):
    broken = tmp_path / "broken.index"
    broken.write_bytes(b"this is not a FAISS index")
    args = wrapper_env["RETRIEVER_ARGS"] + f" --index_path {broken}"
    env = {**wrapper_env, "RETRIEVER_ARGS": args, "TRAIN_CMD": "exit 0"}
    result = run_wrapper(env)
    assert result.returncode == 1
    assert "the retrieval server exited during startup" in result.stderr
    assert "not recognized" in result.stderr  # FAISS's own error, from the log tail
    assert_all_stopped(env)


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "no-pidfd"])
def test_the_wrapper_sees_which_process_exits_first(monkeypatch, pidfds):
    """What the wrapper waits on (training's pane, the server): pidfds, or /proc on a kernel without them."""
    from slime_search_r1.launch.tmux_session import first_to_exit

    if not pidfds:
        monkeypatch.setattr(
            os, "pidfd_open", lambda pid: (_ for _ in ()).throw(OSError(38, "Function not implemented"))
        )
    waiting = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
               for _ in range(2)]  # fmt: skip
    try:
        assert first_to_exit([p.pid for p in waiting], timeout=0) is None
        waiting[1].stdin.close()  # the second one exits (and stays a zombie until reaped)
        assert first_to_exit([p.pid for p in waiting]) == waiting[1].pid
    finally:
        for process in waiting:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("retriever_args", "faiss_gpu", "added"),
    [
        ("--index_path i --corpus_path c", "auto", True),
        ("--index_path i --corpus_path c --torch_search all", "auto", False),  # the layout for training GPUs
        ("--index_path i --corpus_path c --backend bm25", "auto", False),
        ("--index_path i --corpus_path c --backend faiss", "auto", True),
        ("--index_path i --corpus_path c --faiss_gpu", "1", False),  # already there: not twice
        ("--index_path i --corpus_path c", "0", False),
    ],
)
def test_auto_faiss_gpu_never_contradicts_the_servers_own_flags(
    tmp_path, monkeypatch, retriever_args, faiss_gpu, added
):
    """On a node whose nvidia-smi lists a GPU, RETRIEVER_FAISS_GPU=auto adds --faiss_gpu unless RETRIEVER_ARGS already
    says where the search runs: the server refuses --faiss_gpu beside --torch_search or another backend."""
    from slime_search_r1.launch.retriever_server import server_flags
    from slime_search_r1.settings.sources import read_environment
    from slime_search_r1.settings.table import WRAPPER, read_by

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    environ = {"RETRIEVER_ARGS": retriever_args, "RETRIEVER_FAISS_GPU": faiss_gpu}
    knobs, _ = read_environment(read_by(WRAPPER), environ)
    flags = server_flags(knobs)
    assert flags[: len(shlex.split(retriever_args))] == shlex.split(retriever_args)
    assert flags.count("--faiss_gpu") == (1 if added or "--faiss_gpu" in retriever_args else 0)
